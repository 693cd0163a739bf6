"""Language codes as clients send them, mapped to a model's own codes.

Clients speak ISO 639-1 (`en`, `zh`; LibreTranslate adds `zt` for Traditional Chinese and `pb` for Brazilian
Portuguese), ISO 639-3 (`eng`, `zho`, `cmn`), FLORES-200 codes (`eng_Latn`, `zho_Hans`), BCP-47 tags (`zh-Hans`,
`zh-TW`, `pt-BR`) or Marian's tokens (`>>cmn_Hant<<`). Models name their languages in any of these too (opus-mt-en-zh:
`eng` → `zho`, with tokens `>>cmn_Hans<<`, `>>yue_Hant<<`, ...). Both sides are read with `langcodes` into a
language (macrolanguage members folded in: `cmn` is `zh`), a script (explicit, or the language's likely one) and a
territory, and matched on those. Used by the library (`Translator.target_token`), the CLI and the service.

Torch-free and light: `langcodes` has no dependencies; English names need `language_data` (the serve extra) and
fall back to the code without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

import langcodes

AUTO = "auto"
UNKNOWN_TERRITORY = "XX"
# LibreTranslate's own codes, which are not BCP-47.
LIBRETRANSLATE_ALIASES = {"zt": "zh-Hant", "pb": "pt-BR"}
LIBRETRANSLATE_CODES = {tag: code for code, tag in LIBRETRANSLATE_ALIASES.items()}
# The codes LibreTranslate >= 1.7 lists instead of its older ones (its language.py `aliases`); it still accepts both.
LIBRETRANSLATE_NEW_CODES = {"zh": "zh-Hans", "zt": "zh-Hant", "pb": "pt-BR"}


@dataclass(frozen=True)
class Code:
    """One code read by langcodes: `language` after folding macrolanguage members (cmn → zh); `script` as written
    (None when the code names none) and `likely_script`, the one CLDR expects for the language and territory."""

    written: str
    language: str
    script: str | None
    likely_script: str | None
    territory: str | None

    @property
    def effective_script(self) -> str | None:
        return self.script or self.likely_script


def _bare(code: str) -> str:
    """`>>cmn_Hans<<` → `cmn_Hans`; surrounding blanks dropped."""
    code = code.strip()
    if code.startswith(">>") and code.endswith("<<"):
        code = code[2:-2]
    return code


def _same(a: str, b: str) -> bool:
    """The same code, whatever the separator and case (`cmn_Hans`, `cmn-hans`)."""
    return _bare(a).replace("_", "-").lower() == _bare(b).replace("_", "-").lower()


@cache
def parse(code: str) -> Code | None:
    """`code` read as a language tag, or None when langcodes does not know it."""
    text = _bare(code)
    text = LIBRETRANSLATE_ALIASES.get(text.lower(), text).replace("_", "-")
    if not text or text.lower() == AUTO:
        return None
    try:
        language = langcodes.Language.get(langcodes.standardize_tag(text, macro=True))
        if not language.language or not language.is_valid():
            return None
        # fairseq's codes (mBART-50) write XX, ISO 3166's "unknown", for a language without a territory: en_XX.
        territory = None if language.territory == UNKNOWN_TERRITORY else language.territory
        # The language's usual script where it is written (zh-TW: Hant), whatever script the code names.
        likely = langcodes.Language.make(language=language.language, territory=territory).maximize()
    except (ValueError, LookupError):
        return None
    return Code(code, language.language, language.script, likely.script, territory)


def match(code: str, candidates: Iterable[str]) -> str | None:
    """The candidate (a model's code) that `code` (a client's) asks for, or None.

    The same code (`cmn_Hans`, `>>cmn_Hans<<`) first; then the same language in the same script, where a candidate
    that writes its script wins over one that leaves it implied (`zh` is `cmn_Hans` rather than `cmn` when a model
    has both) and a candidate of another territory never matches (`pt_BR` is not `pt-PT`). A code without a
    territory reaches a candidate with one when it is the only one of its language and script (`zh` is mBART-50's
    `zh_CN`; `pt` beside `pt_BR` and `pt_PT` is neither)."""
    candidates = list(candidates)
    for candidate in candidates:
        if _same(code, candidate):
            return candidate
    wanted = parse(code)
    if wanted is None:
        return None
    ranked: list[tuple[bool, bool, int, str]] = []
    for candidate in candidates:
        have = parse(candidate)
        if have is None or have.language != wanted.language or have.effective_script != wanted.effective_script:
            continue
        if have.territory is not None and wanted.territory is not None and have.territory != wanted.territory:
            continue
        # Sorted: the requested territory first, then a written script, then the candidate's own order.
        ranked.append((have.territory != wanted.territory, have.script is None, len(ranked), candidate))
    if wanted.territory is None and ranked and all(r[0] for r in ranked) and len(ranked) > 1:
        return None  # only candidates of some territory, and more than one: which is meant cannot be told
    return min(ranked)[-1] if ranked else None


def public_codes(codes: Iterable[str]) -> dict[str, str]:
    """A model's codes → the codes /languages shows: ISO 639-1 where one exists, the script only where it is not
    the language's usual one (`cmn_Hans` → `zh`, `yue_Hant` → `yue-Hant` beside a bare `yue`), LibreTranslate's
    `zt` for Traditional Chinese. When two codes would show the same, the code that is it already keeps it (`yue`),
    else the one with a written script (`cmn_Hans` is `zh`); the other shows its own code as a BCP-47 tag (`cmn`)."""
    codes = list(dict.fromkeys(codes))
    # A territory is shown only where the model has its language more than once (pt_BR beside pt_PT): mBART-50's
    # de_DE, zh_CN and ar_AR are de, zh and ar.
    parsed = [p.language for p in map(parse, codes) if p is not None]
    short: dict[str, list[str]] = {}
    for code in codes:
        p = parse(code)
        short.setdefault(_short(code, p is not None and parsed.count(p.language) > 1), []).append(code)
    shown: dict[str, str] = {}
    for public, group in short.items():
        exact = [c for c in group if _same(c, public)]
        scripted = [c for c in group if (p := parse(c)) is not None and p.script is not None]
        winner = (exact or scripted or group)[0]
        shown[winner] = public
        for code in group:
            if code != winner:
                shown[code] = _own_tag(code)
    taken = set()
    for code in codes:  # a loser's own tag can still meet another code's: it then shows exactly what the model says
        if shown[code] in taken:
            shown[code] = _bare(code)
        taken.add(shown[code])
    return {code: shown[code] for code in codes}


def _short(code: str, territory: bool = True) -> str:
    parsed = parse(code)
    if parsed is None:
        return _bare(code)
    script = None if parsed.script == parsed.likely_script else parsed.script
    tag = langcodes.Language.make(language=parsed.language, script=script, territory=parsed.territory).to_tag()
    if not territory and tag not in LIBRETRANSLATE_CODES:  # LibreTranslate's pb stays pb
        tag = langcodes.Language.make(language=parsed.language, script=script).to_tag()
    return LIBRETRANSLATE_CODES.get(tag, tag)


def _own_tag(code: str) -> str:
    try:
        return langcodes.standardize_tag(_bare(code).replace("_", "-"))
    except (ValueError, LookupError):
        return _bare(code)


def display_name(code: str) -> str:
    """English name of a model's code (`cmn_Hant` → "Chinese (Traditional)", `yue` → "Cantonese"); the code itself
    without `language_data` or for a code langcodes does not know."""
    text = _bare(code).replace("_", "-")
    try:
        macro = langcodes.standardize_tag(text, macro=True)
        # A member that keeps its own code on /languages (cmn beside zh) keeps its own name too: "Mandarin Chinese".
        language = langcodes.Language.get(macro if langcodes.Language.get(macro).script else text)
        if not language.is_valid():
            return _bare(code)
        return str(language.display_name("en"))
    except (ValueError, LookupError, ImportError):
        return _bare(code)


def unknown(kind: str, code: str, valid: Iterable[str]) -> ValueError:
    """The error for a code that matches none of a model's: it names the valid ones."""
    return ValueError(f"unknown {kind} language {code!r}; valid: {', '.join(valid)}")


class ModelLanguages:
    """A model's languages (the manifest's `languages` section) read for clients: `source` and `targets` are the
    model's codes, `public` what /languages shows for each. `resolve_source` and `resolve_target` take any code a
    client sends and raise ValueError naming the valid ones."""

    def __init__(self, languages: dict[str, object]) -> None:
        source, target, default = languages.get("source"), languages.get("target"), languages.get("default_target")
        tokens, source_tokens = languages.get("target_tokens") or {}, languages.get("source_tokens") or {}
        default_source = languages.get("default_source")
        self.source: str | None = source if isinstance(source, str) else None
        self.target: str | None = target if isinstance(target, str) else None
        self.tokens: dict[str, str] = dict(tokens) if isinstance(tokens, dict) else {}
        # Models told their source language by a token (NLLB, M2M100): {code: token}.
        self.source_tokens: dict[str, str] = dict(source_tokens) if isinstance(source_tokens, dict) else {}
        self.default_target: str | None = default if isinstance(default, str) else None
        self.default_source: str | None = default_source if isinstance(default_source, str) else None
        # A decoder-only translator (scheme chat_template) translates between the languages its prompt can name, any
        # to any: the keys of its `names` table (architectures/decoder_only.py).
        names = languages.get("names") if languages.get("scheme") == "chat_template" else None
        self.named: list[str] = sorted(names) if isinstance(names, dict) else []
        # A multi-target model translates into its tokens' languages; its `target` ("zho") only summarises them.
        targets = self.named or sorted(self.tokens) or ([self.target] if self.target else [])
        self.sources: list[str] = self.named or sorted(self.source_tokens) or ([self.source] if self.source else [])
        self.public: dict[str, str] = public_codes([c for c in (*self.sources, *targets) if c])
        # ISO 639-1 codes first, as LibreTranslate lists them.
        self.targets: list[str] = sorted(targets, key=lambda c: listing_order(self.public[c]))

    def new_codes(self) -> dict[str, str]:
        """Public codes → the codes LibreTranslate >= 1.7 lists for the same languages (`zh` → `zh-Hans`, `zt` →
        `zh-Hant`, `pb` → `pt-BR`), where the new code reaches the same model code and is no other code's public
        one."""
        codes = list(self.public)
        shown = set(self.public.values())
        found = {}
        for code, public in self.public.items():
            new = LIBRETRANSLATE_NEW_CODES.get(public)
            if new is not None and new not in shown and match(new, codes) == code:
                found[public] = new
        return found

    def valid(self, codes: list[str]) -> str:
        """`zh (cmn_Hans), zt (cmn_Hant), cmn, ...`: what a client may send, and the model's code where it differs."""
        shown = [self.public[c] if _same(self.public[c], c) else f"{self.public[c]} ({c})" for c in codes]
        return ", ".join(sorted(shown, key=listing_order))

    def valid_sources(self) -> str:
        return self.valid(self.sources)

    def resolve_source(self, code: str | None) -> str | None:
        """The model's source code for `code`; None for `auto`, no code, or a model that names no source. A model
        with source-language tokens gives its default source (if any) for `auto` or no code."""
        if self.named:
            if code is None or not code.strip() or code.strip().lower() == AUTO:
                return None
            found = match(code, self.sources)
            if found is None:
                raise unknown("source", code, [AUTO, self.valid_sources()])
            return found
        if self.source_tokens:
            if code is None or not code.strip() or code.strip().lower() == AUTO:
                return self.default_source
            found = match(code, self.sources)
            if found is None:
                raise unknown("source", code, [AUTO, self.valid_sources()])
            return found
        if code is None or not code.strip() or code.strip().lower() == AUTO or self.source is None:
            return None
        if match(code, [self.source]) is None:
            raise unknown("source", code, [AUTO, self.valid([self.source])])
        return self.source

    def resolve_target(self, code: str | None) -> str | None:
        """The language token's key (`cmn_Hans`) for `code`, to pass as `target_lang`; None for a single-target
        model (or no code and no default target)."""
        if code is None or not code.strip():
            return self.default_target if self.tokens or self.named else None
        if not self.tokens and not self.named:
            if self.target is None or match(code, [self.target]) is not None:
                return None  # the model's only language, or a model that does not say which it is
            raise ValueError(
                f"this model has a single target language ({self.valid([self.target])}); "
                f"target_lang {code!r} cannot be chosen"
            )
        found = match(code, self.targets)
        if found is None:
            raise unknown("target", code, [self.valid(self.targets)])
        return found


def listing_order(code: str) -> tuple[bool, str]:
    """Sort key of codes as /languages shows them: ISO 639-1 codes first, as LibreTranslate lists them."""
    return len(code.split()[0]) > 2, code
