"""Language detection for `POST /detect` and `source: "auto"`: py3langid, restricted to the models' languages.

Chosen by measurement on FLORES-200 (benchmarks/detect.py, docs/serve.md): restricted to English and Chinese it was
right on 100% of English and Chinese sentences and of two-word English snippets, 98% of four-character Chinese
ones, in 0.1-0.4 ms a text; its model (4.4 MB) ships in the package, so it works offline. Unrestricted, it
mistook short English for other Latin-script languages a third of the time, which is why it is restricted, as
LibreTranslate restricts its detector to the languages it has models for.

The models' languages (every model of the service) are taken at the ISO 639-1 level: a target `yue_Hant` or `wuu`
counts as `zh` (its macrolanguage), since telling Chinese varieties apart on a few characters is not what a source
check needs and cost 6% of Mandarin sentences in the measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..extras import missing_extra
from ..languages import ModelLanguages, match, parse

# Candidates at most in a /detect answer, and the least confidence (in %) worth listing.
MAX_CANDIDATES = 3
MIN_CONFIDENCE = 0.1


@dataclass(frozen=True)
class Detected:
    language: str  # the code /languages shows when the model has the language, else the detector's (ISO 639-1)
    confidence: float  # 0-100, LibreTranslate's scale

    def libretranslate(self) -> dict[str, Any]:
        return {"confidence": self.confidence, "language": self.language}


class Detector:
    """py3langid restricted to the models' languages (when it knows at least two of them; all of its 97
    otherwise). Read-only after construction: safe to call from several threads."""

    def __init__(self, languages: ModelLanguages | Sequence[ModelLanguages]) -> None:
        try:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier
        except ImportError as e:
            raise missing_extra("language detection", "serve", e) from e
        self.models = [languages] if isinstance(languages, ModelLanguages) else list(languages)
        self._identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(self._identifier.nb_classes)
        codes = [c for model in self.models for c in (*model.sources, *model.targets)]
        self.restricted_to = sorted({_detector_code(c) for c in codes} & known)
        if len(self.restricted_to) >= 2:
            self._identifier.set_languages(self.restricted_to)

    def detect(self, text: str) -> list[Detected]:
        """The likeliest languages of `text`, most confident first (at least one, even for an empty text)."""
        ranked = self._identifier.rank(" ".join(text.split()))
        found = [Detected(self._public(code), round(float(p) * 100, 1)) for code, p in ranked[:MAX_CANDIDATES]]
        return [found[0]] + [d for d in found[1:] if d.confidence >= MIN_CONFIDENCE]

    def _public(self, code: str) -> str:
        """The detector's code as /languages shows it, a model's source first (`zh` for Chinese)."""
        for model in self.models:
            own = match(code, model.sources)
            if own is not None:
                return model.public[own]
        for model in self.models:
            own = match(code, model.targets)
            if own is not None:
                return model.public[own]
        return code


def _detector_code(code: str) -> str:
    """A model's code as the detector's languages are named: ISO 639-1, Chinese varieties as `zh`."""
    from langcodes.data_dicts import MACROLANGUAGES

    parsed = parse(code)
    if parsed is None:
        return code
    return str(MACROLANGUAGES.get(parsed.language, parsed.language))
