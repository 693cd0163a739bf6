"""How a family is told which languages to translate between, applied in one place for every caller.

A scheme turns (source language, target language) into a `Prompt`: text put before the source text, token ids put
around its tokens instead of the tokenizer's default `... </s>`, and the token forced first in the output. The
Translator (and through it validate, eval and serve) encodes every text through its scheme; the decoding loop only
sees the forced token, as a logits processor (runtime/search.py `ForcedBos`), one per row so that a batch can
mix target languages.

- `target_token_prefix`: multi-target Marian (opus-mt-en-zh): `>>cmn_Hans<<` written before the text, which the
  tokenizer turns into one token. Single-target Marian uses it too, with no tokens (an empty prompt).
- `language_tokens`: NLLB-200 and M2M100: `[src_lang] X </s>` (NLLB's `legacy_behaviour`: `X </s> [src_lang]`), and
  the decoder starts `</s> [tgt_lang]` through the forced first token (transformers' `forced_bos_token_id`).
- A text prefix (T5's `translate English to German: `) is the extension point left open: a scheme whose prompt
  has only `text`; no registered architecture needs it yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..languages import ModelLanguages

TokenId = Callable[[str], int]  # a token's id in the model's vocabulary (the tokenizer's, for added tokens)


@dataclass(frozen=True)
class Prompt:
    text: str = ""  # put before the source text
    prefix: tuple[int, ...] = ()  # ids before the source tokens
    suffix: tuple[int, ...] | None = None  # ids after them; None: the tokenizer's default (eos)
    forced_bos: int | None = None  # the first generated token, forced
    # A decoder-only model's request: (source code or None, target code), rendered around the text through the
    # model's chat template (runtime/decoder_only.py `Prompts`) instead of the fields above; with a glossary of
    # (source term, target term) pairs or a context, for a family with prompts for them (HY-MT's). Tuples: a
    # prompt is hashable (the service's cache keys on it).
    chat: tuple[str | None, str] | None = None
    glossary: tuple[tuple[str, str], ...] = ()
    context: str | None = None


class LanguageScheme:
    name = ""

    def __init__(self, languages: dict[str, Any], token_id: TokenId) -> None:
        self.languages = ModelLanguages(languages)
        self._token_id = token_id

    def prompt(self, source_lang: str | None, target_lang: str | None) -> Prompt:
        raise NotImplementedError

    def resolve_target(self, target_lang: str | None) -> str | None:
        """The model's code for a client's target code (ValueError naming the valid ones), or None."""
        return self.languages.resolve_target(target_lang)


class TargetTokenPrefix(LanguageScheme):
    name = "target_token_prefix"

    def prompt(self, source_lang: str | None, target_lang: str | None) -> Prompt:
        # The source language is the model's only one: a wrong one is an error, no code is fine.
        self.languages.resolve_source(source_lang)
        lang = self.languages.resolve_target(target_lang)
        # Exactly what transformers sees for `tok(">>cmn_Hans<< " + text)`.
        return Prompt(text=f"{self.languages.tokens[lang]} ") if lang is not None else Prompt()


class LanguageTokens(LanguageScheme):
    name = "language_tokens"

    def __init__(self, languages: dict[str, Any], token_id: TokenId) -> None:
        super().__init__(languages, token_id)
        self.suffix_source = bool(languages.get("source_token_last"))
        self._eos = token_id(str(languages.get("eos_token", "</s>")))
        # Resolved once: a token the tokenizer does not know fails at load, naming it.
        self._ids = {t: token_id(t) for t in (*self.languages.source_tokens.values(), *self.languages.tokens.values())}

    def prompt(self, source_lang: str | None, target_lang: str | None) -> Prompt:
        source = self.languages.resolve_source(source_lang)
        if source is None:
            raise ValueError(f"this model needs a source language; valid: {self.languages.valid_sources()}")
        target = self.languages.resolve_target(target_lang)
        if target is None:
            valid = self.languages.valid(self.languages.targets)
            raise ValueError(f"this model needs a target language; valid: {valid}")
        src, eos = self._ids[self.languages.source_tokens[source]], self._eos
        forced = self._ids[self.languages.tokens[target]]
        if self.suffix_source:
            return Prompt(suffix=(eos, src), forced_bos=forced)
        return Prompt(prefix=(src,), suffix=(eos,), forced_bos=forced)


class ChatTemplatePrompt(LanguageScheme):
    """Decoder-only translators: the whole prompt is the model's chat template around the family's request
    (architectures/decoder_only.py `render_prompt`), not text and ids around the source's tokens."""

    name = "chat_template"

    def __init__(self, languages: dict[str, Any], token_id: TokenId) -> None:
        super().__init__(languages, token_id)
        self.needs_source = languages.get("prompt") == "translategemma"

    def prompt(self, source_lang: str | None, target_lang: str | None) -> Prompt:
        """The language pair as the family's table names it (a client's `zh-TW` is `zh-Hant`, `pb` is `pt-BR`:
        onnxmt.languages); the text is rendered around it later. TranslateGemma's template takes the source
        language, so it needs one; the other families only tell a Chinese source apart (none: not Chinese)."""
        source = self.languages.resolve_source(source_lang)
        target = self.languages.resolve_target(target_lang)
        if target is None:
            raise ValueError(
                f"this model needs a target language; valid: {self.languages.valid(self.languages.targets)}"
            )
        if source is None and self.needs_source:
            raise ValueError(f"this model needs a source language; valid: {self.languages.valid_sources()}")
        return Prompt(chat=(source, target))


SCHEMES: dict[str, type[LanguageScheme]] = {s.name: s for s in (TargetTokenPrefix, LanguageTokens, ChatTemplatePrompt)}


def scheme_for(languages: dict[str, Any], token_id: TokenId) -> LanguageScheme:
    """The scheme a manifest's `languages` section names (manifests before format 3: Marian's)."""
    name = languages.get("scheme", TargetTokenPrefix.name)
    if name not in SCHEMES:
        raise ValueError(f"language scheme {name!r} is not supported; supported: {', '.join(sorted(SCHEMES))}")
    return SCHEMES[name](languages, token_id)
