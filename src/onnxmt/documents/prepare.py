"""A document made ready to translate, without the model: its texts cut into the sentences the model will see
(translate.Plan), and the document written again from their translations.

Everything here is a function of picklable values (bytes, strings, `Counting`), so the service runs it in a worker
process (serve/workers.py: a killable deadline, no share of the service's GIL) and the library runs the same
functions in its own process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .files import prepare
from .html import prepare_html
from .limits import DEFAULT_LIMITS, DocumentLimits
from .translate import Counting, Plan, plan_texts

# What a document is to `plan`/`render`: a file format (files.FORMATS' values), "pages" (HTML strings, each
# translated as a page) or "texts" (plain texts, each cut into the model's units of text).
PAGES, TEXTS = "pages", "texts"


def units(kind: str, document: Any, limits: DocumentLimits = DEFAULT_LIMITS) -> tuple[list[str], Callable]:
    """The texts of `document` (bytes of a file of format `kind`, or a list of strings for PAGES and TEXTS), and
    the function that writes it again from their translations."""
    if kind == TEXTS:
        return list(document), lambda translated: translated
    if kind == PAGES:
        jobs = [prepare_html(page) for page in document]
        texts = [text for page_texts, _ in jobs for text in page_texts]

        def pages(translated: list[str]) -> list[str]:
            out, position = [], 0
            for page_texts, rebuild in jobs:
                out.append(rebuild(translated[position : position + len(page_texts)]))
                position += len(page_texts)
            return out

        return texts, pages
    return prepare(document, kind, limits)


def plan(kind: str, document: Any, counting: Counting, limits: DocumentLimits = DEFAULT_LIMITS) -> Plan:
    """`document` read and cut into the model's units of text (what a worker process runs first)."""
    texts, _ = units(kind, document, limits)
    return plan_texts(texts, counting, limits)


def render(kind: str, document: Any, translated: list[str], limits: DocumentLimits = DEFAULT_LIMITS) -> Any:
    """`document` written again with `translated` (one per text `units` gave): read again rather than kept, so
    that nothing of it stays in a worker between the two steps."""
    _, rebuild = units(kind, document, limits)
    return rebuild(translated)


def sample(kind: str, document: Any, chars: int, limits: DocumentLimits = DEFAULT_LIMITS) -> str:
    """The first `chars` characters of `document`'s texts: what its language is detected on."""
    texts, _ = units(kind, document, limits)
    out, length = [], 0
    for text in texts:
        if text.strip():
            out.append(text)
            length += len(text) + 1
        if length >= chars:
            break
    return "\n".join(out)[:chars]
