"""benchmarks/bench.py --quick end to end, so the full benchmark cannot rot unnoticed.

The tiny models are cached in benchmarks/.cache (gitignored) like the full run's; engines that are not installed
(CTranslate2, the Optimum venv) are left out, onnxmt and transformers must run.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import report  # noqa: E402
import worker  # noqa: E402


def test_percentile_interpolates_like_numpy() -> None:
    assert worker.percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert worker.percentile([5.0], 90) == 5.0


def test_count_refuses_runs_that_stopped_early() -> None:
    assert worker._count([[1, 2, 0], [3, 4, 0]], 3, "x") == 6
    with pytest.raises(RuntimeError, match=r"generated \[2, 3\] tokens per text, expected exactly 3"):
        worker._count([[1, 2, 0], [3, 0]], 3, "x")


DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.mark.timeout(300)
@pytest.mark.skipif(not (DATA / "flores200").is_dir(), reason=f"shared benchmark data not found at {DATA}")
def test_quick_run_writes_table_json_and_chart(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "quick.json").read_text())
    engines = {e["name"]: e for e in result["engines"]}
    assert {"onnxmt-fp32", "transformers"} <= set(engines)
    assert all(e["status"] == "ok" for e in engines.values())
    for name, engine in engines.items():
        figures = report.flatten(engine)
        assert all(v > 0 for v in figures.values()), name
        assert engine["result"]["latency"]["1"]["samples"] == 2
    # fp32 engines run the same random model with the same forced length: same greedy tokens as onnxmt.
    for name in ("transformers", "optimum-fp32-nospin", "ct2-float32"):
        if name in engines:
            assert engines[name]["agreement"] == [2, 2], name
    assert "| onnxmt fp32 |" in proc.stdout and "×)" in proc.stdout
    assert (tmp_path / "quick.md").read_text().startswith("| engine |")
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "quick.png").stat().st_size > 10_000
    assert set(result["machine"]) >= {"cpu", "simd", "versions", "load_average"}
