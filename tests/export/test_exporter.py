"""`onnxmt export`: the model directory it writes, and its errors."""

from __future__ import annotations

import json
import os
import re
import shutil
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from onnxmt.manifest import DECODER_FILE, ENCODER_FILE, MANIFEST_NAME, WEIGHTS_FILE, read_manifest, sha256_file
from tests.helpers.skips import importorskip

importorskip("torch")
onnx = importorskip("onnx")

from onnxmt.export.exporter import ExportError, ExportOptions, export  # noqa: E402
from onnxmt.export.hub import ModelNotFoundError  # noqa: E402
from onnxmt.testing.marian import OPUS_MT_EN_ZH_TARGETS  # noqa: E402


def test_manifest_lists_every_file_with_its_sha256(tiny_onnx_dir: Path) -> None:
    manifest = read_manifest(tiny_onnx_dir)
    on_disk = {p.name for p in tiny_onnx_dir.iterdir()} - {MANIFEST_NAME}
    assert set(manifest.files) == on_disk
    for name, info in manifest.files.items():
        assert info["sha256"] == sha256_file(tiny_onnx_dir / name)
        assert info["bytes"] == (tiny_onnx_dir / name).stat().st_size
    for name in (
        "source.spm",
        "target.spm",
        "vocab.json",
        "tokenizer_config.json",
        "config.json",
        "generation_config.json",
    ):
        assert name in manifest.files


def test_manifest_describes_graphs_tokens_and_generation(tiny_concat_onnx_dir: Path, tiny_hf_dir: Path) -> None:
    # The decoder exported with --cache-concat; the default, buffered one is the next test's.
    tiny_onnx_dir = tiny_concat_onnx_dir
    manifest = read_manifest(tiny_onnx_dir)
    config = json.loads((tiny_hf_dir / "config.json").read_text())
    layers = config["decoder_layers"]
    pad = config["pad_token_id"]
    assert manifest.tokens == {"decoder_start": pad, "eos": 0, "eos_ids": [0], "pad": pad, "unk": 1}
    assert manifest.generation == {
        "num_beams": 4,
        "max_length": 64,
        "forced_eos_token_id": 0,
        "bad_words_ids": [[pad]],
        "renormalize_logits": True,
    }
    assert manifest.model["num_layers"] == layers and manifest.model["vocab_size"] == config["vocab_size"]
    encoder, decoder = manifest.graphs["encoder"], manifest.graphs["decoder"]
    assert [t.role for t in encoder.inputs] == ["input_ids", "attention_mask"]
    cross = [f"cross_{kv}.{i}" for i in range(layers) for kv in ("key", "value")]
    assert [t.role for t in encoder.outputs] == ["encoder_hidden_states", *cross]
    past = [f"past_{kv}.{i}" for i in range(layers) for kv in ("key", "value")]
    assert [t.role for t in decoder.inputs] == ["input_ids", "encoder_attention_mask", *past, *cross]
    assert decoder.outputs[0].role == "logits" and decoder.outputs[0].shape == ["rows", config["vocab_size"]]
    # Decoder rows are sentences x beams; the encoder's K/V and mask stay one per sentence (broadcast over beams).
    heads, head_dim = manifest.model["num_heads"], manifest.model["head_dim"]
    by_role = {t.role: t.shape for t in decoder.inputs}
    assert by_role["input_ids"][0] == "rows" and by_role["past_key.0"] == ["rows", heads, "past_len", head_dim]
    assert (
        by_role["cross_key.0"] == ["batch", heads, "src_len", head_dim]
        and by_role["encoder_attention_mask"][0] == "batch"
    )
    assert manifest.model["cross_kv_per_sentence"] is True
    # The names in the manifest are the graphs' own.
    graph = onnx.load(str(tiny_onnx_dir / DECODER_FILE), load_external_data=False).graph
    assert [i.name for i in graph.input] == [t.name for t in decoder.inputs]
    assert manifest.provenance["source_model"] == str(tiny_hf_dir)
    assert {"torch", "transformers", "onnx"} <= set(manifest.provenance["versions"])
    assert manifest.provenance["check"]["first_step_logits_max_abs_diff"] < 1e-4


def test_cache_buffer_decoder_reads_a_buffer_and_returns_the_new_key_and_value(tiny_buffered_onnx_dir: Path) -> None:
    manifest = read_manifest(tiny_buffered_onnx_dir)
    layers, heads, head_dim = (manifest.model[k] for k in ("num_layers", "num_heads", "head_dim"))
    decoder = manifest.graphs["decoder"]
    past = [f"past_{kv}.{i}" for i in range(layers) for kv in ("key", "value")]
    cross = [f"cross_{kv}.{i}" for i in range(layers) for kv in ("key", "value")]
    assert [t.role for t in decoder.inputs] == ["input_ids", "encoder_attention_mask", "past_length", *past, *cross]
    by_role = {t.role: t.shape for t in decoder.inputs}
    assert by_role["input_ids"] == ["rows", 1] and by_role["past_length"] == ["rows"]  # one length per row
    assert decoder.per_row_positions()
    assert by_role["past_key.0"] == ["rows", heads, "capacity", head_dim]  # spare capacity past past_length
    new = [f"new_{kv}.{i}" for i in range(layers) for kv in ("key", "value")]
    assert [t.role for t in decoder.outputs] == ["logits", *new]
    assert {tuple(t.shape) for t in decoder.outputs[1:]} == {("rows", heads, 1, head_dim)}
    assert manifest.provenance["check"]["cached_step_logits_max_abs_diff"] < 1e-4


def _rows_alone_and_together(directory: Path, capacity: int, width: int | None = None) -> list[tuple[Any, Any]]:
    """Two sentences stepped alone to different lengths (10 and 2 positions, in buffers of 12: the limit), then
    stepped together in one call (their buffers side by side at `capacity` positions, each masked past its own
    length; the source K/V at the wider source's width, in whole blocks as `encode` makes them): per row, (its
    logits together, its logits alone). `width`: another source width together."""
    from onnxmt.runtime.cache import aligned
    from onnxmt.runtime.graphs import OnnxmtGraphs
    from onnxmt.runtime.options import RuntimeOptions
    from onnxmt.runtime.translator import pad_batch

    manifest = read_manifest(directory)
    graphs = OnnxmtGraphs(directory, manifest, RuntimeOptions(threads=1))
    start, pad = manifest.tokens["decoder_start"], manifest.tokens["pad"]
    sources, steps = [[5, 6, 7, 8, 0], [9, 10, 0]], [[start, *range(11, 20)], [start, 14]]
    alone = []
    for source, tokens in zip(sources, steps, strict=True):
        cache = graphs.encode(*pad_batch([source], pad), max_positions=12)
        for token in tokens:
            logits, cache = graphs.step(np.array([[token]]), cache)
        assert cache.self_kv[0].shape[2] == 12
        alone.append(cache)
    assert [cache.mask.shape[1] for cache in alone] == [aligned(5), aligned(3)] == [8, 4]  # widths of their own
    width = width or aligned(max(len(s) for s in sources))
    mask = np.zeros((2, width), np.int64)
    for row, cache in enumerate(alone):
        mask[row, : min(width, cache.mask.shape[1])] = cache.mask[0, :width]
    feed = {graphs.dec_ids: np.array([[21], [22]]), graphs.dec_mask: mask}
    lengths = np.array([len(t) for t in steps], dtype=np.int64)
    feed[graphs.dec_length] = lengths
    for name, i in zip(graphs.dec_past, range(2 * graphs.layers), strict=True):
        buffer = np.zeros((2, graphs.heads, capacity, graphs.head_dim), np.float32)
        for row, cache in enumerate(alone):
            buffer[row, :, : lengths[row]] = cache.self_kv[i][0, :, : lengths[row]]
        feed[name] = buffer
    for name, i in zip(graphs.dec_cross, range(2 * graphs.layers), strict=True):
        cross = np.zeros((2, graphs.heads, width, graphs.head_dim), np.float32)
        for row, cache in enumerate(alone):
            used = min(width, cache.mask.shape[1])  # (the positions cut off hold padding)
            cross[row, :, :used] = cache.cross_kv[i][0, :, :used]
        feed[name] = cross
    together, *new = graphs.decoder.run(graphs.dec_out, feed)
    pairs = []
    for row, cache in enumerate(alone):
        logits, cache = graphs.step(np.array([[21 + row]]), cache)
        np.testing.assert_array_equal(new[0][row, :, 0], cache.self_kv[0][0, :, lengths[row]])
        pairs.append((together[row], logits[0]))
    return pairs


@pytest.mark.parametrize("capacity", [12, 16, 20, 36])
@pytest.mark.parametrize("family", ["marian", "t5"])
def test_rows_of_different_lengths_share_a_decoder_call_exactly(family: str, capacity: int, request) -> None:
    """Each row its own cache length, at another capacity and source width than alone: the logits and new K/V each
    row gives alone, bit for bit. What in-flight batching relies on to join rows at any step. Capacities are whole
    blocks of key positions (cache.aligned), as the runtime makes them."""
    from onnxmt.runtime.cache import KEY_BLOCK

    assert capacity % KEY_BLOCK == 0
    directory = request.getfixturevalue("tiny_buffered_onnx_dir" if family == "marian" else "tiny_t5_onnx_dir")
    for together, alone in _rows_alone_and_together(directory, capacity):
        np.testing.assert_array_equal(together, alone)  # exact: padding is masked to weight 0


@pytest.mark.skipif(
    not Path("/proc/cpuinfo").is_file() or " avx" not in Path("/proc/cpuinfo").read_text(),
    reason="MLAS's one-row kernel (what KEY_BLOCK is for) runs on x86-64 with AVX",
)
def test_a_capacity_or_width_of_partial_key_blocks_would_move_a_rows_logits(tiny_buffered_onnx_dir: Path) -> None:
    """Why capacities are whole blocks of 4 positions: at 10 positions, the row holding 10 puts its last two in the
    kernel's partial block, summed in another order, and its logits move in the last bits. (Should this fail after
    an ONNX Runtime upgrade, the kernel no longer depends on the capacity, and KEY_BLOCK may be unneeded.)"""
    (long_together, long_alone), (short_together, short_alone) = _rows_alone_and_together(tiny_buffered_onnx_dir, 10)
    assert not np.array_equal(long_together, long_alone)
    np.testing.assert_array_equal(short_together, short_alone)  # its 2 positions lie in a whole block
    # The same for a source width: 5 puts the 5-token source's last position in a partial block (a greedy row).
    (long_together, long_alone), (short_together, short_alone) = _rows_alone_and_together(
        tiny_buffered_onnx_dir, 12, width=5
    )
    assert not np.array_equal(long_together, long_alone)
    np.testing.assert_array_equal(short_together, short_alone)  # its 3 source positions lie in a whole block


def test_no_decoder_weight_is_stored_twice(tiny_onnx_dir: Path) -> None:
    from onnx import numpy_helper

    graph = onnx.load(str(tiny_onnx_dir / DECODER_FILE)).graph
    arrays = [numpy_helper.to_array(init) for init in graph.initializer if np.prod(init.dims) > 256]
    for i, a in enumerate(arrays):
        for b in arrays[i + 1 :]:
            assert not (a.shape == b.shape and np.array_equal(a, b))
            assert not (a.shape == b.T.shape and np.array_equal(a, b.T)), "a transposed copy is stored"
    # The LM head reads the embedding matrix itself (Gemm with transB) rather than a transposed copy.
    assert any(node.op_type == "Gemm" for node in graph.node)


def test_one_decoder_graph_without_if_node(tiny_onnx_dir: Path) -> None:
    graph = onnx.load(str(tiny_onnx_dir / DECODER_FILE), load_external_data=False).graph
    assert "If" not in {node.op_type for node in graph.node}
    assert sorted(p.name for p in tiny_onnx_dir.glob("*.onnx")) == [DECODER_FILE, ENCODER_FILE]


def test_refuses_a_non_empty_output_unless_forced(tiny_hf_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty; pass --force"):
        export(str(tiny_hf_dir), out, progress=lambda _: None)
    assert (out / "keep.txt").read_text() == "mine"
    export(str(tiny_hf_dir), out, ExportOptions(force=True, check=False), progress=lambda _: None)
    assert not (out / "keep.txt").exists() and (out / MANIFEST_NAME).is_file()


def test_missing_directory_and_unknown_hub_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelNotFoundError, match="model directory not found"):
        export(str(tmp_path / "nope" / "deeper"), tmp_path / "out", progress=lambda _: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="unreachable|unknown model id|HF_HUB_OFFLINE is set"):
        export("nobody-here/no-such-model", tmp_path / "out2", progress=lambda _: None)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_unreachable_hub_says_how_to_go_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A closed port on loopback: the download fails at once, like a hub that cannot be reached.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "2")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ModelNotFoundError, match="local model directory|HF_ENDPOINT"):
        export("Helsinki-NLP/opus-mt-en-zh", tmp_path / "out", progress=lambda _: None)
    assert list(tmp_path.iterdir()) == []


def test_unsupported_architecture_lists_supported(tiny_hf_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "fsmt"
    shutil.copytree(tiny_hf_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "fsmt"
    (model / "config.json").write_text(json.dumps(config))
    names = "gemma3, gemma3_text, hunyuan_v1_dense, m2m_100, marian, mbart, mt5, qwen3, t5"
    with pytest.raises(ValueError, match=f"'fsmt' is not supported yet; supported: {names}"):
        export(str(model), tmp_path / "out", progress=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fsmt"]


def test_missing_tokenizer_file_leaves_nothing_behind(tiny_hf_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_hf_dir, model)
    (model / "target.spm").unlink()
    with pytest.raises(ExportError, match="target.spm: missing"):
        export(str(model), tmp_path / "out", ExportOptions(check=False), progress=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_default_target_must_be_a_language_of_the_model(tiny_multi_hf_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="valid: cjy_Hans, cjy_Hant, cmn, cmn_Hans, .*, yue_Hant$"):
        export(str(tiny_multi_hf_dir), tmp_path / "out", ExportOptions(default_target="fra"), progress=lambda _: None)
    manifest, _ = export(
        str(tiny_multi_hf_dir),
        tmp_path / "ok",
        ExportOptions(default_target="cmn_Hans", check=False),
        progress=lambda _: None,
    )
    assert manifest.languages["default_target"] == "cmn_Hans"
    assert manifest.languages["target_tokens"] == {lang: f">>{lang}<<" for lang in OPUS_MT_EN_ZH_TARGETS}
    assert read_manifest(tmp_path / "ok").languages["default_target"] == "cmn_Hans"


def test_weights_are_stored_once_and_the_chunked_head_reads_the_embedding(tiny_onnx_dir: Path) -> None:
    from onnx import numpy_helper

    manifest = read_manifest(tiny_onnx_dir)
    assert WEIGHTS_FILE in manifest.files
    encoder = onnx.load(str(tiny_onnx_dir / ENCODER_FILE), load_external_data=False).graph
    decoder = onnx.load(str(tiny_onnx_dir / DECODER_FILE), load_external_data=False).graph

    def where(graph: Any) -> dict[str, tuple[int, int]]:
        out = {}
        for init in graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in init.external_data}
                assert info["location"] == WEIGHTS_FILE
                out[init.name] = (int(info.get("offset", 0)), int(info["length"]))
        return out

    enc, dec = where(encoder), where(decoder)
    model = manifest.model
    embedding = [model["vocab_size"], model["d_model"]]
    table = {i.name for g in (encoder, decoder) for i in g.initializer if list(i.dims) == embedding}
    assert len(table) == 2, "each graph reads the embedding matrix"
    assert len({enc.get(n) or dec.get(n) for n in table}) == 1, "one copy on disk"
    start, length = next(iter(enc.get(n) or dec.get(n) for n in table))
    # The tied head in chunks (conftest cuts even a tiny head): Gemms over consecutive row ranges of those bytes.
    heads = [n for n in decoder.node if n.op_type == "Gemm"]
    assert len(heads) >= 2 and any(n.op_type == "Concat" and n.name.endswith(".chunks") for n in decoder.node)
    ranges = sorted(dec[n.input[1]] for n in heads)
    assert ranges[0][0] == start and sum(r[1] for r in ranges) == length
    assert all(a[0] + a[1] == b[0] for a, b in pairwise(ranges))
    # No bytes twice: the tensors that are not rows of another do not overlap in the file, or inline.
    spans = sorted(set(enc.values()) | set(dec.values()))
    outer = [s for s in spans if not any(o != s and o[0] <= s[0] and s[0] + s[1] <= o[0] + o[1] for o in spans)]
    assert all(a[0] + a[1] <= b[0] for a, b in pairwise(outer))
    inline = [numpy_helper.to_array(i).tobytes() for g in (encoder, decoder) for i in g.initializer if i.raw_data]
    big = [b for b in inline if len(b) >= 1 << 12]
    assert len(big) == len(set(big)), "a weight is stored in both graph files"


@pytest.mark.parametrize("form", ["tiny_concat_onnx_dir", "tiny_buffered_onnx_dir"])
def test_decoder_step_needs_no_shape_arithmetic_and_one_op_per_projection(
    form: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # As ONNX Runtime runs the decoder (optimised): the reshapes take their sizes from the tensor they reshape or
    # from the rows and sentences read once per graph, so the Shape nodes do not grow with the layers; every
    # projection is one Gemm with its bias (the hidden states are 2-D), and the self-attention's query, key and
    # value come out of one of them, split once.
    import onnx
    import onnxruntime as ort

    directory: Path = request.getfixturevalue(form)
    layers = read_manifest(directory).model["num_layers"]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(directory / DECODER_FILE), so, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("Shape") <= 3, ops.count("Shape")  # was 3 per layer + 2, then 2 per layer + 2
    layer_gemms = [n for n in graph.node if n.op_type == "Gemm" and "tied" not in n.name]
    assert len(layer_gemms) == 6 * layers  # qkv, out, cross query, cross out, fc1, fc2; each with its bias
    assert all(len(n.input) == 3 for n in layer_gemms)
    assert ops.count("MatMul") == 2 * layers  # what is left: probabilities x values (scores fuse with the scale)
    assert ops.count("Split") == layers


def test_a_killed_exports_staging_directory_is_removed_by_the_next_and_said(tiny_hf_dir: Path, tmp_path: Path) -> None:
    """A process killed mid-export cannot clean up; the next export to that output removes what it left (a dead
    process's staging directory), leaves a live process's alone, and says so."""
    import subprocess

    from onnxmt.export.exporter import ExportOptions, export

    output = tmp_path / "model"
    child = subprocess.Popen(["true"])
    child.wait()  # its process id is no longer running
    left = tmp_path / f".model.{child.pid}.abc123"
    (left / "weights.bin").parent.mkdir()
    (left / "weights.bin").write_bytes(b"half" * 1000)
    live = tmp_path / f".model.{os.getpid()}.def456"  # this process: still running
    live.mkdir()
    messages: list[str] = []
    export(str(tiny_hf_dir), output, ExportOptions(check=False), progress=messages.append)
    assert not left.exists() and live.exists()
    assert any(m.startswith(f"removed {left}") for m in messages)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "model"])
    # The long steps each end at 100% on the status line, with their size and the time left.
    for step in ("binding the weights of encoder.onnx", "binding the weights of decoder.onnx", "writing weights.bin"):
        assert any(re.fullmatch(rf"{step}: 100% of \d+ MB, ~0 s left", m) for m in messages), (step, messages)


def _never(*args: object, **kwargs: object) -> bool:
    raise AssertionError("export --quantize wrote an fp32 weights.bin")


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_export_quantize_writes_what_export_then_quantize_write(
    form: str, tiny_hf_dir: Path, tiny_onnx_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnxmt.export.exporter import ExportOptions, export
    from onnxmt.export.quantize import QuantizeOptions, quantize
    from onnxmt.runtime.translator import Translator

    direct, parent = tmp_path / "direct" / "model", tmp_path / "direct"
    # No fp32 weights.bin is written on the way: the quantizer reads the weights where binding wrote them.
    monkeypatch.setattr("onnxmt.export.exporter.store_weights", _never)
    manifest, report = export(str(tiny_hf_dir), direct, ExportOptions(quantize=form), progress=lambda _: None)
    assert report is not None and report.worst < 1e-4  # the fp32 graphs were checked before quantizing
    two_steps = tmp_path / "two-steps"
    quantize(tiny_onnx_dir, two_steps, QuantizeOptions(int4=form == "int4"), progress=lambda _: None)
    assert manifest.quantization["method"] == read_manifest(two_steps).quantization["method"]
    assert (direct / "weights.bin").read_bytes() == (two_steps / "weights.bin").read_bytes()
    assert [p.name for p in parent.iterdir()] == ["model"]  # the fp32 directory is gone
    # ... and the provenance does not name its path as if it were still there
    kept = f"an fp32 export of {tiny_hf_dir} (export --quantize {form}; not kept)"
    assert manifest.provenance["quantized_from"] == kept
    texts = ["Where is the doctor?", "The river is long and the mountain is high"]
    expected = [t.token_ids for t in Translator(two_steps).translate(texts)]
    assert [t.token_ids for t in Translator(direct).translate(texts)] == expected
    with pytest.raises(ValueError, match="unknown quantization 'int2'; valid: int8, int8-rows, int4"):
        export(str(tiny_hf_dir), tmp_path / "bad", ExportOptions(quantize="int2"), progress=lambda _: None)


def test_an_unknown_default_target_names_the_valid_ones(tiny_multi_hf_dir: Path, tmp_path: Path) -> None:
    from onnxmt.export.exporter import ExportOptions, export

    with pytest.raises(ValueError, match=r"--default-target 'xx' is not a target language of this model; valid: .*"):
        export(str(tiny_multi_hf_dir), tmp_path / "out", ExportOptions(default_target="xx"), progress=lambda _: None)
    assert not (tmp_path / "out").exists()
