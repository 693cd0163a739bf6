"""Corpus translation on Ray Data: `map_batches` over an actor pool, one `Translator` per actor.

The input (text, JSONL or Parquet) is first cut into numbered blocks of `block_rows` rows, staged as Parquet files
with a row id, in a work directory beside the output. Ray Data reads the blocks not yet translated, translates them
on the actor pool, and the driver writes each block's translations to its own part file as soon as the block is
complete. A run that is interrupted resumes from the part files: finished blocks are never translated again. At the
end the parts are joined, in input order, into the output, in the input's format.

Ray retries the work of an actor that dies (its tasks are resubmitted to a restarted actor), so a killed worker
costs time, not rows.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..architectures import TEXT_UNITS
from ..documents.translate import translate_lines
from ..extras import missing_extra
from ..options import check, option
from ..runtime.options import BatchLimits, DecodeOptions, RuntimeOptions

if TYPE_CHECKING:
    import pyarrow as pa
    import ray.data

FORMATS = {".txt": "text", ".jsonl": "jsonl", ".parquet": "parquet"}
ID = "__onnxmt_id"  # the staged row id; never written to the output
RECORD = "__onnxmt_record"  # JSONL: the input line
STAGE_VERSION = 1
WINDOW_BLOCKS = 64  # staged blocks held in Ray's object store at a time


def _import_ray() -> Any:
    try:
        import pyarrow  # noqa: F401  (reads and writes the corpus)
        import ray
        import ray.data
    except ImportError as e:
        raise missing_extra("corpus translation", "ray", e) from e
    return ray


@dataclass(frozen=True)
class CorpusJob:
    """What `translate_corpus` does. field: in a text file, each line. runtime: threads is per actor (None: the
    cluster's CPUs divided by the workers, at least 1). source_lang, target_lang: the language pair, as
    `Translator.translate` takes it."""

    input: Path
    output: Path
    model_dir: Path
    decoding: DecodeOptions = DecodeOptions()
    batching: BatchLimits = BatchLimits()
    field: str = option("text", help="JSONL field or Parquet column to translate.")
    output_field: str = option("translation", help="JSONL field or Parquet column for the translation.")
    workers: int = option(1, help="Ray actors, each with one Translator.", min=1)
    runtime: RuntimeOptions = RuntimeOptions()
    block_rows: int = option(1000, help="Rows per block: the unit of progress and of resuming.", min=1)
    work_dir: Path | None = option(
        None, help="Blocks and finished parts (default: OUTPUT.onnxmt-work beside the output)."
    )
    source_lang: str | None = None
    target_lang: str | None = None
    unit: str | None = option(
        None,
        help="Give the model sentences or paragraphs (lines) at a time (default: the model's family's).",
        choices=TEXT_UNITS,
    )

    def __post_init__(self) -> None:
        for path, role in ((self.input, "input"), (self.output, "output")):
            if path.suffix.lower() not in FORMATS:
                raise ValueError(f"{role} {path} has no known format; name it *.txt, *.jsonl or *.parquet")
        if FORMATS[self.input.suffix.lower()] != FORMATS[self.output.suffix.lower()]:
            raise ValueError(f"output {self.output} must have the input's format ({self.input.suffix})")
        check(self)

    @property
    def format(self) -> str:
        return FORMATS[self.input.suffix.lower()]

    @property
    def work(self) -> Path:
        return self.work_dir or self.output.with_name(self.output.name + ".onnxmt-work")


@dataclass
class CorpusResult:
    rows: int
    blocks: int
    blocks_done_before: int  # finished by an earlier, interrupted run
    output: Path
    work_dir: Path
    threads_per_worker: int
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# Staging: the input as numbered Parquet blocks with row ids.


def _input_batches(job: CorpusJob) -> Iterator[pa.Table]:
    """The input as Arrow tables of at most `block_rows` rows; the text to translate in column `job.field`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if job.format == "parquet":
        parquet = pq.ParquetFile(job.input)
        if job.field not in parquet.schema_arrow.names:
            raise ValueError(f"{job.input} has no column {job.field!r}; columns: {parquet.schema_arrow.names}")
        for batch in parquet.iter_batches(batch_size=job.block_rows):
            yield pa.Table.from_batches([batch])
        return
    with open(job.input, encoding="utf-8") as lines:
        texts: list[str] = []
        records: list[str] = []  # JSONL: the whole line, so that the output keeps every field
        for number, line in enumerate(lines, 1):
            line = line.rstrip("\n")
            if job.format == "jsonl":
                texts.append(_jsonl_text(line, job.field, number, job.input))
                records.append(line)
            else:
                texts.append(line)
            if len(texts) == job.block_rows:
                yield _staged_table(texts, records, job)
                texts, records = [], []
        if texts:
            yield _staged_table(texts, records, job)


def _jsonl_text(line: str, field_name: str, number: int, path: Path) -> str:
    """The text of a JSONL line's field."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{number}: not a JSON object ({e.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get(field_name), str):
        raise ValueError(f"{path}:{number}: expected an object with a string field {field_name!r}")
    return str(record[field_name])


def _staged_table(texts: list[str], records: list[str], job: CorpusJob) -> pa.Table:
    import pyarrow as pa

    columns: dict[str, list[str]] = {job.field: texts}
    if job.format == "jsonl":
        columns[RECORD] = records
    return pa.table(columns)


def stage(job: CorpusJob) -> list[int]:
    """Cut the input into blocks under WORK/input (once: a finished staging is reused); their row counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    work = job.work
    marker = work / "staged.json"
    source = {"input": str(job.input.resolve()), "size": job.input.stat().st_size, "mtime": job.input.stat().st_mtime}
    key = {"version": STAGE_VERSION, "source": source, "field": job.field, "block_rows": job.block_rows}
    if marker.is_file():
        staged = json.loads(marker.read_text())
        if staged["key"] == key:
            return list(staged["rows"])
        raise ValueError(
            f"{work} holds a run for another input or settings ({staged['key']}); delete it, or give --work-dir"
        )
    shutil.rmtree(work / "input", ignore_errors=True)
    (work / "input").mkdir(parents=True, exist_ok=True)
    counts: list[int] = []
    start = 0
    for block, table in enumerate(_input_batches(job)):
        ids = pa.array(range(start, start + table.num_rows), pa.int64())
        pq.write_table(table.append_column(ID, ids), work / "input" / f"block-{block:06d}.parquet")
        counts.append(table.num_rows)
        start += table.num_rows
    marker.write_text(json.dumps({"key": key, "rows": counts}, indent=1))
    return counts


# ---------------------------------------------------------------------------------------------------------------
# Translation on the actor pool.


class TranslateBatch:
    """The callable class `map_batches` runs on each actor: one Translator, loaded once per actor."""

    def __init__(
        self,
        model_dir: str,
        runtime: dict[str, Any],
        decoding: dict[str, Any],
        batching: dict[str, Any],
        languages: dict[str, Any],
        column: str,
        output_column: str,
    ) -> None:
        from ..runtime.translator import Translator

        self.translator = Translator(
            model_dir, RuntimeOptions(**runtime), DecodeOptions(**decoding), BatchLimits(**batching)
        )
        self.languages = languages
        self.column, self.output_column = column, output_column

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        texts = [str(t) if t is not None else "" for t in batch[self.column]]
        # Plain text's one rule (documents/translate.py), as `onnxmt translate` and the service apply it.
        translations = list(translate_lines(self.translator, texts, **self.languages))
        return {**batch, self.output_column: np.array(translations, dtype=object)}


def translate_dataset(
    dataset: ray.data.Dataset,
    model_dir: str | Path,
    *,
    column: str = "text",
    output_column: str = "translation",
    workers: int = 1,
    runtime: RuntimeOptions = RuntimeOptions(),
    decoding: DecodeOptions = DecodeOptions(),
    batching: BatchLimits = BatchLimits(),
    source_lang: str | None = None,
    target_lang: str | None = None,
    unit: str | None = None,
    rows_per_call: int | None = None,
) -> ray.data.Dataset:
    """`dataset` with `output_column` added: the translation of `column` (from `source_lang` into `target_lang`,
    None: the model's defaults; `unit`: sentence or paragraph, None: the model's family's), by `workers` actors
    holding one Translator each (`runtime.threads` ONNX Runtime threads and as many Ray CPUs per actor; None: the
    cluster's CPUs divided by the workers). Lazy, as Ray Data is: nothing runs until the dataset is consumed."""
    ray = _import_ray()
    threads = runtime.threads or threads_per_worker(workers, ray.cluster_resources().get("CPU", os.cpu_count() or 1))
    return dataset.map_batches(
        TranslateBatch,
        fn_constructor_kwargs={
            "model_dir": str(Path(model_dir).resolve()),
            "runtime": asdict(replace(runtime, threads=threads)),
            "decoding": asdict(decoding),
            "batching": asdict(batching),
            "languages": {"source_lang": source_lang, "target_lang": target_lang, "unit": unit},
            "column": column,
            "output_column": output_column,
        },
        batch_size=rows_per_call or batching.batch_size * 8,  # whole sorted decoder batches per call
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=threads,
    )


def threads_per_worker(workers: int, cpus: float) -> int:
    """Threads per actor so that workers x threads <= the cluster's CPUs (at least 1)."""
    return max(1, int(cpus) // workers)


def translate_corpus(
    job: CorpusJob,
    *,
    address: str | None = None,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> CorpusResult:
    """Translate `job.input` into `job.output` on a Ray cluster (`address`: an existing one, e.g. "auto" or
    "ray://head:10001"; None starts a local one on this machine's cores). Resumes an interrupted run of the same
    job. `progress(rows_done, rows_total)` is called as blocks finish."""
    import time

    from ..runtime.modeldir import load_manifest

    load_manifest(job.model_dir, verify=False)  # a bad model directory fails here, before Ray starts
    ray = _import_ray()  # and a missing extra, before any work
    started = time.monotonic()
    counts = stage(job)
    parts = job.work / "parts"
    parts.mkdir(exist_ok=True)
    done = {b for b in range(len(counts)) if (parts / f"block-{b:06d}.parquet").is_file()}
    pending = [b for b in range(len(counts)) if b not in done]
    total = sum(counts)
    rows_done = sum(counts[b] for b in done)
    progress(rows_done, total)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        threads = job.runtime.threads or threads_per_worker(job.workers, ray.cluster_resources().get("CPU", 1))
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the caller shows progress by block

        def finished(block: int) -> None:
            nonlocal rows_done
            rows_done += counts[block]
            progress(rows_done, total)

        _translate_blocks(job, ray, replace(job.runtime, threads=threads), pending, counts, finished)
        _assemble(job, len(counts))
    finally:
        if started_here:
            ray.shutdown()
    return CorpusResult(
        rows=total,
        blocks=len(counts),
        blocks_done_before=len(done),
        output=job.output,
        work_dir=job.work,
        threads_per_worker=threads,
        seconds=round(time.monotonic() - started, 2),
    )


def _translate_blocks(
    job: CorpusJob,
    ray: Any,
    runtime: RuntimeOptions,
    pending: list[int],
    counts: list[int],
    finished: Callable[[int], None],
) -> None:
    """The staged blocks `pending` translated into part files; `finished(block)` as each is written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    starts = np.cumsum([0, *counts[:-1]])
    parts = job.work / "parts"
    # The staged blocks go to the actors straight from the driver (`from_arrow`), a window at a time: read tasks
    # would need CPUs the actors hold (workers x threads = all of them) and the pool would starve.
    for window in range(0, len(pending), WINDOW_BLOCKS):
        blocks = pending[window : window + WINDOW_BLOCKS]
        tables = [pq.read_table(job.work / "input" / f"block-{b:06d}.parquet") for b in blocks]
        translated = translate_dataset(
            ray.data.from_arrow(tables),
            job.model_dir,
            column=job.field,
            output_column=job.output_field,
            workers=job.workers,
            runtime=runtime,
            decoding=job.decoding,
            batching=job.batching,
            source_lang=job.source_lang,
            target_lang=job.target_lang,
            unit=job.unit,
        )
        buffers: dict[int, list[pa.Table]] = {}
        for batch in translated.iter_batches(batch_size=None, batch_format="pyarrow"):
            assert isinstance(batch, pa.Table)
            # Parquet row groups can make blocks shorter than block_rows: blocks are found by their first ids.
            owner = np.searchsorted(starts, batch.column(ID).to_numpy(), side="right") - 1
            for block in np.unique(owner).tolist():
                buffers.setdefault(block, []).append(batch.filter(pa.array(owner == block)))
                if sum(t.num_rows for t in buffers[block]) == counts[block]:
                    _write_part(pa.concat_tables(buffers.pop(block)), parts / f"block-{block:06d}.parquet")
                    finished(block)
        if buffers:
            raise RuntimeError(f"blocks {sorted(buffers)} came back incomplete; run the command again to resume")


def _write_part(table: pa.Table, path: Path) -> None:
    """Atomically: a part file that exists is complete."""
    import pyarrow.parquet as pq

    temporary = path.with_suffix(".tmp")
    pq.write_table(table.sort_by(ID), temporary)
    os.replace(temporary, path)


def _assemble(job: CorpusJob, blocks: int) -> None:
    """Join the parts, in input order, into the output in the input's format (written beside it, then renamed)."""
    import pyarrow.parquet as pq

    temporary = job.output.with_name(job.output.name + ".tmp")
    job.output.parent.mkdir(parents=True, exist_ok=True)
    if job.format == "parquet":
        writer = None
        for block in range(blocks):
            table = pq.read_table(job.work / "parts" / f"block-{block:06d}.parquet").drop_columns([ID])
            writer = writer or pq.ParquetWriter(temporary, table.schema)
            writer.write_table(table)
        if writer is not None:
            writer.close()
        else:
            shutil.copyfile(job.input, temporary)
    else:
        with open(temporary, "w", encoding="utf-8") as out:
            for block in range(blocks):
                table = pq.read_table(job.work / "parts" / f"block-{block:06d}.parquet")
                translations = table.column(job.output_field).to_pylist()
                if job.format == "text":
                    out.writelines(t.replace("\n", " ") + "\n" for t in translations)
                    continue
                for record, translation in zip(table.column(RECORD).to_pylist(), translations, strict=True):
                    out.write(json.dumps({**json.loads(record), job.output_field: translation}, ensure_ascii=False))
                    out.write("\n")
    os.replace(temporary, job.output)
