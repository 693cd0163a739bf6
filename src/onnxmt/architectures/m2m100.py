"""M2M100 and NLLB-200 (`model_type` m2m_100): one model, two tokenizers.

The model (export/m2m100.py): pre-layer-norm with a final layer norm after the encoder's and the decoder's last
layer; sinusoidal positions offset by 2 (padding_idx + 1) and counted over non-pad tokens only; embeddings scaled
by sqrt(d_model); the LM head tied to the shared embedding and without `final_logits_bias`; decoder start `</s>`.

Languages (`language_tokens` scheme): the source is `[src_lang] X </s>`, and the target language is the first
generated token, forced (transformers' `forced_bos_token_id`: the model's generation config does not set it, the
caller does).
- NLLB-200 ships `tokenizer.json` (what transformers 5 runs), read here with the `tokenizers` library; its codes are
  FLORES-200's (`eng_Latn`, `zho_Hans`), tokens of their own name. `legacy_behaviour: true` in its tokenizer config
  moves the source token after the eos: `X </s> [src_lang]`.
- M2M100 ships `vocab.json` + `sentencepiece.bpe.model`; its codes (`en`, `zh`) have tokens `__en__`, whose ids come
  after the vocab.json ids (`len(vocab) + i`, in the order below), not from the sentencepiece model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..tokenization import JsonTokenizer, MarianTokenizer
from ..tokenization.base import read_json_object
from ..tokenization.sentencepiece import (
    DEFAULT_FILES,
    added_tokens_of,
    load_spm,
    read_vocab,
    special_tokens_of,
    token_text,
)
from .base import Architecture, read_json, register
from .marian import bart_facts
from .schemes import LanguageTokens

# transformers' tokenization_m2m_100.FAIRSEQ_LANGUAGE_CODES, chosen by tokenizer_config.json `language_codes`.
M2M100_LANGUAGE_CODES = {
    "m2m100": (
        "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi hr ht "
        "hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns oc or pa pl ps "
        "pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu"
    ).split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}
_FLORES_CODE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")  # NLLB's codes: eng_Latn


class M2M100(Architecture):
    name = "m2m_100"
    tokenizer_kind = "m2m100"
    tokenizer_files: tuple[str, ...] = ("vocab.json", "sentencepiece.bpe.model", "tokenizer_config.json")
    optional_tokenizer_files = ("special_tokens_map.json",)
    build_hooks = "onnxmt.export.m2m100"

    def for_source(self, source: Path) -> Architecture:
        # NLLB checkpoints are m2m_100 models with a tokenizer.json (and NllbTokenizer named in their configs).
        return Nllb() if (source / "tokenizer.json").is_file() else self

    def facts(self, config: dict[str, Any]) -> dict[str, Any]:
        return bart_facts(config)

    def unk_id(self, source: Path) -> int | None:
        return read_json(source / "vocab.json").get("<unk>")

    def load_tokenizer(self, directory: Path) -> MarianTokenizer | JsonTokenizer:
        listed = str(read_json(directory / "tokenizer_config.json").get("language_codes", "m2m100"))
        return M2M100Tokenizer.from_dir(directory, language_codes=M2M100_LANGUAGE_CODES.get(listed, []))

    def language_tokens(self, source: Path) -> dict[str, str]:
        codes = M2M100_LANGUAGE_CODES[read_json(source / "tokenizer_config.json").get("language_codes", "m2m100")]
        return {code: f"__{code}__" for code in codes}

    def default_source(self) -> str:
        return "en"  # M2M100Tokenizer's when src_lang is not set

    def languages(self, source: Path, default_target: str | None) -> dict[str, Any]:
        config = read_json(source / "tokenizer_config.json")
        tokens = self.language_tokens(source)
        if default_target is not None and default_target not in tokens:
            raise ValueError(
                f"--default-target {default_target!r} is not a language of this model; valid: {', '.join(tokens)}"
            )
        return {
            "scheme": LanguageTokens.name,
            "source": None,
            "target": None,
            "source_tokens": tokens,
            "target_tokens": tokens,
            "default_source": config.get("src_lang") or self.default_source(),
            "default_target": default_target or config.get("tgt_lang"),
            "source_token_last": bool(config.get("legacy_behaviour", False)),
            "eos_token": _content(config.get("eos_token", "</s>")),
        }


class Nllb(M2M100):
    tokenizer_kind = "tokenizers"
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json")
    optional_tokenizer_files = ("special_tokens_map.json",)

    def load_tokenizer(self, directory: Path) -> JsonTokenizer:
        return JsonTokenizer.from_dir(directory)

    def unk_id(self, source: Path) -> int | None:
        vocab = read_json(source / "tokenizer.json").get("model", {}).get("vocab", {})
        return vocab.get("<unk>") if isinstance(vocab, dict) else None

    def default_source(self) -> str:
        return "eng_Latn"  # NllbTokenizer's when src_lang is not set

    def language_tokens(self, source: Path) -> dict[str, str]:
        """The codes the tokenizer config lists as extra special tokens, else the added tokens of tokenizer.json
        that look like FLORES-200 codes (what NllbTokenizer adds by default)."""
        config = {**read_json(source / "special_tokens_map.json"), **read_json(source / "tokenizer_config.json")}
        listed = config.get("extra_special_tokens") or config.get("additional_special_tokens")
        if isinstance(listed, list) and listed:
            codes = [_content(t) for t in listed]
        else:
            added = read_json(source / "tokenizer.json").get("added_tokens", [])
            codes = [t["content"] for t in added if _FLORES_CODE.match(t.get("content", ""))]
        return {code: code for code in codes if code}


register("m2m_100", variants=(Nllb,))(M2M100)


class M2M100Tokenizer(MarianTokenizer):
    """transformers' `M2M100Tokenizer`: one sentencepiece model and `vocab.json`, language tokens `__en__` at ids
    after the vocab (`len(vocab) + i`, in the order of the model's language-code list), no `>>xx<<` codes in the
    text, and special tokens that survive decoding joined without a space."""

    @classmethod
    def from_dir(
        cls, directory: str | Path, files: dict[str, str] | None = None, *, language_codes: Sequence[str] = ()
    ) -> MarianTokenizer:
        """`language_codes`: the model's, in transformers' order (M2M100_LANGUAGE_CODES)."""
        spm_name = "sentencepiece.bpe.model"
        names = {**DEFAULT_FILES, "source_spm": spm_name, "target_spm": spm_name, **(files or {})}
        directory = Path(directory)
        config = read_json_object(directory / names["config"])
        special_map_path = directory / names["special_tokens_map"]
        if "added_tokens_decoder" not in config and special_map_path.is_file():
            config = {**config, **read_json_object(special_map_path)}
        vocab = read_vocab(directory / names["vocab"])
        languages = {f"__{code}__": len(vocab) + i for i, code in enumerate(language_codes)}
        listed = [token_text(t) for t in (config.get("additional_special_tokens") or [])]
        config = {**config, "additional_special_tokens": list(dict.fromkeys([*listed, *languages]))}
        special_tokens = special_tokens_of(config)
        added = {**added_tokens_of(config, special_tokens, vocab, directory / names["config"]), **languages}
        sp = load_spm(directory / names["source_spm"], config.get("sp_model_kwargs") or {})
        return cls(sp, sp, vocab, None, config, special_tokens, added)

    def _split_code(self, chunk: str) -> tuple[list[str], str]:
        return [], chunk

    def _id_to_piece(self, index: int) -> str:
        if index in self._added_by_id:
            return self._added_by_id[index]
        token = self._output_vocab.token(index)
        return self.unk_token if token is None else token

    def _join_pieces(self, tokens: list[str]) -> str:
        out, pending = "", list[str]()
        for token in tokens:
            if token in self._special_tokens:
                out += self._decode_spm.decode(pending) + token
                pending = []
            else:
                pending.append(token)
        return (out + self._decode_spm.decode(pending)).strip()


def _content(token: Any) -> str:
    """A token as tokenizer configs write it: a string or a serialised AddedToken."""
    return str(token.get("content", "")) if isinstance(token, dict) else str(token)
