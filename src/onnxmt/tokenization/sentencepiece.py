"""Marian tokenizer on sentencepiece and `vocab.json` alone, id-for-id equal to transformers' `MarianTokenizer`.

Encoding mirrors `tokenizer(text, truncation=True).input_ids`; decoding mirrors
`tokenizer.decode(ids, skip_special_tokens=True)`. Quirks of the original are kept on purpose, because the
exported model was trained and checked against them:

- no punctuation normalisation: `MarianTokenizer.normalize` (sacremoses) exists but `__call__` never calls it;
- special tokens written in the text (`</s>`, `<unk>`, `<pad>`) are split out before sentencepiece, and a
  `>>xx<<` code at the start of each remaining chunk becomes one token (unknown codes become `<unk>`);
- decoding skips every special id, `<unk>` included, and uses the *source* sentencepiece model unless the model
  has separate vocabularies.

This module is on the run side: it must never import torch or transformers.
"""

from __future__ import annotations

import bisect
import re
from array import array
from collections.abc import Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from ..manifest import ModelDirError
from .base import UNLIMITED, Truncating, clean_up_tokenization, read_json_object

__all__ = [
    "DEFAULT_FILES",
    "MarianTokenizer",
    "Vocab",
    "added_tokens_of",
    "load_spm",
    "read_vocab",
    "special_tokens_of",
]

SPIECE_UNDERLINE = "▁"

DEFAULT_FILES = {
    "source_spm": "source.spm",
    "target_spm": "target.spm",
    "vocab": "vocab.json",
    "target_vocab": "target_vocab.json",
    "config": "tokenizer_config.json",
    "special_tokens_map": "special_tokens_map.json",
}

# transformers' order of named special tokens: it decides the ids given to special tokens missing from the vocab.
_SPECIAL_ATTRIBUTES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_MARIAN_DEFAULTS = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
_MARIAN_MAX_LENGTH = 512  # MarianTokenizer.__init__ default when the config has no model_max_length


class Vocab:
    """`vocab.json` (token -> id) in a few flat arrays instead of dicts: 3 MB instead of 14 for opus-mt's 65k tokens.

    The tokens are slices of one string; a token's id is found by binary search of its hash among the sorted hashes
    of all tokens, an id's token by binary search among the sorted ids. A lookup costs about a microsecond, once
    per token of a text. Duplicate ids resolve like `{id: token for token, id in vocab.items()}`: the last wins.
    """

    def __init__(self, mapping: dict[str, int]) -> None:
        tokens = list(mapping)
        self._text = "".join(tokens)
        # Built with numpy (65k tokens: ~20 ms), kept as `array`s: indexing those from Python is what lookups do.
        lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        starts = np.concatenate([[0], np.cumsum(lengths)])
        ids = np.fromiter(mapping.values(), dtype=np.int64, count=len(tokens))
        hashes = np.fromiter(map(hash, tokens), dtype=np.int64, count=len(tokens))
        by_hash = np.argsort(hashes, kind="stable")
        # For each id, in increasing order, the position of the last token that has it.
        sorted_ids, first_from_end = np.unique(ids[::-1], return_index=True)
        fits = len(ids) == 0 or (ids.min() >= -(2**31) and ids.max() < 2**31)  # always, in real vocabularies
        self._starts = _array(starts, "i" if len(self._text) < 2**31 else "q")
        self._ids = _array(ids, "i" if fits else "q")
        self._hashes = _array(hashes[by_hash], "q")
        self._by_hash = _array(by_hash, "i")
        self._sorted_ids = _array(sorted_ids, self._ids.typecode)
        self._by_id = _array(len(ids) - 1 - first_from_end, "i")

    def __reduce__(self) -> tuple[type[Vocab], tuple[dict[str, int]]]:
        # Rebuilt on unpickling: the stored hashes are this process's (str hashes are salted per process).
        return Vocab, ({token: self._ids[i] for i, token in enumerate(self)},)

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        text, starts = self._text, self._starts
        return (text[a:b] for a, b in pairwise(starts))  # 65k tokens: ~5 ms, not 30

    def __contains__(self, token: object) -> bool:
        return isinstance(token, str) and self._find(token) >= 0

    def get(self, token: str, default: int) -> int:
        position = self._find(token)
        return default if position < 0 else self._ids[position]

    def __getitem__(self, token: str) -> int:
        position = self._find(token)
        if position < 0:
            raise KeyError(token)
        return self._ids[position]

    def token(self, index: int) -> str | None:
        """The token with this id (the last one in the file if several have it), or None."""
        at = bisect.bisect_left(self._sorted_ids, index)
        if at < len(self._sorted_ids) and self._sorted_ids[at] == index:
            return self._token(self._by_id[at])
        return None

    def _token(self, position: int) -> str:
        return self._text[self._starts[position] : self._starts[position + 1]]

    def _find(self, token: str) -> int:
        """Position of `token` in the file's order, or -1."""
        h = hash(token)
        at = bisect.bisect_left(self._hashes, h)
        while at < len(self._hashes) and self._hashes[at] == h:
            position = self._by_hash[at]
            if self._token(position) == token:
                return position
            at += 1
        return -1


def _array(values: np.ndarray, typecode: str) -> array:
    out = array(typecode)
    out.frombytes(values.astype(np.dtype(typecode)).tobytes())
    return out


class MarianTokenizer(Truncating):
    """Encode source text and decode target ids exactly as transformers' `MarianTokenizer` does."""

    def __init__(
        self,
        source_spm: spm.SentencePieceProcessor,
        target_spm: spm.SentencePieceProcessor,
        vocab: Vocab,
        target_vocab: Vocab | None,
        config: dict[str, Any],
        special_tokens: list[str],
        added_tokens: dict[str, int],
    ) -> None:
        self.separate_vocabs = target_vocab is not None
        self.source_lang: str | None = config.get("source_lang")
        self.target_lang: str | None = config.get("target_lang")
        self.model_max_length = _max_length(config)
        self.truncation_side: str = config.get("truncation_side", "right")
        self._clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self._source_spm = source_spm
        # decode's `use_source_tokenizer` defaults to `not separate_vocabs`: a shared vocab decodes with source.spm.
        self._decode_spm = target_spm if self.separate_vocabs else source_spm
        self._vocab = vocab
        # The vocab the model writes with; duplicate ids resolve like transformers (last wins).
        self._output_vocab = target_vocab or vocab
        self._added = added_tokens
        self._added_by_id = {i: t for t, i in added_tokens.items()}
        self._special_tokens = set(special_tokens)
        self._special_ids = {added_tokens[t] for t in special_tokens}
        self.unk_token = _named(config, "unk_token")
        self._vocab_unk = vocab[self.unk_token]  # what a piece missing from vocab.json becomes
        self.unk_id = added_tokens[self.unk_token]
        self.eos_id = added_tokens[_named(config, "eos_token")]
        self.pad_id = added_tokens[_named(config, "pad_token")]
        self.language_tokens = [] if self.separate_vocabs else [t for t in vocab if _is_language_code(t)]
        self._split_pattern = _split_pattern(list(added_tokens))
        self._warned_truncation = False

    @classmethod
    def from_dir(cls, directory: str | Path, files: dict[str, str] | None = None) -> MarianTokenizer:
        """Load from a model directory; `files` overrides file names by role (see `DEFAULT_FILES`)."""
        directory = Path(directory)
        names = {**DEFAULT_FILES, **(files or {})}
        config_path = directory / names["config"]
        config = read_json_object(config_path)
        special_map_path = directory / names["special_tokens_map"]
        # Like transformers: the legacy special_tokens_map.json counts only when the config lists no added tokens.
        if "added_tokens_decoder" not in config and special_map_path.is_file():
            config = {**config, **read_json_object(special_map_path)}
        vocab_path = directory / names["vocab"]
        vocab = read_vocab(vocab_path)
        target_vocab = read_vocab(directory / names["target_vocab"]) if config.get("separate_vocabs") else None
        special_tokens = special_tokens_of(config)
        if _named(config, "unk_token") not in vocab:
            raise ModelDirError(f"{vocab_path}: the unknown token {_named(config, 'unk_token')!r} is not in the vocab")
        added = added_tokens_of(config, special_tokens, vocab, config_path)
        sp_kwargs = config.get("sp_model_kwargs") or {}
        source = load_spm(directory / names["source_spm"], sp_kwargs)
        target = load_spm(directory / names["target_spm"], sp_kwargs)
        return cls(source, target, vocab, target_vocab, config, special_tokens, added)

    def _ids(self, text: str, target_token: str | None) -> list[int]:
        if target_token is not None:
            self._check_target_token(target_token)
            # Exactly what transformers sees for `tok(">>cmn_Hans<< " + text)`.
            text = f"{target_token} {text}"
        return [self._token_id(token) for token in self._tokenize(text)]

    def token_id(self, token: str) -> int:
        """The id of a token (an added or special one, or a vocab entry); KeyError when there is none."""
        if token in self._added:
            return self._added[token]
        if token in self._vocab:
            return self._vocab[token]
        raise KeyError(token)

    def encode_batch(self, texts: list[str], target_token: str | None = None) -> list[list[int]]:
        return [self.encode(text, target_token) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, skipping special ids (eos, pad, unk), like `decode(ids, skip_special_tokens=True)`."""
        tokens = [self._id_to_piece(int(i)) for i in ids if int(i) not in self._special_ids]
        text = self._join_pieces(tokens)
        return clean_up_tokenization(text) if self._clean_up_spaces else text

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def _check_target_token(self, token: str) -> None:
        if token in self.language_tokens:
            return
        if not self.language_tokens:
            raise ValueError(f"target token {token!r} given, but this model has no target language tokens")
        raise ValueError(f"unknown target token {token!r}; this model accepts: {', '.join(self.language_tokens)}")

    def _tokenize(self, text: str) -> list[str]:
        # Added (special) tokens are cut out of the raw text first; only the pieces between them see sentencepiece.
        tokens: list[str] = []
        for chunk in self._split_pattern.split(text) if self._split_pattern else [text]:
            if not chunk:
                continue
            if chunk in self._added:
                tokens.append(chunk)
                continue
            code, rest = self._split_code(chunk)
            tokens += code + self._source_spm.encode(rest, out_type=str)
        return tokens

    def _split_code(self, chunk: str) -> tuple[list[str], str]:
        return _split_language_code(chunk)

    def _token_id(self, token: str) -> int:
        if token in self._added:
            return self._added[token]
        # Marian ids are not sentencepiece ids, so a piece missing from vocab.json can only be unknown.
        return self._vocab.get(token, self._vocab_unk)

    def _id_to_piece(self, index: int) -> str:
        if index in self._added_by_id:
            return self._added_by_id[index]
        token = self._output_vocab.token(index)
        if token is not None:
            return token
        # transformers falls back to the sentencepiece id, which is meaningless for Marian but must be mirrored.
        piece = self._decode_spm.IdToPiece(index)
        return piece if piece else self.unk_token

    def _join_pieces(self, tokens: list[str]) -> str:
        # Special tokens that survive skipping (e.g. the unk fallback) are kept verbatim, followed by a space.
        out, pending = "", list[str]()
        for token in tokens:
            if token in self._special_tokens:
                out += self._decode_spm.decode_pieces(pending) + token + " "
                pending = []
            else:
                pending.append(token)
        out += self._decode_spm.decode_pieces(pending)
        return out.replace(SPIECE_UNDERLINE, " ").strip()


def _is_language_code(token: str) -> bool:
    return token.startswith(">>") and token.endswith("<<")


def _split_language_code(text: str) -> tuple[list[str], str]:
    """`>>xx<<rest` -> (['>>xx<<'], 'rest'); anything between the first `>>` and the next `<<` counts."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return [text[: end + 2]], text[end + 2 :]
    return [], text


def _split_pattern(tokens: list[str]) -> re.Pattern[str] | None:
    if not tokens:
        return None
    # Longest first, so that at any position the longest added token wins, as in transformers' trie.
    alternatives = "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))
    return re.compile(f"({alternatives})")


def _max_length(config: dict[str, Any]) -> int:
    value = config.get("model_max_length", _MARIAN_MAX_LENGTH)
    return UNLIMITED if value is None else int(value)


def token_text(value: Any) -> str | None:
    """A token from tokenizer_config.json: a plain string or a serialised AddedToken."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _named(config: dict[str, Any], attribute: str) -> str:
    token = token_text(config.get(attribute, _MARIAN_DEFAULTS.get(attribute)))
    if not token:
        raise ModelDirError(f"tokenizer_config.json: {attribute} is not set")
    return token


def special_tokens_of(config: dict[str, Any]) -> list[str]:
    """All special tokens in transformers' order: named ones, then extra ones; unique."""
    named = [token_text(config.get(a, _MARIAN_DEFAULTS.get(a))) for a in _SPECIAL_ATTRIBUTES]
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    tokens = named + [token_text(t) for t in extra] if isinstance(extra, list) else named
    return list(dict.fromkeys(t for t in tokens if t))


def added_tokens_of(
    config: dict[str, Any], special_tokens: list[str], vocab: Vocab, config_path: Path
) -> dict[str, int]:
    """Tokens split out of the text before sentencepiece, with their ids, as transformers registers them."""
    added: dict[str, int] = {}
    for index, entry in (config.get("added_tokens_decoder") or {}).items():
        if any(entry.get(flag) for flag in ("lstrip", "rstrip", "single_word")):
            raise ModelDirError(f"{config_path}: added token {entry.get('content')!r} strips spaces; not supported")
        added[entry["content"]] = int(index)
    # Special tokens missing from the vocab get the next free ids, counted over vocab plus added tokens.
    next_id = len(vocab) + sum(token not in vocab for token in added)
    for token in special_tokens:
        if token in added:
            continue
        if token in vocab:
            added[token] = vocab[token]
        else:
            added[token] = next_id
            next_id += 1
    return added


def read_vocab(path: Path) -> Vocab:
    vocab = read_json_object(path)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in vocab.values()):
        raise ModelDirError(f"{path}: expected a JSON object of token -> integer id")
    try:
        return Vocab(vocab)
    except OverflowError as e:
        raise ModelDirError(f"{path}: a token id does not fit in 64 bits ({e})") from e


def load_spm(path: Path, kwargs: dict[str, Any]) -> spm.SentencePieceProcessor:
    if not path.is_file():
        raise ModelDirError(f"{path}: file not found")
    try:
        return spm.SentencePieceProcessor(model_proto=path.read_bytes(), **kwargs)
    except (RuntimeError, OSError) as e:
        raise ModelDirError(f"{path}: not a valid sentencepiece model ({e})") from e
