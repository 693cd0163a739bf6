"""`Vocab`, the tokenizer's compact token <-> id table, against the dicts it replaces."""

from __future__ import annotations

import gc
import json
import os
import pickle
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from onnxmt.manifest import ModelDirError
from onnxmt.tokenization import sentencepiece as tokenizer_module
from onnxmt.tokenization.sentencepiece import Vocab, read_vocab


def _tokens(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcdefgh▁ßΩ中文字词🙂"
    tokens = {"", "<unk>", "</s>", ">>cmn_Hans<<"}
    while len(tokens) < n:
        tokens.add("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))))
    return sorted(tokens)


def _check_against_dict(mapping: dict[str, int], vocab: Vocab) -> None:
    assert len(vocab) == len(mapping)
    assert list(vocab) == list(mapping)  # the file's order
    for token, index in mapping.items():
        assert token in vocab and vocab[token] == index and vocab.get(token, -1) == index
    reverse = {i: t for t, i in mapping.items()}  # what transformers builds: the last token of an id wins
    for index in {i + step for i in mapping.values() for step in (-1, 0, 1)} | {-5, 2**40}:
        assert vocab.token(index) == reverse.get(index)
    for missing in ("not a token", "abcdefghabcdefgh", "中文字词中文字词", "<UNK>"):
        assert missing not in vocab and vocab.get(missing, -7) == -7
        with pytest.raises(KeyError):
            vocab[missing]
    assert 3 not in vocab  # not a string


def test_lookups_match_the_dicts() -> None:
    tokens = _tokens(3000)
    mapping = {t: i for i, t in enumerate(random.Random(1).sample(tokens, len(tokens)))}
    _check_against_dict(mapping, Vocab(mapping))


def test_duplicate_and_sparse_ids() -> None:
    tokens = _tokens(500, seed=2)
    rng = random.Random(3)
    # Ids with gaps, large values and many tokens sharing one id.
    mapping = {t: rng.choice([0, 1, 7, 7, 7, 10**12, rng.randint(0, 400)]) for t in tokens}
    _check_against_dict(mapping, Vocab(mapping))


def test_hash_collisions_compare_the_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    # With every token of one length sharing a hash, only the string comparison tells them apart.
    monkeypatch.setattr(tokenizer_module, "hash", len, raising=False)
    mapping = {t: i for i, t in enumerate(_tokens(800, seed=4))}
    _check_against_dict(mapping, Vocab(mapping))


def test_empty_vocab() -> None:
    vocab = Vocab({})
    assert len(vocab) == 0 and list(vocab) == [] and "a" not in vocab and vocab.token(0) is None


def test_much_smaller_than_the_dict() -> None:
    text = json.dumps({t: i for i, t in enumerate(_tokens(60000, seed=5))}, ensure_ascii=False)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        mapping = json.loads(text)
        as_dict = tracemalloc.get_traced_memory()[0] - before
        vocab = Vocab(mapping)
        del mapping  # what is left is what the tokenizer keeps
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(vocab) == 60000
    assert held < 0.4 * as_dict, (as_dict, held)


_UNPICKLE = """
import pickle, sys
vocab = pickle.loads(sys.stdin.buffer.read())
print(vocab.get("▁world", -1), "▁Hello" in vocab, vocab.token(2))
"""


def test_pickles_across_processes() -> None:
    # A Vocab keeps str hashes, which differ between processes: unpickling must rebuild them, not reuse them.
    vocab = Vocab({"▁Hello": 0, "▁world": 1, "<unk>": 2})
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    result = subprocess.run(
        [sys.executable, "-c", _UNPICKLE], input=pickle.dumps(vocab), capture_output=True, env=env, check=True
    )
    assert result.stdout.decode().split() == ["1", "True", "<unk>"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"a": 1, "b": true}', "token -> integer id"),
        ('{"a": 1, "b": "2"}', "token -> integer id"),
        ('{"a": 1, "b": 99999999999999999999999}', "does not fit in 64 bits"),
        ('["a", "b"]', "expected a JSON object"),
    ],
)
def test_bad_vocab_files_name_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "vocab.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ModelDirError, match=rf"vocab\.json: .*{message}"):
        read_vocab(path)
