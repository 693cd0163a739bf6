"""/translate's texts cut into the model's units of text before they are translated, and joined again after.

A sentence-level model (Marian, NLLB, M2M100, mBART-50, MADLAD, T5) is given each sentence of a text, as
LibreTranslate gives Argos: a Mastodon post of five sentences is five texts for opus-mt, each cached and batched
on its own. A paragraph-level model (the decoder-only translators) is given each line of a text whole. The unit is
the family's (architectures `text_unit`), or the service's --text-unit. A text of one unit (or none) goes to the
model exactly as it came. Documents and streams are cut by the same rule, with the model's tokenizer
(documents/translate.py `plan_texts`); here no unit is counted: one too long for the model is given to it as a whole
text is (an encoder-decoder's tokenizer truncates it at the model's positions).

Each unit is a text to the rest of the service: cached, batched and costed on its own (its source tokens and its
max new tokens count against --max-request-cost).
"""

from __future__ import annotations

from collections.abc import Sequence

import langcodes

from ..architectures import PARAGRAPH
from ..documents.segment import Piece, join, split_sentences
from ..documents.translate import split_lines
from ..runtime.translator import Translation

Layout = list[Piece]  # a text as its units (translate=True) and what is kept between them


def cut(texts: Sequence[str], unit: str, lang: str | None) -> list[Layout]:
    """Each text as its units of text (`unit`: sentence or paragraph) and what is kept between them, in the
    language `lang` (a client's code; None: sentencex's default rules). A text of at most one unit is one piece,
    itself."""
    segmenter = _segmenter_lang(lang)
    layouts = []
    for text in texts:
        # A paragraph is a line whole: no line counts as too long here.
        pieces = split_lines(text, lambda _: 0, 1, segmenter) if unit == PARAGRAPH else split_sentences(text, segmenter)
        layouts.append(pieces if sum(p.translate for p in pieces) > 1 else [Piece(text, True)])
    return layouts


def units(layouts: Sequence[Layout]) -> list[str]:
    """The units of all texts, in order: what the model translates."""
    return [p.text for pieces in layouts for p in pieces if p.translate]


def joined(layouts: Sequence[Layout], translations: Sequence[Translation]) -> list[Translation]:
    """Each text's translation from its units' (`translations`, all texts' in order). Alternative k of a text is
    its units' alternatives k joined (a unit with fewer gives its best), as Argos Translate combines a text's
    sentences' hypotheses."""
    out, position = [], 0
    for pieces in layouts:
        n = sum(p.translate for p in pieces)
        mine = translations[position : position + n]
        position += n
        if n == 1 and len(pieces) == 1:
            out.append(mine[0])
            continue
        alternatives = max((len(t.alternatives) for t in mine), default=0)
        options = [
            join(pieces, [(t.alternatives[k] if k < len(t.alternatives) else t).text for t in mine])
            for k in range(alternatives)
        ]
        out.append(
            Translation(
                join(pieces, [t.text for t in mine]),
                [token for t in mine for token in t.token_ids],
                sum(t.score for t in mine),
                tuple(Translation(text, [], 0.0) for text in options),
                any(t.cancelled for t in mine),
            )
        )
    return out


def _segmenter_lang(code: str | None) -> str:
    """A client's language code as sentencex names languages (ISO 639-1 where there is one)."""
    if not code or code == "auto":
        return "en"
    try:
        return str(langcodes.standardize_tag(code.replace("_", "-")).split("-")[0])
    except ValueError:
        return code
