"""Directories exported by Optimum (three-file, merged, under `onnx/`) translate exactly like transformers' generate().

The exports are real `optimum-cli export onnx` outputs of `tiny_hf_dir`, made in a venv of their own (see
tests/helpers/optimum_env.py); the reference is transformers' generate() in this environment, on the same model.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from onnxmt.runtime.translator import Translator
from tests.helpers.hf import generated_ids
from tests.helpers.sentences import SENTENCES
from tests.helpers.skips import importorskip

torch = importorskip("torch")
transformers = importorskip("transformers")

# name: (texts, max_new_tokens); None leaves the model's max_length (64, so 63 new tokens). tests/helpers/sentences.py
# has outputs of many lengths on the tiny model (conftest checks it): SENTENCES[13] ends at eos after 8 tokens.
CASES = {
    "one-eos": ([SENTENCES[13]], None),
    "one-limit": ([SENTENCES[1]], 10),
    "batch": (SENTENCES, None),
    "batch-limit": (SENTENCES, 10),
}
MODEL_MAX_NEW_TOKENS = 63
LAYOUTS = ("optimum", "optimum-merged", "onnx-subfolder", "merged-only-onnx-subfolder")
# The graphs each layout must be read from.
GRAPH_FILES = {
    "optimum": {
        "encoder": "encoder_model.onnx",
        "decoder": "decoder_model.onnx",
        "decoder_with_past": "decoder_with_past_model.onnx",
    },
    "optimum-merged": {"encoder": "encoder_model.onnx", "decoder_merged": "decoder_model_merged.onnx"},
    "onnx-subfolder": {
        "encoder": "onnx/encoder_model.onnx",
        "decoder": "onnx/decoder_model.onnx",
        "decoder_with_past": "onnx/decoder_with_past_model.onnx",
    },
    "merged-only-onnx-subfolder": {
        "encoder": "onnx/encoder_model.onnx",
        "decoder_merged": "onnx/decoder_model_merged.onnx",
    },
}


def _in_onnx_subfolder(source: Path, out: Path, graphs: tuple[str, ...]) -> Path:
    """A copy of an export with only `graphs` kept, moved under `onnx/`, as many hub repositories lay them out."""
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("*.onnx"))
    (out / "onnx").mkdir()
    for name in graphs:
        shutil.copy2(source / name, out / "onnx" / name)
    return out


@pytest.fixture(scope="module", params=LAYOUTS)
def layout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    name = request.param
    if name == "optimum":
        return name, request.getfixturevalue("tiny_optimum_dir")
    if name == "optimum-merged":
        return name, request.getfixturevalue("tiny_optimum_merged_dir")
    out = tmp_path_factory.mktemp(name) / "model"
    if name == "onnx-subfolder":
        three = ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx")
        return name, _in_onnx_subfolder(request.getfixturevalue("tiny_optimum_dir"), out, three)
    merged = ("encoder_model.onnx", "decoder_model_merged.onnx")
    return name, _in_onnx_subfolder(request.getfixturevalue("tiny_optimum_merged_dir"), out, merged)


@pytest.fixture(scope="module")
def translator(layout: tuple[str, Path]) -> Translator:
    return Translator(layout[1])


@pytest.fixture(scope="module")
def reference(tiny_hf_dir: Path) -> Callable[[str, int], list[list[int]]]:
    """transformers' generate() token ids for a case: decoder start and trailing padding dropped, eos kept."""
    tokenizer = transformers.MarianTokenizer.from_pretrained(tiny_hf_dir)
    model = transformers.MarianMTModel.from_pretrained(tiny_hf_dir).eval()
    pad = model.generation_config.pad_token_id
    done: dict[tuple[str, int], list[list[int]]] = {}

    def generate(case: str, beams: int) -> list[list[int]]:
        if (case, beams) not in done:
            texts, max_new_tokens = CASES[case]
            encoded = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=64)
            with torch.no_grad():
                out = model.generate(**encoded, num_beams=beams, max_new_tokens=max_new_tokens)
            done[case, beams] = generated_ids(out, pad)
        return done[case, beams]

    return generate


def _manifest_layout(name: str) -> str:
    return "optimum" if "decoder" in GRAPH_FILES[name] else "optimum-merged"


def test_manifest_reads_the_optimum_graphs(translator: Translator, layout: tuple[str, Path]) -> None:
    name, _ = layout
    manifest = translator.manifest
    assert manifest.layout == _manifest_layout(name)
    assert {part: graph.file for part, graph in manifest.graphs.items()} == GRAPH_FILES[name]
    assert manifest.tokens["decoder_start"] == manifest.tokens["pad"]
    assert manifest.generation["num_beams"] == 4


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize("case", CASES)
def test_matches_transformers(translator: Translator, reference: Callable, case: str, beams: int) -> None:
    texts, max_new_tokens = CASES[case]
    expected = reference(case, beams)
    got = translator.translate(texts, beams=beams, max_new_tokens=max_new_tokens, batch_size=len(texts))
    assert [t.token_ids for t in got] == expected
    # The case tests what its name says: stopped by eos, cut at the limit, or (a batch) both.
    limit = max_new_tokens or MODEL_MAX_NEW_TOKENS
    lengths = {len(ids) for ids in expected}
    if case == "one-eos":
        assert max(lengths) < limit
    elif case == "one-limit":
        assert lengths == {limit}
    else:
        assert min(lengths) < limit and limit in lengths


def test_inspect_shows_the_optimum_layout(layout: tuple[str, Path]) -> None:
    from typer.testing import CliRunner

    from onnxmt.cli import app

    name, directory = layout
    result = CliRunner().invoke(app, ["inspect", str(directory)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert re.search(rf"layout\W+{_manifest_layout(name)}\W", result.output)
    for file in GRAPH_FILES[name].values():
        assert file in result.output
    assert "past_key_values.0.decoder.key" in result.output


def test_each_graph_is_loaded_once(tiny_optimum_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxmt.runtime.graphs as graphs
    import onnxmt.runtime.sessions as sessions
    import onnxmt.runtime.vocab as vocab

    loaded: list[str] = []
    real = sessions.load_session

    def counting(path: Path, options, encoder: bool = False):  # type: ignore[no-untyped-def]
        loaded.append(Path(path).name)
        return real(path, options, encoder=encoder)

    for module in (graphs, sessions, vocab):  # each module that opens sessions, and modeldir's (from sessions)
        monkeypatch.setattr(module, "load_session", counting)
    translator = Translator(tiny_optimum_dir)
    # The sessions opened to read the graphs' names are the ones that run them (plus the two vocabulary ops).
    onnx_files = [name for name in loaded if name.endswith("_model.onnx")]
    assert sorted(onnx_files) == ["decoder_model.onnx", "decoder_with_past_model.onnx", "encoder_model.onnx"]
    # The encoder runs without a memory arena (runtime/graphs.py load_session), the decoders with one.
    assert translator.graphs.encoder.get_session_options().enable_cpu_mem_arena is False
    assert translator.graphs.later.get_session_options().enable_cpu_mem_arena is True
    assert translator.translate(["a"], max_new_tokens=2)[0].token_ids
