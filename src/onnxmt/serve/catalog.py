"""Which model answers a (source, target) pair, and `/languages` over all the service's models.

A client's codes are mapped to each model's own (onnxmt.languages: `en` is `eng`, `zh` is `cmn_Hans`); the first
model, in the order the directories were given, that translates from the source into the target answers. With a
pivot language (`--pivot en`, as Argos Translate does), a pair no model translates directly is translated through
it: source → pivot by one model, pivot → target by another; the answer says so (`"pivot": "en"`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from ..languages import AUTO, display_name
from .pool import ModelEntry
from .protocol import ApiError, with_new_codes


@dataclass(frozen=True)
class Leg:
    """One model's part of a route: `target_lang` is the model's code for the target (None: its only one)."""

    entry: ModelEntry
    target_lang: str | None


@dataclass(frozen=True)
class Route:
    legs: tuple[Leg, ...]
    pivot: str | None = None  # the pivot language as /languages shows it, when there are two legs


def _translates_from(entry: ModelEntry, code: str) -> bool:
    try:
        return entry.languages.model.resolve_source(code) is not None
    except ValueError:
        return False


def _public_source(entry: ModelEntry, code: str) -> str | None:
    """The code /languages shows for `entry`'s source language named `code` (None: not one of its sources)."""
    try:
        found = entry.languages.model.resolve_source(code)
    except ValueError:
        return None
    return entry.languages.model.public[found] if found is not None else entry.languages.source


def _target(entry: ModelEntry, code: str | None) -> tuple[bool, str | None]:
    """(whether `entry` translates into `code`, its target_lang for it)."""
    try:
        return True, entry.languages.model.resolve_target(code)
    except ValueError:
        return False, None


class Catalog:
    """The service's models by language pair. `pivot`: a client's code of the pivot language, or None.

    What is listed (sources, pairs, `/languages`, the web UI's defaults) depends only on the models' manifests, read
    once at start-up, not on which models are loaded: each is computed once, on first use, and kept (an NLLB
    model beside a Marian one has 40,000 pairs; `/languages` over them took ~0.1 s of the event loop per call).
    The lists returned are shared: callers must not change them."""

    def __init__(self, entries: Sequence[ModelEntry], pivot: str | None = None) -> None:
        self.entries = list(entries)
        self.pivot = pivot.strip() if pivot and pivot.strip() else None
        self.single = len(self.entries) == 1

    def sources(self) -> list[str]:
        """Source languages as /languages shows them, in model order."""
        return self._sources

    @cached_property
    def _sources(self) -> list[str]:
        return list(dict.fromkeys(s for e in self.entries for s in e.languages.sources))

    def direct(self, source: str, target: str | None) -> Leg | None:
        for entry in self.entries:
            if not _translates_from(entry, source):
                continue
            ok, lang = _target(entry, target)
            if ok:
                return Leg(entry, lang)
        return None

    def route(self, source: str | None, target: str | None) -> Route:
        """The model(s) for a request; ApiError 400 naming the valid sources or the available pairs."""
        if self.single:  # one model: its own checks and messages, `auto` and no source included
            entry = self.entries[0]
            entry.languages.check_source(source)
            return Route((Leg(entry, entry.languages.target_lang(target)),))
        if source is None or not source.strip():
            raise ApiError(400, "Invalid request: this server has several models: source is required (or auto)")
        if not any(_translates_from(e, source) for e in self.entries):
            raise ApiError(400, f"unknown source language {source!r}; valid: auto, {', '.join(self.sources())}")
        if target is None or not target.strip():
            candidates = [e for e in self.entries if _translates_from(e, source)]
            if len(candidates) == 1:
                return Route((Leg(candidates[0], candidates[0].languages.target_lang(None)),))
            raise ApiError(400, f"Invalid request: target is required; available pairs: {self._pairs_text(source)}")
        leg = self.direct(source, target)
        if leg is not None:
            return Route((leg,))
        through = self._through_pivot(source, target)
        if through is not None:
            return through
        raise ApiError(400, f"no model translates {source} to {target}; available pairs: {self._pairs_text(source)}")

    def _through_pivot(self, source: str, target: str) -> Route | None:
        if self.pivot is None:
            return None
        first, second = self.direct(source, self.pivot), self.direct(self.pivot, target)
        if first is None or second is None:
            return None
        shown = _public_source(second.entry, self.pivot)
        if _public_source(first.entry, source) == _public_target(second):  # zh → en → zh is no translation
            return None
        return Route((first, second), pivot=shown)

    def reaches(self, source: str, target: str | None) -> bool:
        """Whether a request from `source` into `target` has a route."""
        try:
            self.route(source, target)
        except ApiError:
            return False
        return True

    def through_pivot(self) -> list[tuple[str, str]]:
        """The pairs only the pivot reaches."""
        direct = {(s, t) for e in self.entries for s in e.languages.sources for t in e.languages.targets}
        return [pair for pair in self.pairs() if pair not in direct]

    def pairs(self) -> list[tuple[str, str]]:
        """Every (source, target) the service answers, as /languages shows them, pivot pairs included; never a
        language into itself (an NLLB model has all 202 of its languages on both sides)."""
        return self._pairs

    @cached_property
    def _pairs(self) -> list[tuple[str, str]]:
        pairs: dict[tuple[str, str], None] = {}
        for entry in self.entries:
            for source in entry.languages.sources:
                pairs.update(((source, t), None) for t in entry.languages.targets if t != source)
        if self.pivot is not None:
            into = [e for e in self.entries if _target(e, self.pivot)[0]]
            out_of = [e for e in self.entries if _translates_from(e, self.pivot)]
            for first in into:
                for second in out_of:
                    for source in first.languages.sources:
                        pairs.update(((source, t), None) for t in second.languages.targets if t != source)
        return list(pairs)

    def _pairs_text(self, source: str) -> str:
        """The pairs from `source` (a client's code): all pairs of a service with NLLB would be 40,000."""
        shown = {s for e in self.entries if (s := _public_source(e, source)) is not None}
        return ", ".join(f"{s}→{t}" for s, t in self.pairs() if s in shown)

    def libretranslate(self) -> list[dict[str, object]]:
        """`GET /languages`: every language with the languages it translates into, sources first."""
        return self._libretranslate

    @cached_property
    def _libretranslate(self) -> list[dict[str, object]]:
        if self.single:
            return self.entries[0].languages.libretranslate()
        names: dict[str, str] = {}
        for entry in self.entries:
            model = entry.languages.model
            for code in (*model.sources, *model.targets):
                names.setdefault(model.public[code], display_name(code))
        targets: dict[str, list[str]] = {s: [] for s in self.sources()}
        for source, target in self.pairs():
            targets[source].append(target)
        for code in names:
            targets.setdefault(code, [])
        entries = [{"code": code, "name": names.get(code, code), "targets": into} for code, into in targets.items()]
        new_codes: dict[str, str] = {}
        for entry in self.entries:
            for old, code in entry.languages.model.new_codes().items():
                new_codes.setdefault(old, code)
        return with_new_codes(entries, new_codes)

    def frontend_defaults(self) -> tuple[str, str | None]:
        """The source and target a web UI starts with (LibreTranslate's `/frontend/settings`): the only source
        language, or `auto` when there are several (or none); the first model's default target that the source
        reaches, else the first target it reaches (None: no pair at all)."""
        return self._frontend_defaults

    @cached_property
    def _frontend_defaults(self) -> tuple[str, str | None]:
        sources = self.sources()
        source = sources[0] if len(sources) == 1 else AUTO
        reached = [t for s, t in self.pairs() if source in (AUTO, s)]
        default = next((e.languages.target for e in self.entries if e.languages.target in reached), None)
        return source, default or next(iter(reached), None)


def _public_target(leg: Leg) -> str | None:
    """The code /languages shows for a leg's target."""
    languages = leg.entry.languages
    if leg.target_lang is None:
        model = languages.model
        return model.public.get(model.target or "") if model.target else None
    return languages.model.public[leg.target_lang]
