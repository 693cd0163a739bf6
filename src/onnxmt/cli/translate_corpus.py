"""`onnxmt translate-corpus`: a corpus on Ray Data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..manifest import ModelDirError
from ..runtime.options import BatchLimits, DecodeOptions, RuntimeOptions
from ..scale.corpus import CorpusJob
from .common import ModelOption, SourceLangOption, TargetLangOption, err, fail
from .flags import flags, with_options

THREADS_HELP = "ONNX Runtime threads per worker (default: the cluster's CPUs / workers)."


@with_options(
    job=flags(CorpusJob, "field", "output_field", "workers", "block_rows", "work_dir", "unit", partial=True),
    decoding=flags(DecodeOptions, "beams", "max_new_tokens"),
    batching=flags(BatchLimits, "batch_size"),
    runtime=flags(RuntimeOptions, "threads", helps={"threads": THREADS_HELP}),
)
def translate_corpus(
    input_file: Annotated[Path, typer.Argument(help="Text (one sentence per line), JSONL or Parquet.")],
    output_file: Annotated[Path, typer.Argument(help="Where the translations go, in the input's format.")],
    model: ModelOption = None,
    address: Annotated[
        str | None, typer.Option(help='A Ray cluster to run on ("auto", "ray://head:10001"; default: a local one).')
    ] = None,
    source_lang: SourceLangOption = None,
    target_lang: TargetLangOption = None,
    *,
    job: dict[str, Any],
    decoding: DecodeOptions,
    batching: BatchLimits,
    runtime: RuntimeOptions,
) -> None:
    """Translate a corpus on Ray Data, across the cores of this machine or a Ray cluster; run it again to resume.

    Input order and every JSONL field / Parquet column are kept. Needs the ray extra: pip install 'onnxmt[ray]'.
    """
    from rich.progress import Progress

    from ..models import resolve_model_dir
    from ..scale.corpus import translate_corpus as run

    try:
        directory = resolve_model_dir(model, progress=lambda msg: err.print(msg))
        corpus = CorpusJob(
            input_file,
            output_file,
            directory,
            decoding,
            batching,
            runtime=runtime,
            source_lang=source_lang,
            target_lang=target_lang,
            **job,
        )
        with Progress(console=err, transient=True) as bar:
            task = bar.add_task("translating", total=None)

            def show(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            result = run(corpus, address=address, progress=show)
    except (ModelDirError, ValueError, ImportError, OSError) as e:
        fail(str(e))
    resumed = f", {result.blocks_done_before} of them done by an earlier run" if result.blocks_done_before else ""
    err.print(
        f"{result.rows} rows in {result.blocks} blocks{resumed}; {corpus.workers} worker(s) x "
        f"{result.threads_per_worker} thread(s); {result.seconds} s; wrote {output_file} (work files: "
        f"{result.work_dir})"
    )
