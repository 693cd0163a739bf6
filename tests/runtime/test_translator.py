"""`Translator`: the library API, its inputs and its errors (no torch needed beyond the fixtures)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onnxmt import BatchLimits, CallOptions, DecodeOptions, ModelDirError, RuntimeOptions, Translation, Translator
from onnxmt.manifest import DECODER_FILE, MANIFEST_NAME, WEIGHTS_FILE
from onnxmt.runtime.cancel import CancelToken
from onnxmt.testing.marian import OPUS_MT_EN_ZH_TARGETS

TEXTS = ["Hello world.", "", "The river is long and the mountain is high", "   ", "a", "What is this?"]


@pytest.fixture(scope="module")
def translator(tiny_onnx_dir: Path) -> Translator:
    return Translator(tiny_onnx_dir, decoding=DecodeOptions(max_new_tokens=8))


def test_returns_dataclasses_in_input_order_with_empty_texts_kept(translator: Translator) -> None:
    results = translator.translate(TEXTS)
    assert len(results) == len(TEXTS)
    assert all(isinstance(r, Translation) for r in results)
    assert results[1] == Translation(text="", token_ids=[], score=0.0)
    assert results[3].text == "" and results[3].token_ids == []
    # Each non-empty text gets the translation it gets alone: sorting into batches does not mix them up.
    for text, result in zip(TEXTS, results, strict=True):
        if text.strip():
            assert result.token_ids and result.token_ids == translator.translate([text])[0].token_ids
            assert result.text == translator.tokenizer.decode(result.token_ids)


def test_batch_size_does_not_change_results(translator: Translator) -> None:
    one = translator.translate(TEXTS, batch_size=1, beams=4)
    many = translator.translate(TEXTS, batch_size=3, beams=4)
    assert [r.token_ids for r in one] == [r.token_ids for r in many]


def _count_encodes(translator: Translator, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every batch the translator encodes from now on (until the test ends)."""
    calls: list[int] = []
    encode = translator.graphs.encode

    def counted(ids, mask, **options):  # type: ignore[no-untyped-def]
        calls.append(len(ids))
        return encode(ids, mask, **options)

    monkeypatch.setattr(translator.graphs, "encode", counted)
    return calls


def test_cancelled_texts_are_never_started(translator: Translator, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_encodes(translator, monkeypatch)
    gone = CancelToken()
    gone.cancel()
    results = translator.translate(TEXTS, cancel=gone)
    assert calls == [] and all(r.cancelled or not r.text for r in results)
    assert [r.cancelled for r in results] == [bool(t.strip()) for t in TEXTS]
    # One token per text: only the live ones run, and they give what they give alone.
    tokens = [gone if i % 2 else CancelToken() for i in range(len(TEXTS))]
    mixed = translator.translate(TEXTS, cancel=tokens)
    assert [r.cancelled for r in mixed] == [bool(t.strip()) and i % 2 == 1 for i, t in enumerate(TEXTS)]
    assert [r.token_ids for r in mixed[::2]] == [r.token_ids for r in translator.translate(TEXTS[::2])]
    with pytest.raises(ValueError, match="one per text"):
        translator.translate(TEXTS, cancel=tokens[:2])


def test_a_deadline_cancels_the_work_at_the_next_step(translator: Translator) -> None:
    forced = {"beams": 4, "max_new_tokens": 64, "min_new_tokens": 64, "batch_size": 16}
    texts = [TEXTS[2]] * 16
    start = time.monotonic()
    full = translator.translate(texts, **forced)
    took = time.monotonic() - start
    start = time.monotonic()
    cut = translator.translate(texts, cancel=CancelToken.after(took / 10), **forced)
    assert time.monotonic() - start < took / 2
    assert all(r.cancelled and len(r.token_ids) < 64 for r in cut)
    assert not any(r.cancelled for r in full) and {len(r.token_ids) for r in full} == {64}


def test_cost_and_the_batch_budget(translator: Translator, monkeypatch: pytest.MonkeyPatch) -> None:
    lengths = [len(translator.tokenizer.encode(t)) for t in TEXTS if t.strip()]
    assert translator.cost(TEXTS, beams=4) == sum((n + 8) * 4 for n in lengths)
    assert translator.cost(TEXTS, beams=2, max_new_tokens=30) == sum((n + 30) * 2 for n in lengths)
    calls = _count_encodes(translator, monkeypatch)
    budget = max(lengths) * 2 + 8 * 2 * 2  # two of the longest texts at 2 beams
    reported: list[int] = []
    cut = translator.translate(TEXTS, beams=2, max_batch_cost=budget, on_batch=reported.append)
    assert calls and max(calls) <= 2 and sum(calls) == len(lengths)
    assert reported == calls  # on_batch is told each decoder batch the budget cut (the service's batch metrics)
    assert [r.token_ids for r in cut] == [r.token_ids for r in translator.translate(TEXTS, beams=2)]


def test_streaming_variant_yields_the_same_in_order(translator: Translator) -> None:
    texts = TEXTS * 7
    streamed = list(translator.translate_iter(iter(texts), batch_size=2))
    assert [r.token_ids for r in streamed] == [r.token_ids for r in translator.translate(texts)]


def test_keyword_arguments_override_options(translator: Translator) -> None:
    short = translator.translate(["The river is long and the mountain is high"], max_new_tokens=3)[0]
    assert len(short.token_ids) == 3
    with pytest.raises(TypeError, match="unknown decoding option"):
        translator.translate(["x"], beam=2)


def test_typed_options_are_what_keyword_arguments_give(translator: Translator) -> None:
    keywords = translator.translate(TEXTS, beams=2, max_new_tokens=5, batch_size=2)
    typed = translator.translate(TEXTS, options=DecodeOptions(beams=2, max_new_tokens=5), batching=BatchLimits(2))
    assert [t.token_ids for t in typed] == [t.token_ids for t in keywords]
    assert all(len(t.token_ids) <= 5 for t in typed)
    # Keyword arguments go over the typed options they come with.
    over = translator.translate(TEXTS, options=DecodeOptions(beams=2, max_new_tokens=20), max_new_tokens=5)
    assert [t.token_ids for t in over] == [t.token_ids for t in keywords]
    with pytest.raises(TypeError, match=r"\['batch_size'\]"):
        translator.prepare(TEXTS, batch_size=2)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ("hello", "not a single string"),
        ([1, "a"], r"texts\[0\] is int"),
        (None, "got NoneType"),
        (["a", None], r"texts\[1\]"),
    ],
)
def test_wrong_types_raise_type_error(translator: Translator, texts: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        translator.translate(texts)  # type: ignore[arg-type]


def test_a_lone_surrogate_is_a_value_error_naming_the_text(translator: Translator) -> None:
    # "\ud800" is legal in JSON and in a str, not text: sentencepiece would fail with a pybind11 cast error.
    message = r"texts\[1\] is not valid Unicode text: a lone surrogate '\\ud800' at position 1"
    with pytest.raises(ValueError, match=message):
        translator.translate(["fine", "a\ud800b"])
    with pytest.raises(ValueError, match="lone surrogate"):
        list(translator.translate_iter(["\udfff"]))
    assert translator.translate(["a\U0001f600b"], max_new_tokens=2)[0].text is not None  # a pair is text


def test_invalid_settings_raise_value_error(translator: Translator) -> None:
    with pytest.raises(ValueError, match="num_return_sequences"):
        translator.translate(["a"], beams=2, num_return_sequences=3)
    with pytest.raises(ValueError, match="batch_size"):
        translator.translate(["a"], batch_size=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        translator.translate(["a"], max_new_tokens=0)
    with pytest.warns(UserWarning, match="capped at 64"):  # more than the model's positions: capped, as transformers
        translator.translate(["a"], max_new_tokens=500)


def test_target_language(tiny_multi_onnx_dir: Path, translator: Translator) -> None:
    multi = Translator(tiny_multi_onnx_dir, decoding=DecodeOptions(max_new_tokens=6))
    assert multi.target_languages == sorted(OPUS_MT_EN_ZH_TARGETS)
    by_name = multi.translate(["Hello world."], target_lang="yue_Hant")[0]
    by_token = multi.translate(["Hello world."], target_lang=">>yue_Hant<<")[0]
    assert by_name == by_token
    assert by_name.token_ids != multi.translate(["Hello world."], target_lang="cmn_Hans")[0].token_ids
    # Codes as clients send them (onnxmt.languages): zh is Simplified Mandarin, zh-TW Traditional.
    simplified = multi.translate(["Hello world."], target_lang="cmn_Hans")
    assert multi.translate(["Hello world."], target_lang="zh") == simplified
    assert multi.target_token("zh-TW") == ">>cmn_Hant<<" and multi.target_token("zt") == ">>cmn_Hant<<"
    with pytest.raises(ValueError, match=r"unknown target language 'fra'; valid: zh \(cmn_Hans\), zt \(cmn_Hant\), "):
        multi.translate(["Hello"], target_lang="fra")
    with pytest.raises(ValueError, match="unknown target language"):
        multi.prepare(["Hello"], target_lang="fra")
    with pytest.raises(ValueError, match="single target language"):
        translator.translate(["Hello"], target_lang="yue_Hant")
    assert translator.target_token("zh") is None  # the single-target model's own language


def test_call_options_are_what_keyword_arguments_give(tiny_multi_onnx_dir: Path) -> None:
    multi = Translator(tiny_multi_onnx_dir, decoding=DecodeOptions(max_new_tokens=6))
    texts = ["Hello world.", "The river is long."]
    call = CallOptions(target_lang=["yue_Hant", "cmn_Hans"], options=DecodeOptions(beams=2, max_new_tokens=5))
    keywords = multi.translate(texts, target_lang=["yue_Hant", "cmn_Hans"], beams=2, max_new_tokens=5)
    assert multi.translate_prepared(multi.prepare(texts, call)) == keywords
    assert list(multi.translate_iter(iter(texts), call, batch_size=1)) == keywords
    assert multi.cost(texts, call) == sum(p.cost for p in multi.prepare(texts, call))
    # Keyword arguments go over the call's fields and its decoding options.
    over = multi.prepare(texts, call, target_lang="yue_Hant", max_new_tokens=3)
    assert [p.prompt for p in over] == [p.prompt for p in multi.prepare(texts, target_lang="yue_Hant")]
    assert {p.settings.num_beams for p in over} == {2} and {p.settings.max_length for p in over} == {4}
    with pytest.raises(ValueError, match="target_lang holds 2 codes for 1 texts"):
        multi.prepare(["Hello"], call)


@pytest.mark.filterwarnings("ignore:input of .* truncated")
def test_sources_are_truncated_at_the_model_positions(translator: Translator) -> None:
    # The tokenizer alone keeps MarianTokenizer's 512 (opus-mt names no length); the model has 64 positions.
    assert translator.manifest.model["max_positions"] == 64 == translator.tokenizer.model_max_length
    text = "the small river and the old house " * 80
    assert len(translator.tokenizer.encode(text)) == 64
    assert translator.translate([text], max_new_tokens=4)[0].token_ids


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def test_missing_file_is_named(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_onnx_dir, tmp_path)
    (model / "target.spm").unlink()
    with pytest.raises(ModelDirError, match="target.spm: file listed in onnxmt.json is missing"):
        Translator(model)


def test_truncated_graph_is_named(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_onnx_dir, tmp_path)
    data = (model / DECODER_FILE).read_bytes()
    (model / DECODER_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelDirError, match=r"decoder.onnx: \d+ bytes, the manifest says"):
        Translator(model)
    # Without the manifest's size and hash, the graph check (before ONNX Runtime) still names the file.
    manifest = json.loads((model / MANIFEST_NAME).read_text())
    del manifest["files"][DECODER_FILE]["bytes"]
    (model / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ModelDirError, match="decoder.onnx: not a readable ONNX graph"):
        Translator(model, RuntimeOptions(verify=False))


def test_corrupted_file_is_named(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    model = _copy(tiny_onnx_dir, tmp_path)
    data = bytearray((model / DECODER_FILE).read_bytes())
    data[-100] ^= 0xFF  # same size, one weight byte changed
    (model / DECODER_FILE).write_bytes(bytes(data))
    with pytest.raises(ModelDirError, match="decoder.onnx: sha256 does not match"):
        Translator(model)


def test_corrupted_weight_is_named_though_the_graphs_load(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    # A changed weight byte loads fine; the hashes, checked while the sessions are built, still refuse it.
    model = _copy(tiny_onnx_dir, tmp_path)
    data = bytearray((model / WEIGHTS_FILE).read_bytes())
    data[len(data) // 2] ^= 0x01
    (model / WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(ModelDirError, match="weights.bin: sha256 does not match"):
        Translator(model)
    assert Translator(model, RuntimeOptions(verify=False)).translate(["Hello world."], max_new_tokens=3)


def test_not_a_model_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="model directory not found"):
        Translator(tmp_path / "absent")
    with pytest.raises(ModelDirError, match="incomplete model directory: found nothing"):
        Translator(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ModelDirError, match="malformed manifest"):
        Translator(tmp_path)


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "optimum", "onnx"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import onnxmt
from onnxmt import Translator
from onnxmt.cli import app
from onnxmt.runtime import graphs, modeldir, running, scheduler, search, tokenizer, translator
t = Translator(sys.argv[1])
print(repr(t.translate(["Hello world.", ""], max_new_tokens=4)[0].text))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "onnx")))
"""


def test_run_side_never_imports_torch_or_transformers(tiny_onnx_dir: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", BLOCKER, str(tiny_onnx_dir)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"


def test_cli_translate_never_imports_torch(tiny_onnx_dir: Path) -> None:
    script = (
        BLOCKER.split("import onnxmt")[0]
        + "from onnxmt.cli import main\nsys.argv = ['onnxmt'] + sys.argv[1:]\nmain()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, "translate", "--model", str(tiny_onnx_dir), "--max-new-tokens", "3", "Hello"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 1
