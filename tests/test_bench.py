"""benchmarks/bench.py, the harness: its commands' --help, and --quick end to end (offline, its default command) so
that the full benchmark cannot rot unnoticed, with the smaller commands on the tiny model.

The tiny models are cached in benchmarks/.cache (gitignored) like the full run's; engines that are not installed
(CTranslate2, the Optimum venv) are left out, onnxmt and transformers must run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onnxmt import Translator
from onnxmt.documents.translate import counting, plan_texts
from tests.helpers import ROOT
from tests.helpers.skips import IN_CI, shared_data

BENCHMARKS = ROOT / "benchmarks"
BENCH = [sys.executable, str(BENCHMARKS / "bench.py")]
sys.path.insert(0, str(BENCHMARKS))

import bench  # noqa: E402
import decoder_bench  # noqa: E402
import report  # noqa: E402
import worker  # noqa: E402


def test_help_lists_every_command_in_80_columns() -> None:
    done = subprocess.run([*BENCH, "--help"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    listed = [line.split()[0] for line in lines if line.startswith("  ")]
    assert listed == list(bench.COMMANDS)
    assert all((BENCHMARKS / f"{command.module}.py").is_file() for command in bench.COMMANDS.values())
    unknown = subprocess.run([*BENCH, "nosuch"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "unknown command 'nosuch'" in unknown.stderr


# `bench.py NAME --help` for every command in one fresh process (one python start and one import of numpy and onnxmt
# for all of them): each command's exit code, output and error output, what its own process would give.
HELPS = """
import contextlib, io, json, sys, traceback
sys.path.insert(0, sys.argv[1])
import bench
answers = {}
for name in bench.COMMANDS:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = bench.main([name, "--help"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
    answers[name] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, list]:
    done = subprocess.run([sys.executable, "-c", HELPS, str(BENCHMARKS)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", list(bench.COMMANDS))
def test_every_command_answers_help(helps: dict[str, list], name: str) -> None:
    code, out, err = helps[name]
    missing = re.search(r"No module named '([\w.]+)'", err)
    if missing and not IN_CI:
        pytest.skip(f"{name} needs {missing[1]}")
    assert code == 0, err[-3000:]
    assert f"bench.py {name}" in out


def test_a_decoder_only_model_is_the_decoder_commands() -> None:
    done = subprocess.run([*BENCH, "--model", "hy-mt1.5-1.8b"], capture_output=True, text=True)
    assert done.returncode == 2 and "bench.py decoder --model hy-mt1.5-1.8b" in done.stderr


def test_percentile_interpolates_like_numpy() -> None:
    assert worker.percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert worker.percentile([5.0], 90) == 5.0


def test_count_refuses_runs_that_stopped_early() -> None:
    assert worker._count([[1, 2, 0], [3, 4, 0]], 3, "x") == 6
    with pytest.raises(RuntimeError, match=r"generated \[2, 3\] tokens per text, expected exactly 3"):
        worker._count([[1, 2, 0], [3, 0]], 3, "x")


@pytest.mark.timeout(300)
def test_the_served_caption_says_whether_the_column_was_measured() -> None:
    """A run with --no-served records no clients: its caption says the column was not measured, not "None
    concurrent clients"; a served run names its clients and each one's requests."""
    settings = {"max_new_tokens": 16}
    assert report.served_legend({**settings, "clients": None}) == "Served: not measured in this run (--no-served)."
    served = report.served_legend({**settings, "clients": 8, "serve_requests": 1})
    assert served.startswith("Served: 8 concurrent clients, 1 request(s) each, 16 new tokens a request")
    assert "None" not in served


def test_decoder_with_rounds_0_builds_its_rows_only(tmp_path: Path) -> None:
    # bench.py decoder's own flags reach its build: the family's tiny test model and onnxmt's export of it, no run.
    command = [*BENCH, "decoder", "--model", "qwen3-1.7b", "--quick", "--rounds", "0", "--engines", "onnxmt-fp32"]
    command += ["--decoder-cache", str(tmp_path), "--bench-python", str(tmp_path / "no-venv" / "python")]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "built: onnxmt-fp32;" in done.stderr
    assert len(list(tmp_path.glob("*/onnxmt-fp32/onnxmt.json"))) == 1


def test_decoder_quantized_rows_are_kept_without_their_fp32_export(tmp_path: Path) -> None:
    # TranslateGemma-4B's int8/int4 rows run with its fp32 export deleted (disk): a cached row builds nothing. Its
    # source is saved in bfloat16, and exported, quantized and run in float32.
    command = [*BENCH, "decoder", "--model", "translategemma-4b", "--quick", "--rounds", "0", "--engines"]
    command += ["onnxmt-int8", "--decoder-cache", str(tmp_path), "--bench-python", str(tmp_path / "no-venv" / "py")]
    first = subprocess.run(command, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "building onnxmt-fp32" in first.stderr and "building onnxmt-int8" in first.stderr
    root = tmp_path / "translategemma-4b-quick"
    header = (root / "hf" / "model.safetensors").read_bytes()
    header = json.loads(header[8 : 8 + int.from_bytes(header[:8], "little")])
    assert {t["dtype"] for name, t in header.items() if name != "__metadata__"} == {"BF16"}
    key = (root / "onnxmt-int8" / ".bench-key").stat().st_mtime_ns
    shutil.rmtree(root / "onnxmt-fp32")
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "building" not in again.stderr and "built: onnxmt-int8;" in again.stderr
    assert not (root / "onnxmt-fp32").exists()
    assert (root / "onnxmt-int8" / ".bench-key").stat().st_mtime_ns == key


def test_big_models_counts_a_bfloat16_checkpoints_weights_in_float32_bytes(tmp_path: Path) -> None:
    import big_models
    import decoder_models

    spec = decoder_models.quick(decoder_models.TRANSLATEGEMMA_4B).spec
    decoder_models.build_hf(tmp_path / "bf16", spec, "bfloat16")
    decoder_models.build_hf(tmp_path / "fp32", spec)
    fp32_file = (tmp_path / "fp32" / "model.safetensors").stat().st_size
    bf16_file = (tmp_path / "bf16" / "model.safetensors").stat().st_size
    assert bf16_file < 0.6 * fp32_file
    weights = big_models.weight_bytes(tmp_path / "bf16")
    assert weights == big_models.weight_bytes(tmp_path / "fp32")
    assert weights <= fp32_file < weights + 100_000  # the file: the weights and a JSON header


@pytest.mark.timeout(300)
def test_quick_run_writes_table_json_and_chart(tmp_path: Path) -> None:
    data = shared_data("flores200").parent
    proc = subprocess.run(
        [*BENCH, "--quick", "--out", str(tmp_path), "--data", str(data)],  # offline, the default command
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "quick.json").read_text())
    engines = {e["name"]: e for e in result["engines"]}
    assert {"onnxmt-fp32", "transformers"} <= set(engines)
    if IN_CI:  # .ci/run installs the bench extra and creates the Optimum venv: no engine may be left out
        assert result["skipped"] == {}, result["skipped"]
        assert {"onnxmt-int8", "optimum-fp32-nospin", "ct2-float32", "ct2-int8"} <= set(engines)
    assert all(e["status"] == "ok" for e in engines.values())
    for name, engine in engines.items():
        figures = report.flatten(engine)
        # A greedy step is a difference of two timings: on a tiny model noise may take it (and its ratio to the
        # floor) to zero or below.
        assert all(v > 0 for key, v in figures.items() if key not in ("step", "floor_ratio")), name
        assert engine["result"]["latency"]["1"]["samples"] == 2
        assert engine["floor"] == ("onnxmt-int8" if "int8" in name else "onnxmt-fp32"), name
        assert engine["floor_ratio"] == figures["step"] / result["floors"][engine["floor"]]["floor_ms"], name
    assert result["bandwidth"]["bytes_per_s"] > 1e8 and len(result["bandwidth"]["samples"]) == 2
    # fp32 engines run the same random model with the same forced length: same greedy tokens as onnxmt.
    for name in ("transformers", "optimum-fp32-nospin", "ct2-float32"):
        if name in engines:
            assert engines[name]["agreement"] == [2, 2], name
    assert "| onnxmt fp32 |" in proc.stdout and "×)" in proc.stdout and "| × floor |" in proc.stdout
    assert (tmp_path / "quick.md").read_text().startswith("| engine |")
    if IN_CI or importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "quick.png").stat().st_size > 10_000
    assert set(result["machine"]) >= {"cpu", "simd", "versions", "load_average"}
    # The peak after each column, named by column; what the process held at its end, by mapping.
    onnxmt = engines["onnxmt-fp32"]["result"]
    peaks = onnxmt["peak_rss_after_column_mb"]
    assert list(peaks) == ["cold batch", "beam 1 latency", "beam 4 latency", "beam 1 bs2", "beam 4 bs2"]
    assert all(v > 0 for v in peaks.values()) and onnxmt["peak_rss_end_mb"] >= onnxmt["peak_rss_mb"]
    assert "[heap]" in onnxmt["resident_end_mb"] and sum(onnxmt["resident_end_mb"].values()) > 0
    assert len({e["result"]["pid"] for e in engines.values()}) == len(engines)  # each engine in its own process


@pytest.mark.timeout(300)
def test_quick_int8_only_model_runs_onnxmt_int8_against_ctranslate2_int8(tmp_path: Path) -> None:
    # The 3B tables (--model madlad400-3b-mt, nllb-200-3.3B): onnxmt's int8 straight from `export --quantize int8`,
    # CTranslate2's int8, no fp32 rows; the ratios are to onnxmt int8.
    data = shared_data("flores200").parent
    command = [*BENCH, "offline", "--quick", "--model", "madlad400-3b-mt"]
    proc = subprocess.run(
        [*command, "--no-envsize", "--out", str(tmp_path), "--data", str(data)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "quick.json").read_text())
    names = [e["name"] for e in result["engines"]]
    assert names[0] == "onnxmt-int8" and "onnxmt-fp32" not in names and "transformers" not in names
    assert result["settings"]["reference"] == "onnxmt int8"
    assert "divided by onnxmt int8's" in proc.stdout
    assert "ct2-float32" in result["skipped"]
    if IN_CI:
        assert names == ["onnxmt-int8", "ct2-int8"]
    if "ct2-int8" in names:  # `<2zh> X </s>` in both: the same greedy tokens on this tiny model
        assert result["engines"][1]["agreement"] == [2, 2]
    int8_dir = Path(result["engines"][0]["model_dir"])
    manifest = json.loads((int8_dir / "onnxmt.json").read_text())
    assert manifest["quantization"] and "not kept" in manifest["provenance"]["quantized_from"]


def _entry(cold: float, latency: float, tps: float, runs: list[float]) -> dict:
    result = {
        "cold_start_s": cold,
        "load_s": cold / 2,
        "first_batch_s": cold / 4,
        "peak_rss_mb": 100 + cold,
        "peak_rss_end_mb": 200 + cold,
        "latency": {"1": {"median_ms": latency, "p90_ms": 2 * latency, "samples": 20, "step_ms": latency / 10}},
        "throughput": {"1x8": {"tokens_per_s": tps, "runs": runs, "texts": 64}},
        "cold_batch_tokens": [[1, 2, 0]],
    }
    return {"name": "e", "label": "e", "disk_bytes": 1 << 20, "status": "ok", "result": result}


def test_rounds_merge_into_medians() -> None:
    import offline

    entries = [_entry(1.0, 30.0, 500.0, [500.0]), _entry(3.0, 10.0, 700.0, [700.0]), _entry(2.0, 20.0, 900.0, [900.0])]
    merged = offline.merge_rounds(entries)
    r = merged["result"]
    assert (r["cold_start_s"], r["load_s"], r["peak_rss_mb"]) == (2.0, 1.0, 102.0)
    assert r["latency"]["1"] == {"median_ms": 20.0, "p90_ms": 40.0, "samples": 60, "step_ms": 2.0}
    assert r["throughput"]["1x8"] == {"tokens_per_s": 700.0, "runs": [500.0, 700.0, 900.0], "texts": 64}
    assert [round(f["cold"], 1) for f in r["rounds"]] == [1.0, 3.0, 2.0]  # each round's own figures are kept
    assert report.flatten(merged)["tps1x8"] == 700.0
    # One round: the entry as it is; a failed round makes the engine's entry failed.
    assert offline.merge_rounds(entries[:1]) is entries[0]
    failed = {**entries[1], "status": "failed", "error": "boom"}
    assert offline.merge_rounds([entries[0], failed])["status"] == "failed"


@pytest.mark.timeout(300)
def test_int8_batch_quick_run(tmp_path: Path) -> None:
    # bench.py int8-batch on the tiny model: fp32 and per-row int8 never change with the batch.
    shared_data("flores200")
    models = "onnxmt fp32,onnxmt int8,onnxmt int8 per-row"
    command = [*BENCH, "int8-batch", "--quick", "--models", models]
    proc = subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "int8-batch-quick" / "int8_batch.json").read_text())
    differing = {(c["model"], c["search"], c["condition"]): c["differing"] for c in result["comparisons"]}
    assert {m for m, _, _ in differing} == set(models.split(","))
    assert all(n == 0 for (m, _, _), n in differing.items() if m != "onnxmt int8")
    assert "simd" in result["machine"] and (tmp_path / "int8-batch-quick" / "int8_batch.md").is_file()


@pytest.mark.timeout(300)
def test_service_throughput_compares_a_second_servers_settings(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    # bench.py throughput --compare on the tiny model: both servers run every round, each round's
    # compared figure is divided by the first server's, and the second server ran with its settings (/info).
    command = [*BENCH, "throughput", str(tiny_onnx_dir), "--texts", "8"]
    command += ["--tokens", "4", "--beams", "1", "--concurrency", "2", "--rounds", "2", "--batch-size", "4"]
    command += ["--compare", "ONNXMT_ENCODER_THREADS=2,ONNXMT_THREADS=2", "--name", "t", "--out", str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "service-throughput-t.json").read_text())
    assert set(result["tokens_per_s"]) == {"offline", "service 2", "compared 2"}
    assert all(len(v) == 2 and min(v) > 0 for v in result["tokens_per_s"].values())
    service, compared = result["tokens_per_s"]["service 2"], result["tokens_per_s"]["compared 2"]
    ratios = [round(a / b, 3) for a, b in zip(compared, service, strict=True)]
    assert result["compared_over_service"]["2 clients"] == ratios
    assert "compared (ONNXMT_ENCODER_THREADS=2,ONNXMT_THREADS=2) over service, 2 clients" in proc.stdout
    assert result["servers"] == {
        "service": {"in_flight": True, "encoder_threads": 1},
        "compared": {"in_flight": True, "encoder_threads": 2},
    }


def test_encoder_pools_quick_run(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    # bench.py encoder-pools on the tiny model: every setting timed in every round.
    command = [*BENCH, "encoder-pools", str(tiny_onnx_dir), "--texts", "12"]
    command += ["--pool", "4", "--rounds", "2", "--call-tokens", "0", "16", "--name", "t", "--out", str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "encoder-pools-t.json").read_text())
    assert len(result["ms"]) == 2 * 2 * 2 and all(len(v) == 2 and min(v) > 0 for v in result["ms"].values())
    assert "| 1 | 16 |" in proc.stdout and "| 2 | 0 |" in proc.stdout


@pytest.mark.timeout(300)
def test_load_run_bounds_outputs_by_source_length(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    # bench.py load end to end on the tiny model: every request answered, and with --output-length source no
    # request generates more tokens than its source has (the server's own counter).
    command = [*BENCH, "load", str(tiny_onnx_dir), "--concurrency", "1", "4"]
    command += ["--requests", "12", "--duration", "60", "--output-length", "source", "--name", "t", "--out"]
    proc = subprocess.run([*command, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "load-t.json").read_text())
    assert [(level["ok"], level["errors"]) for level in result["levels"]] == [(12, 0), (12, 0)]
    sys.path.insert(0, str(BENCHMARKS))
    import load

    texts = load.sentences(12)
    lengths = load.source_lengths(tiny_onnx_dir, texts)
    assert result["output_lengths"]["max"] == max(lengths) and len(set(lengths)) > 1
    # /translate cuts a text into its sentences (Marian's unit of text), each of which may generate its text's
    # max_new_tokens; the plan's parts (its sentences, those longer than the tiny model's 64 positions cut again)
    # are at least as many.
    translator = Translator(tiny_onnx_dir)
    plan = plan_texts(texts, counting(translator), tokenizer=translator.tokenizer)
    parts = [sum(p.translate for p in layout) for layout in plan.layouts]
    bound = sum(n * k for n, k in zip(lengths, parts, strict=True))
    for level in result["levels"]:
        generated = level["generated_tokens_per_s"] * level["seconds"]
        assert 0 < generated <= bound + 1, (generated, lengths, parts)
    assert result["server_exit_code"] == 0 and "| 4 | 12 | 0 |" in proc.stdout
    assert all(level["cpu_ms_per_token"] > 0 for level in result["levels"])
    # The running batch's rows per decoder call (a text's beams are rows): four clients share the calls.
    beams = int(translator.manifest.generation["num_beams"])
    one, four = (level["mean_step_rows"] for level in result["levels"])
    assert beams <= one <= beams * max(parts) and one < four <= 4 * beams * max(parts), (one, four, beams)


@pytest.mark.timeout(300)
def test_nllb_quick_run_matches_transformers_and_ctranslate2(tmp_path: Path) -> None:
    """--model nllb-200-distilled-600M: every engine told eng_Latn -> zho_Hans its own way (onnxmt's manifest,
    transformers' src_lang + forced_bos_token_id, CTranslate2's source token + target prefix) does the same work and
    the fp32 engines return the same tokens."""
    data = shared_data("flores200").parent
    command = [*BENCH, "offline", "--model", "nllb-200-distilled-600M", "--quick"]
    proc = subprocess.run([*command, "--out", str(tmp_path), "--data", str(data)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "quick.json").read_text())
    engines = {e["name"]: e for e in result["engines"]}
    assert result["settings"]["source_lang"] == "eng_Latn" and result["settings"]["target_lang"] == "zho_Hans"
    assert set(result["skipped"]) == {"optimum-fp32"}  # Optimum is the opus-mt table's only
    if IN_CI:
        assert {"onnxmt-int8", "ct2-float32", "ct2-int8"} <= set(engines)
    assert all(e["status"] == "ok" for e in engines.values())
    for name in ("transformers", "ct2-float32"):
        if name in engines:
            assert engines[name]["agreement"] == [2, 2], name
    assert "nllb-200-distilled-600M's architecture, eng_Latn → zho_Hans" in proc.stdout


def test_validate_sides_give_validates_report_with_no_torch_on_the_onnx_side(
    tiny_hf_dir: Path, tiny_onnx_dir: Path, tmp_path: Path
) -> None:
    """bench.py validate-sides (big-models' "larger side" of validate): the reference side alone saves what
    validate computes, and the ONNX side run from it, without importing torch, reports what validate reports."""
    texts = tmp_path / "texts.txt"
    texts.write_text("Where is the doctor?\nThe river is long and the mountain is high.\n", encoding="utf-8")
    common = [str(tiny_onnx_dir), "--reference", str(tiny_hf_dir), "--input", str(texts), "--min-identical", "0"]
    common += ["--max-new-tokens", "8"]
    state = tmp_path / "state"
    script = [*BENCH, "validate-sides"]
    for side in ("reference", "onnx"):
        report = ["--report", str(tmp_path / side)]
        proc = subprocess.run([*script, side, str(state), "--", *common, *report], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "reference.json").exists()  # stopped after the reference side
    assert sorted(p.name for p in state.glob("*.npy")) == ["beam-0.npy", "beam-1.npy", "greedy-0.npy", "greedy-1.npy"]
    whole = [sys.executable, "-m", "onnxmt.cli", "validate", *common, "--report", str(tmp_path / "whole")]
    proc = subprocess.run(whole, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sides, direct = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("onnx", "whole"))
    for key in ("greedy_identical", "beam_identical", "max_abs_logit_diff", "mean_abs_logit_diff", "per_sentence"):
        assert sides[key] == direct[key], key
    assert direct["sentences"] == 2 and direct["max_abs_logit_diff"] > 0


def test_floor_counts_what_a_step_reads_and_not_what_it_gathers(tmp_path: Path) -> None:
    # A tied head reads the whole embedding a Gather reads a row of: it counts; a position table only gathered does
    # not; a projection's weight does.
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import floor

    embedding, positions = np.ones((50, 8), np.float32), np.ones((16, 8), np.float32)
    projection = np.ones((8, 8), np.int8)
    nodes = [
        helper.make_node("Gather", ["embedding", "ids"], ["x"]),
        helper.make_node("Gather", ["positions", "ids"], ["p"]),
        helper.make_node("Add", ["x", "p"], ["h"]),
        helper.make_node("Cast", ["projection"], ["w"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["h", "w"], ["y"]),
        helper.make_node("Gemm", ["y", "embedding"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 50])],
        [
            numpy_helper.from_array(a, n)
            for a, n in ((embedding, "embedding"), (positions, "positions"), (projection, "projection"))
        ],
    )
    onnx.save(helper.make_model(graph), str(tmp_path / "decoder.onnx"))
    (tmp_path / "onnxmt.json").write_text(json.dumps({"graphs": {"decoder": {"file": "decoder.onnx"}}}))
    assert floor.step_bytes(tmp_path) == {"read_per_step": 50 * 8 * 4 + 8 * 8, "gathered": 16 * 8 * 4}
    assert floor.floor("g", tmp_path, 1e6)["floor_ms"] == (50 * 8 * 4 + 8 * 8) / 1e6 * 1000


def _decoder_run(decode: list[float], served: list[float], bandwidth: list[float], rows: tuple[str, ...]) -> dict:
    figures = dict.fromkeys(decoder_bench.MEDIAN_KEYS, 1.0)
    engines = []
    for name in rows:
        rounds = [{**figures, "decode_ms_per_token": d, "prefill_tokens_per_s": {"100": 1000 / d}} for d in decode]
        result = {**rounds[0], "rounds": rounds, "tokens": {"100": [1, 2, 3], "batch": [[1, 2, 3]]}}
        entry = {"name": name, "label": name, "bits": 8, "status": "ok", "disk_bytes": 1 << 20, "result": result}
        entry["served"] = {
            "tokens_per_s": served[0],
            "p50_s": 1.0,
            "rounds": [{"tokens_per_s": s, "p50_s": 1.0} for s in served],
        }
        engines.append(entry)
    machine = {"load_average_during": [[1.0, 1.0, 1.0]], "load_average_end": [1.0, 1.0, 1.0]}
    return {
        "mode": "m",
        "settings": {"rounds": len(decode)},
        "machine": machine,
        "bandwidth": {"bytes_per_s": bandwidth[0], "samples": bandwidth},
        "floors": {"8": {"graph": "onnxmt-int8", "read_per_step": 10**9, "floor_ms": 1000 / bandwidth[0]}},
        "builds": {},
        "engines": engines,
        "skipped": {"ct2-int8": "failed"},
    }


def test_decoder_runs_merge_their_rounds_into_medians() -> None:
    # Three one-round runs (each a short measuring run) pool into one three-round result: every figure the median of
    # the pooled rounds, the floor at the pooled bandwidth; a row run once says so in its label.
    runs = [
        _decoder_run([30.0], [5.0], [4e10, 4e10], ("onnxmt-int8", "onnxmt-fp32")),
        _decoder_run([10.0], [7.0], [5e10, 5e10], ("onnxmt-int8",)),
        _decoder_run([20.0], [9.0], [3e10, 6e10], ("onnxmt-int8",)),
    ]
    merged = decoder_bench.merge_results(runs)
    rows = {r["name"]: r for r in merged["engines"]}
    assert rows["onnxmt-int8"]["result"]["decode_ms_per_token"] == 20.0
    assert rows["onnxmt-int8"]["result"]["prefill_tokens_per_s"]["100"] == 50.0
    assert len(rows["onnxmt-int8"]["result"]["rounds"]) == 3 and rows["onnxmt-int8"]["served"]["tokens_per_s"] == 7.0
    assert (
        rows["onnxmt-int8"]["label"] == "onnxmt-int8" and rows["onnxmt-fp32"]["label"] == "onnxmt-fp32 (1 of 3 rounds)"
    )
    assert merged["bandwidth"] == {"bytes_per_s": 4.5e10, "samples": [4e10, 4e10, 5e10, 5e10, 3e10, 6e10]}
    assert merged["floors"]["8"]["floor_ms"] == 10**9 / 4.5e10 * 1000
    assert merged["settings"]["rounds"] == 3 and merged["skipped"] == {"ct2-int8": "failed"}
    assert rows["onnxmt-int8"]["agreement"]["reference"] == "onnxmt-fp32"  # no transformers row: the fp32 one
    assert (rows["onnxmt-int8"]["agreement"]["same"], rows["onnxmt-int8"]["agreement"]["outputs"]) == (2, 2)
