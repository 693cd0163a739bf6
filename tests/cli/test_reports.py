"""What `inspect`, `eval` and `validate` print reads at 80 columns, explains itself, and nothing is written to the
current directory unless asked (--report)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from onnxmt.eval import COLUMNS
from onnxmt.manifest import read_manifest
from tests.helpers.cli import run_cli
from tests.helpers.skips import importorskip


def _fits(text: str) -> None:
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_inspect_names_every_graph_input_and_output_whole(tiny_onnx_dir: Path) -> None:
    done = run_cli("inspect", str(tiny_onnx_dir))
    assert done.returncode == 0, done.stderr
    _fits(done.stdout)
    for graph in read_manifest(tiny_onnx_dir).graphs.values():
        for spec in (*graph.inputs, *graph.outputs):
            assert re.search(rf"│ {re.escape(spec.name)} +│", done.stdout), spec.name


@pytest.fixture(scope="module")
def int8_dir(tiny_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("int8") / "tiny-int8"
    done = run_cli("quantize", str(tiny_onnx_dir), str(out))
    assert done.returncode == 0, done.stderr
    return out


def test_eval_at_80_columns_and_its_int8_column_explained(tiny_onnx_dir: Path, int8_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "en.txt").write_text("Hello world\nHow are you?\n", encoding="utf-8")
    (tmp_path / "zh.txt").write_text("你好，世界\n你好吗？\n", encoding="utf-8")
    fast = ["--max-new-tokens", "4", "--latency-sentences", "1", "--threads", "1"]
    args = ["eval", str(tiny_onnx_dir), str(int8_dir), "--src", "en.txt", "--ref", "zh.txt", *fast]
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    _fits(done.stdout)
    for label in COLUMNS[1:]:
        assert label.replace("batch N", "batch 16") in done.stdout, label
    assert tiny_onnx_dir.name in done.stdout and "tiny-int8" in done.stdout
    assert "same tokens batched: of the first 2 sentences" in " ".join(done.stdout.split())
    assert "--per-row-scales" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["en.txt", "zh.txt"]  # no onnxmt-eval.* unasked
    asked = run_cli(*args, "--report", "out/eval", cwd=tmp_path)
    assert asked.returncode == 0 and json.loads((tmp_path / "out" / "eval.json").read_text())["rows"]


def test_validate_is_quiet_fast_and_writes_nothing_unasked(
    tiny_onnx_dir: Path, tiny_hf_dir: Path, tmp_path: Path
) -> None:
    """No transformers progress bars, no warning with a source path; one torch thread for a tiny model (on a busy
    2-core machine its default threads made this 0.2 MB model take minutes)."""
    importorskip("torch")
    long_line = "A sentence far too long for the tiny model. " * 20
    (tmp_path / "in.txt").write_text(f"Hello world.\n{long_line}\n", encoding="utf-8")
    done = run_cli("validate", str(tiny_onnx_dir), "--reference", str(tiny_hf_dir), "-i", "in.txt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "| greedy token-identical |" in done.stdout  # the report, in Markdown
    assert "Loading weights" not in done.stderr and "it/s" not in done.stderr
    assert "site-packages" not in done.stderr and ".py:" not in done.stderr
    assert re.search(r"^warning: input of \d+ tokens truncated", done.stderr, re.M), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_export_shows_its_own_progress_only(tiny_hf_dir: Path, tmp_path: Path) -> None:
    """transformers' weight-loading bars do not run beside export's own status line."""
    importorskip("torch")
    done = run_cli("export", str(tiny_hf_dir), str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Loading weights" not in done.stderr and "it/s" not in done.stderr, done.stderr
    assert f"wrote {tmp_path / 'out'}" in " ".join(done.stderr.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
