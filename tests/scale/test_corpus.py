"""`onnxmt translate-corpus` on a local Ray cluster (2 CPUs): output identical to `onnxmt translate`, every format's
fields and order kept, an interrupted run resumed without redoing finished blocks, a killed worker retried."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.skips import importorskip, shared_data

ray = importorskip("ray")
pq = importorskip("pyarrow.parquet")
pa = importorskip("pyarrow")
psutil = importorskip("psutil")

from onnxmt.documents.translate import translate_lines  # noqa: E402
from onnxmt.runtime.options import DecodeOptions  # noqa: E402
from onnxmt.runtime.translator import Translator  # noqa: E402
from onnxmt.scale.corpus import CorpusJob, translate_corpus  # noqa: E402


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def lines() -> list[str]:
    # Real sentences of many lengths, and an empty line, which comes back empty.
    text = shared_data("tatoeba/test-v2021-08-07.eng").read_text(encoding="utf-8").splitlines()[:800]
    return [*text[:300], "", *text[300:]]


@pytest.fixture(scope="module")
def expected(tiny_onnx_dir: Path, lines: list[str]) -> list[str]:
    """What `onnxmt translate` writes: plain text's rule (translate_lines) with the CLI's defaults."""
    return list(translate_lines(Translator(tiny_onnx_dir), lines))


@pytest.mark.timeout(600)
def test_text_corpus_is_identical_to_translate(
    cluster: None, tiny_onnx_dir: Path, lines: list[str], expected: list[str], tmp_path: Path
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = translate_corpus(CorpusJob(source, tmp_path / "out.txt", tiny_onnx_dir, workers=2, block_rows=150))
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == expected
    assert (result.rows, result.blocks, result.blocks_done_before, result.threads_per_worker) == (801, 6, 0, 1)
    assert expected[300] == "" and len(set(expected)) > 200  # not one repeated output


@pytest.mark.timeout(600)
def test_jsonl_and_parquet_keep_fields_and_order(
    cluster: None, tiny_onnx_dir: Path, lines: list[str], expected: list[str], tmp_path: Path
) -> None:
    # 200 lines, the empty one (line 300) among them: two blocks of the jsonl, three row groups of the parquet.
    texts, translations = lines[200:400], expected[200:400]
    records = [{"id": f"s{i}", "src": text, "meta": {"n": i}} for i, text in enumerate(texts)]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    translate_corpus(CorpusJob(source, tmp_path / "out.jsonl", tiny_onnx_dir, field="src", block_rows=150))
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert out == [{**r, "translation": t} for r, t in zip(records, translations, strict=True)]

    table = pa.table({"id": list(range(200)), "text": texts, "score": [i / 10 for i in range(200)]})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=97)  # blocks cut short by row groups
    translate_corpus(
        CorpusJob(tmp_path / "in.parquet", tmp_path / "out.parquet", tiny_onnx_dir, workers=2, block_rows=150)
    )
    written = pq.read_table(tmp_path / "out.parquet")
    assert written.column_names == ["id", "text", "score", "translation"]
    assert written.column("id").to_pylist() == list(range(200))
    assert written.column("translation").to_pylist() == translations
    assert "" in texts and translations[texts.index("")] == ""


@pytest.mark.timeout(600)
def test_interrupted_run_resumes_without_redoing_finished_blocks(
    cluster: None, tiny_onnx_dir: Path, lines: list[str], expected: list[str], tmp_path: Path
) -> None:
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    job = CorpusJob(source, output, tiny_onnx_dir, block_rows=100)

    def interrupt(done: int, total: int) -> None:
        if done >= 300:
            raise KeyboardInterrupt  # what Ctrl+C does in the middle of a run

    with pytest.raises(KeyboardInterrupt):
        translate_corpus(job, progress=interrupt)
    parts = sorted((job.work / "parts").glob("block-*.parquet"))
    assert 3 <= len(parts) < 9 and not output.exists()
    written = {p.name: p.stat().st_mtime_ns for p in parts}
    result = translate_corpus(job)
    assert result.blocks_done_before == len(parts)
    assert {p.name: p.stat().st_mtime_ns for p in parts} == written  # finished blocks were not translated again
    assert output.read_text(encoding="utf-8").splitlines() == expected


@pytest.mark.timeout(600)
def test_killed_worker_is_retried_and_output_is_complete(
    cluster: None, tiny_onnx_dir: Path, lines: list[str], expected: list[str], tmp_path: Path
) -> None:
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    killed: list[int] = []

    def kill_a_worker() -> None:
        # Ray names an actor's process after its class: kill one of the pool while it translates.
        deadline = time.monotonic() + 300
        while not killed and time.monotonic() < deadline:
            for process in psutil.process_iter(["pid", "cmdline"]):
                if "TranslateBatch" in " ".join(process.info["cmdline"] or []) and process.cpu_times().user > 2:
                    os.kill(process.info["pid"], signal.SIGKILL)
                    killed.append(process.info["pid"])
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_a_worker, daemon=True)
    killer.start()
    result = translate_corpus(CorpusJob(source, output, tiny_onnx_dir, workers=2, block_rows=100))
    killer.join(timeout=5)
    assert killed, "no worker was found to kill"
    assert result.rows == len(lines)
    assert output.read_text(encoding="utf-8").splitlines() == expected


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", ["tiny_mbart50_onnx_dir", "tiny_tc_big_onnx_dir"])
def test_other_families_corpus_is_identical_to_translate(
    cluster: None, model: str, lines: list[str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """mBART-50 with ISO codes for its fairseq ones, and tc-big (single target): as `onnxmt translate` writes."""
    directory = request.getfixturevalue(model)
    languages = {"source_lang": "en", "target_lang": "zh"} if "mbart" in model else {}
    texts = lines[:120]
    decoding = DecodeOptions(max_new_tokens=12)
    expected = list(translate_lines(Translator(directory, decoding=decoding), texts, **languages))
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    job = CorpusJob(source, tmp_path / "out.txt", directory, decoding, workers=2, block_rows=50, **languages)
    translate_corpus(job)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == expected
    assert len(set(expected)) > 3  # not one output for every line
