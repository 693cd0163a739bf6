"""Parity of onnxmt's torch-free Marian tokenizer with transformers' `MarianTokenizer`."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from onnxmt.manifest import ModelDirError
from onnxmt.testing.marian import OPUS_MT_EN_ZH_TARGETS
from onnxmt.tokenization import MarianTokenizer
from tests.helpers.skips import importorskip, shared_data

CORPORA = ("flores200/devtest.eng_Latn", "tatoeba/test-v2021-08-07.eng")
CHINESE = "flores200/devtest.zho_Hans"

EDGE_CASES = [
    "",
    "   ",
    " \t\n ",
    "Hello world.",
    "  leading and trailing spaces  ",
    "Wait... what?!? (Really) -- yes; no: [maybe] {ok} <tag> #1 @x $5 100% a&b *c* ~d~",
    "“Curly quotes” and ‘single’ ones — em dash – en dash … ellipsis «guillemets» „low“",
    "Full-width：，。！？ and non-breaking\u00a0space, zero\u200bwidth",
    "Unknown characters: ☃ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🙂 ü ß ñ Ω",
    ">>cmn_Hans<< hello world",
    ">>cmn_Hans<<hello",
    ">>xx_Unknown<< hello",
    ">> spaced << code",
    "hello >>cmn_Hans<< in the middle",
    "Special tokens typed in: </s> <unk> <pad> inside the text",
    "a</s>>>cmn_Hans<<b",
    "<pad>",
]


def _transformers_tokenizer(directory: Path) -> Any:
    transformers = importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses." when it is absent
        return transformers.MarianTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module", params=["tiny_hf_dir", "tiny_multi_hf_dir"])
def pair(request: pytest.FixtureRequest) -> tuple[MarianTokenizer, Any]:
    """(ours, transformers') for the single- and the multi-target fixture."""
    directory = request.getfixturevalue(request.param)
    return MarianTokenizer.from_dir(directory), _transformers_tokenizer(directory)


@pytest.fixture(scope="module")
def multi(tiny_multi_hf_dir: Path) -> tuple[MarianTokenizer, Any]:
    return MarianTokenizer.from_dir(tiny_multi_hf_dir), _transformers_tokenizer(tiny_multi_hf_dir)


def _lines(relative: str, count: int) -> list[str]:
    return shared_data(relative).read_text(encoding="utf-8").splitlines()[:count]


def _copy(directory: Path, tmp_path: Path) -> Path:
    """A private copy of a session fixture directory, safe to break."""
    return Path(shutil.copytree(directory, tmp_path / directory.name))


def _hf_ids(hf: Any, text: str) -> list[int]:
    return list(hf(text, truncation=True).input_ids)


@pytest.mark.filterwarnings("ignore:input of .* truncated")
def test_encode_matches_transformers_on_edge_cases(pair: tuple[MarianTokenizer, Any]) -> None:
    ours, hf = pair
    for text in EDGE_CASES:
        assert ours.encode(text) == _hf_ids(hf, text), text


def test_encode_does_not_normalise_punctuation(pair: tuple[MarianTokenizer, Any]) -> None:
    # MarianTokenizer.normalize (sacremoses) is never called by __call__: curly quotes stay unknown pieces.
    ours, hf = pair
    text = "“quoted”"
    assert ours.encode(text) == _hf_ids(hf, text)
    assert ours.unk_id in ours.encode(text)


def test_empty_and_blank_text_encode_to_eos_only(pair: tuple[MarianTokenizer, Any]) -> None:
    ours, _ = pair
    assert ours.encode("") == [ours.eos_id]
    assert ours.encode("   ") == [ours.eos_id]


@pytest.mark.parametrize("corpus", CORPORA)
@pytest.mark.filterwarnings("ignore:input of .* truncated")
def test_encode_matches_transformers_on_corpus(pair: tuple[MarianTokenizer, Any], corpus: str) -> None:
    ours, hf = pair
    lines = _lines(corpus, 300)
    assert ours.encode_batch(lines) == [list(ids) for ids in hf(lines, truncation=True).input_ids]


def test_long_text_is_truncated_with_eos_last_and_warns_once(pair: tuple[MarianTokenizer, Any]) -> None:
    _, hf = pair
    ours = MarianTokenizer.from_dir(hf.name_or_path)  # fresh: the shared one may have warned already
    # opus-mt's tokenizer_config.json names no model_max_length: MarianTokenizer's 512 applies, here as there (the
    # Translator lowers it to the model's positions: test_translator.py).
    text = "the small river and the old house " * 80
    with pytest.warns(UserWarning, match="truncated to model_max_length=512"):
        ids = ours.encode(text)
    assert ids == _hf_ids(hf, text)
    assert len(ids) == ours.model_max_length == 512
    assert ids[-1] == ours.eos_id
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ours.encode(text) == ids


def test_special_ids_match_transformers(pair: tuple[MarianTokenizer, Any]) -> None:
    ours, hf = pair
    assert (ours.eos_id, ours.pad_id, ours.unk_id) == (hf.eos_token_id, hf.pad_token_id, hf.unk_token_id)
    assert ours.model_max_length == hf.model_max_length


def test_language_tokens(tiny_hf_dir: Path, multi: tuple[MarianTokenizer, Any]) -> None:
    assert MarianTokenizer.from_dir(tiny_hf_dir).language_tokens == []
    assert multi[0].language_tokens == [f">>{lang}<<" for lang in OPUS_MT_EN_ZH_TARGETS]


def test_decode_matches_transformers_on_random_ids(pair: tuple[MarianTokenizer, Any]) -> None:
    ours, hf = pair
    rng = random.Random(0)
    vocab_ids = list(range(len(hf.encoder)))
    language_ids = [hf.encoder[t] for t in ours.language_tokens]
    specials = [ours.eos_id, ours.pad_id, ours.unk_id, *language_ids]
    batch = [
        [rng.choice(specials) if rng.random() < 0.3 else rng.choice(vocab_ids) for _ in range(rng.randint(0, 30))]
        for _ in range(300)
    ]
    batch += [[], [ours.eos_id], [ours.pad_id, ours.pad_id], [ours.unk_id], language_ids]
    assert ours.decode_batch(batch) == hf.batch_decode(batch, skip_special_tokens=True)
    for ids in batch[:20]:
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_decode_out_of_range_id_raises_like_transformers(pair: tuple[MarianTokenizer, Any]) -> None:
    ours, hf = pair
    beyond = len(hf.encoder) + 1000
    with pytest.raises(IndexError):
        hf.decode([beyond], skip_special_tokens=True)
    with pytest.raises(IndexError, match="out of range"):
        ours.decode([beyond])


def test_decode_round_trips_chinese_like_transformers(pair: tuple[MarianTokenizer, Any]) -> None:
    ours, hf = pair
    lines = _lines(CHINESE, 200)
    # Target-side ids, as the model would produce them (target.spm pieces looked up in vocab.json).
    batch = [list(ids) for ids in hf(text_target=lines).input_ids]
    assert ours.decode_batch(batch) == hf.batch_decode(batch, skip_special_tokens=True)


def test_target_token_is_prepended_like_a_typed_language_code(multi: tuple[MarianTokenizer, Any]) -> None:
    ours, hf = multi
    for token in ours.language_tokens:
        for text in ["Hello world.", "", "  spaced  ", ">>yue_Hant<< already coded", "the river " * 40]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # truncation warning for the long text
                ids = ours.encode(text, target_token=token)
            assert ids == _hf_ids(hf, f"{token} {text}"), (token, text)
            assert ids[0] == hf.encoder[token]
    batch = ["a b", "c"]
    assert ours.encode_batch(batch, ">>yue_Hant<<") == [ours.encode(t, ">>yue_Hant<<") for t in batch]


def test_unknown_target_token_lists_valid_ones(multi: tuple[MarianTokenizer, Any]) -> None:
    with pytest.raises(ValueError, match=r"'>>deu<<'.*>>cjy_Hans<<, .*>>cmn_Hans<<, .*>>yue_Hant<<$"):
        multi[0].encode("hello", target_token=">>deu<<")


def test_target_token_on_single_target_model_raises(tiny_hf_dir: Path) -> None:
    with pytest.raises(ValueError, match="no target language tokens"):
        MarianTokenizer.from_dir(tiny_hf_dir).encode("hello", target_token=">>cmn_Hans<<")


@pytest.mark.filterwarnings("ignore:input of .* truncated")
def test_loads_a_directory_saved_by_transformers(tiny_multi_hf_dir: Path, tmp_path: Path) -> None:
    # save_pretrained writes added_tokens_decoder into tokenizer_config.json.
    hf = _transformers_tokenizer(tiny_multi_hf_dir)
    hf.save_pretrained(tmp_path)
    ours = MarianTokenizer.from_dir(tmp_path)
    for text in EDGE_CASES:
        assert ours.encode(text) == _hf_ids(hf, text), text


def test_pad_missing_from_vocab_gets_next_id_like_transformers(tiny_hf_dir: Path, tmp_path: Path) -> None:
    directory = _copy(tiny_hf_dir, tmp_path)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    del vocab["<pad>"]
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    ours, hf = MarianTokenizer.from_dir(directory), _transformers_tokenizer(directory)
    assert ours.pad_id == hf.pad_token_id == len(vocab)
    text = "hello <pad> world"
    assert ours.encode(text) == _hf_ids(hf, text)
    ids = [ours.pad_id, 5, ours.eos_id]
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_ids_missing_from_vocab_fall_back_to_sentencepiece(tiny_hf_dir: Path, tmp_path: Path) -> None:
    # A hole in vocab.json: transformers decodes that id with the source spm's piece of the same number.
    directory = _copy(tiny_hf_dir, tmp_path)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    removed = [token for token, index in vocab.items() if 20 <= index < 40]
    for token in removed:
        del vocab[token]
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    ours, hf = MarianTokenizer.from_dir(directory), _transformers_tokenizer(directory)
    batch = [list(range(15, 45)), [25, 0, 30]]
    assert ours.decode_batch(batch) == hf.batch_decode(batch, skip_special_tokens=True)
    text = " ".join(t.lstrip("▁") for t in removed)
    assert ours.encode(text) == _hf_ids(hf, text)


@pytest.mark.filterwarnings("ignore:input of .* truncated")
def test_separate_vocabs_decode_with_target_vocab_and_spm(tiny_hf_dir: Path, tmp_path: Path) -> None:
    directory = _copy(tiny_hf_dir, tmp_path)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    # A target vocab with different ids, so decoding with the wrong vocab cannot pass.
    tokens = sorted(vocab, key=vocab.__getitem__)
    target = {token: i for i, token in enumerate(tokens[:2] + tokens[2:-1][::-1] + tokens[-1:])}
    (directory / "target_vocab.json").write_text(json.dumps(target, ensure_ascii=False), encoding="utf-8")
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "separate_vocabs": True}), encoding="utf-8")
    ours, hf = MarianTokenizer.from_dir(directory), _transformers_tokenizer(directory)
    assert ours.language_tokens == []
    lines = ["Hello world.", *EDGE_CASES]
    assert ours.encode_batch(lines) == [list(ids) for ids in hf(lines, truncation=True).input_ids]
    batch = [list(range(i, i + 25)) for i in range(0, len(vocab) - 25, 7)]
    assert ours.decode_batch(batch) == hf.batch_decode(batch, skip_special_tokens=True)


def test_missing_vocab_names_the_file(tiny_hf_dir: Path, tmp_path: Path) -> None:
    directory = _copy(tiny_hf_dir, tmp_path)
    (directory / "vocab.json").unlink()
    with pytest.raises(ModelDirError, match=r"vocab\.json: file not found"):
        MarianTokenizer.from_dir(directory)


def test_corrupted_source_spm_names_the_file(tiny_hf_dir: Path, tmp_path: Path) -> None:
    directory = _copy(tiny_hf_dir, tmp_path)
    (directory / "source.spm").write_bytes(b"not a sentencepiece model")
    with pytest.raises(ModelDirError, match=r"source\.spm: not a valid sentencepiece model"):
        MarianTokenizer.from_dir(directory)


def test_corrupted_config_names_the_file(tiny_hf_dir: Path, tmp_path: Path) -> None:
    directory = _copy(tiny_hf_dir, tmp_path)
    (directory / "tokenizer_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelDirError, match=r"tokenizer_config\.json: not valid JSON"):
        MarianTokenizer.from_dir(directory)


def test_custom_file_names(tiny_hf_dir: Path, tmp_path: Path) -> None:
    directory = _copy(tiny_hf_dir, tmp_path)
    (directory / "source.spm").rename(directory / "src.model")
    tokenizer = MarianTokenizer.from_dir(directory, files={"source_spm": "src.model"})
    assert tokenizer.encode("hello") == MarianTokenizer.from_dir(tiny_hf_dir).encode("hello")


_WITHOUT_TORCH = """
import importlib.abc
import sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "transformers"):
            raise ImportError(f"{name} is blocked: the run side must not import it")
        return None

sys.meta_path.insert(0, Block())
from onnxmt.tokenization import MarianTokenizer

tokenizer = MarianTokenizer.from_dir(sys.argv[1])
ids = tokenizer.encode("hello world")
assert ids[-1] == tokenizer.eos_id, ids
print(tokenizer.decode(ids))
"""


def test_imports_without_torch_or_transformers(tiny_hf_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, str(tiny_hf_dir)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hello world"


def test_a_special_token_decoded_from_the_target_vocab_is_kept_verbatim_like_transformers(
    tiny_hf_dir: Path, tmp_path: Path
) -> None:
    """Special ids are skipped by their source-vocab ids, as transformers skips them: in a target vocab where
    `<unk>` has another id, that id is not skipped, and its piece is written as it is, followed by a space, between
    the texts of the pieces around it (MarianTokenizer.convert_tokens_to_string)."""
    directory = _copy(tiny_hf_dir, tmp_path)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    tokens = sorted(vocab, key=vocab.__getitem__)
    moved = tokens.index("<unk>")
    tokens[moved], tokens[10] = tokens[10], tokens[moved]  # <unk> at 10 in the target vocab only
    (directory / "target_vocab.json").write_text(
        json.dumps({token: i for i, token in enumerate(tokens)}, ensure_ascii=False), encoding="utf-8"
    )
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "separate_vocabs": True}), encoding="utf-8")
    ours, hf = MarianTokenizer.from_dir(directory), _transformers_tokenizer(directory)
    assert ours.unk_id != 10
    batch = [[30, 10, 31], [10], [10, 10], [40, 41, 10], [10, 50, ours.eos_id], [ours.unk_id, 10, 60]]
    decoded = ours.decode_batch(batch)
    assert decoded == hf.batch_decode(batch, skip_special_tokens=True)
    assert all("<unk>" in text for text in decoded)  # the special path ran for each
