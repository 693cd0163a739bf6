"""A model directory is input (runtime/dircheck.py): an Optimum or Transformers.js directory whose files lead
outside it, a manifest whose sizes disagree with its graphs or are absurd, a graph whose external data lies
outside: each refused when the directory is opened, in one line that names the file and never shows a file's
content; `onnxmt inspect`, `onnxmt translate` and `onnxmt serve` exit 2 with that line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import onnxmt
from onnxmt.manifest import ModelDirError
from onnxmt.runtime.dircheck import MODEL_BOUNDS
from onnxmt.runtime.modeldir import check_model_dir, load_manifest
from onnxmt.runtime.translator import Translator
from tests.helpers.hostile import edit_manifest, link_outside, with_external_data_at, with_sizes

SECRET = "SECRET-CONTENT-7f3a"
SECRET_CONFIG = json.dumps({"model_type": SECRET})


@pytest.fixture
def optimum_copy(tiny_optimum_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_optimum_dir, tmp_path / "optimum"))


@pytest.fixture
def onnxmt_copy(tiny_onnx_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_onnx_dir, tmp_path / "model"))


def _refused(directory: Path, **kwargs: Any) -> str:
    with pytest.raises(ModelDirError) as info:
        load_manifest(directory, **kwargs)
    message = str(info.value)
    assert "\n" not in message and SECRET not in message, message
    return message


# --- Optimum and Transformers.js directories: every file inside ---------------------------------------------------


def test_an_optimum_config_linked_outside_is_refused_unread(optimum_copy: Path, tmp_path: Path) -> None:
    link_outside(
        optimum_copy, "config.json", tmp_path / "elsewhere" / "config.json", json.dumps({"model_type": SECRET})
    )
    assert "optimum/config.json: resolves outside the model directory" in _refused(optimum_copy)
    with pytest.raises(ModelDirError, match="resolves outside"):
        check_model_dir(optimum_copy)


def test_a_transformersjs_onnx_folder_or_graph_linked_outside_is_refused(optimum_copy: Path, tmp_path: Path) -> None:
    onnx = optimum_copy / "onnx"
    onnx.mkdir()
    for graph in optimum_copy.glob("*.onnx"):
        shutil.move(graph, onnx / graph.name)
    load_manifest(optimum_copy)  # the Transformers.js layout, whole
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(onnx / "encoder_model.onnx", elsewhere / "encoder_model.onnx")
    (onnx / "encoder_model.onnx").symlink_to(elsewhere / "encoder_model.onnx")
    assert "optimum/onnx/encoder_model.onnx: resolves outside" in _refused(optimum_copy)
    (onnx / "encoder_model.onnx").unlink()
    shutil.move(elsewhere / "encoder_model.onnx", onnx / "encoder_model.onnx")
    shutil.move(onnx, elsewhere / "onnx")
    onnx.symlink_to(elsewhere / "onnx", target_is_directory=True)
    assert "optimum/onnx: resolves outside" in _refused(optimum_copy)


def test_a_hub_cache_snapshot_may_link_into_its_blobs(tiny_optimum_dir: Path, tmp_path: Path) -> None:
    # huggingface_hub's cache: models--ORG--NAME/snapshots/REVISION/<file> -> ../../blobs/<hash>
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, path in enumerate(sorted(p for p in tiny_optimum_dir.iterdir() if p.is_file())):
        shutil.copy2(path, repo / "blobs" / f"blob{i}")
        (snapshot / path.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i}")
    assert load_manifest(snapshot).layout == "optimum"


# --- sizes: sane, and those of the graphs --------------------------------------------------------------------------


def _model(**sizes: int) -> Callable[[dict[str, Any]], object]:
    return lambda data: data["model"].update(sizes)


def _heads_everywhere(heads: int) -> Callable[[dict[str, Any]], object]:
    """num_heads changed in the model section and in every cache tensor's shape the manifest lists."""

    def change(data: dict[str, Any]) -> None:
        data["model"]["num_heads"] = heads
        for graph in data["graphs"].values():
            for tensor in (*graph["inputs"], *graph["outputs"]):
                if tensor["name"].split(".")[0].endswith(("_key", "_value")):
                    tensor["shape"][1] = heads

    return change


SIZES: dict[str, tuple[Callable[[dict[str, Any]], object], str]] = {
    "heads-8-against-4": (
        _model(num_heads=8),
        "model.num_heads = 8 does not match encoder.onnx's cross_key.0 (batch, 4",
    ),
    "heads-8-in-the-manifest-too": (
        _heads_everywhere(8),
        "graphs.encoder output 'cross_key.0' is (batch, 8, src_len, 8) in the manifest, (batch, 4, src_len, 8) in "
        "encoder.onnx",
    ),
    "head-dim": (_model(head_dim=16), "model.head_dim = 16 does not match"),
    "max-positions-negative": (_model(max_positions=-5), "model.max_positions = -5 is outside [1, 2097152]"),
    "heads-2-20": (_model(num_heads=2**20, head_dim=2**20), "model.num_heads = 1048576 is outside [1, 1024]"),
    "layers": (_model(num_layers=3), "model.num_layers = 3 but the decoder's graphs hold caches for 2 layers"),
    "vocabulary": (_model(vocab_size=400), "model.vocab_size = 400 does not match decoder.onnx's logits"),
    "hidden": (_model(d_model=64), "model.d_model = 64 does not match encoder.onnx's encoder_hidden_states"),
    "a tensor the graph lacks": (
        lambda data: data["graphs"]["decoder"]["inputs"][0].update(name="ids"),
        "graphs.decoder names input 'ids', which decoder.onnx does not have",
    ),
}


@pytest.mark.parametrize("case", SIZES)
def test_sizes_that_disagree_with_the_graphs_or_are_absurd_are_refused(onnxmt_copy: Path, case: str) -> None:
    change, message = SIZES[case]
    edit_manifest(onnxmt_copy, change)
    assert message in _refused(onnxmt_copy, verify=False)
    with pytest.raises(ModelDirError, match="refused|does not have"):
        Translator(onnxmt_copy)


def test_the_bounds_hold_the_real_models_sizes() -> None:
    # NLLB-200-3.3B, MADLAD-400-3B, Gemma 3's vocabulary and positions: far inside.
    real = {"num_layers": 48, "num_heads": 32, "head_dim": 128, "d_model": 4096, "vocab_size": 262_208}
    assert all(MODEL_BOUNDS[k][0] <= v <= MODEL_BOUNDS[k][1] for k, v in real.items())
    assert MODEL_BOUNDS["max_positions"][1] >= 131_072


# --- external data --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("location", [b"/etc/passwd", b"../x/ab.bin"])
def test_external_data_outside_is_refused_before_onnxruntime(onnxmt_copy: Path, location: bytes) -> None:
    with_external_data_at(onnxmt_copy, "encoder.onnx", location)
    message = _refused(onnxmt_copy)
    assert message == "encoder.onnx: a tensor's external data is outside the model directory; refused"
    assert "passwd" not in message


def test_external_data_linked_outside_or_cut_short_is_refused(onnxmt_copy: Path, tmp_path: Path) -> None:
    weights = onnxmt_copy / "weights.bin"
    with_external_data_at(onnxmt_copy, "encoder.onnx", b"linked.bin_")
    (tmp_path / "elsewhere").mkdir()
    (onnxmt_copy / "linked.bin_").symlink_to(shutil.copy2(weights, tmp_path / "elsewhere" / "w.bin"))
    assert "external data is outside the model directory" in _refused(onnxmt_copy, verify=False)
    (onnxmt_copy / "linked.bin_").unlink()
    (onnxmt_copy / "linked.bin_").write_bytes(weights.read_bytes()[:100])
    assert "external data lies past the end of 'linked.bin_'" in _refused(onnxmt_copy, verify=False)


# --- the commands: exit 2, one line, no content, no traceback --------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(onnxmt.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src, "COLUMNS": "1000"}
    return subprocess.run(
        [sys.executable, "-c", "from onnxmt.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_inspect_refuses_external_data_outside(onnxmt_copy: Path) -> None:
    with_external_data_at(onnxmt_copy, "decoder.onnx", b"../x/ab.bin")
    _one_line(_cli("inspect", str(onnxmt_copy)), "decoder.onnx: a tensor's external data is outside")


def test_translate_refuses_absurd_sizes_in_one_line(onnxmt_copy: Path) -> None:
    with_sizes(onnxmt_copy, num_heads=2**20, head_dim=2**20)
    _one_line(_cli("translate", "-m", str(onnxmt_copy), "hi"), "model.num_heads = 1048576 is outside [1, 1024]")


def test_commands_never_show_a_linked_files_content(optimum_copy: Path, tmp_path: Path) -> None:
    link_outside(
        optimum_copy, "config.json", tmp_path / "elsewhere" / "config.json", json.dumps({"model_type": SECRET})
    )
    for args in (("inspect", str(optimum_copy)), ("translate", "-m", str(optimum_copy), "hi")):
        _one_line(_cli(*args), "config.json: resolves outside the model directory")
