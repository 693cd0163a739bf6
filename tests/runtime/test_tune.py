"""`onnxmt tune`: every setting measured on the same work, results per setting, the CLI's table."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from onnxmt.cli import app
from onnxmt.runtime.options import RuntimeOptions
from onnxmt.runtime.tune import candidates, tune


def test_candidates_cover_threads_and_spinning() -> None:
    settings = candidates(2)
    assert [(o.threads, o.spinning) for o in settings] == [(1, False), (1, True), (2, False), (2, True)]


def test_tune_measures_each_setting(tiny_onnx_dir: Path) -> None:
    settings = [RuntimeOptions(threads=1, verify=False), RuntimeOptions(threads=2, spinning=True, verify=False)]
    seen: list[str] = []
    results = tune(tiny_onnx_dir, settings, texts=["Hello world.", "What is this?"], tokens=3, batch_size=2, rounds=2,
                   progress=seen.append)  # fmt: skip
    assert [(r.threads, r.spinning) for r in results] == [(1, False), (2, True)]
    assert all(r.latency_ms > 0 and r.tokens_per_s > 0 for r in results)
    assert len(seen) == 4  # two rounds over two settings, interleaved
    assert seen[0].startswith("round 1/2") and seen[-1].startswith("round 2/2")


def test_cli_prints_table_and_recommendation(tiny_onnx_dir: Path) -> None:
    args = ["tune", "-m", str(tiny_onnx_dir), "--max-threads", "1", "--tokens", "2", "--batch-size", "2"]
    result = CliRunner().invoke(app, [*args, "--rounds", "1"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "batch-1 latency" in result.output
    assert "lowest latency: RuntimeOptions(threads=1" in result.output
    bad = CliRunner().invoke(app, ["tune", "-m", str(tiny_onnx_dir), "--rounds", "0"])
    assert bad.exit_code == 2
