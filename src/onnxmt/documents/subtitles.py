"""SubRip (.srt) and WebVTT (.vtt) subtitles: cue numbers, timings and settings kept, each cue's lines translated
as one text (a sentence is often split over a cue's two lines) and written back as one line. Blocks without a
timing line (the WEBVTT header, NOTE, STYLE, REGION) are kept as they are."""

from __future__ import annotations

from collections.abc import Callable, Sequence

Translate = Callable[[Sequence[str]], list[str]]


def _blocks(source: str) -> list[list[str]]:
    blocks: list[list[str]] = [[]]
    for line in source.replace("\r\n", "\n").split("\n"):
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return [b for b in blocks if b]


def cues(source: str) -> list[tuple[list[str], list[str]]]:
    """Each block as (head: number, timing line; text lines); text lines are empty for blocks that are no cue."""
    out: list[tuple[list[str], list[str]]] = []
    for block in _blocks(source):
        timing = next((i for i, line in enumerate(block) if "-->" in line), None)
        if timing is None or block[0].startswith(("NOTE", "STYLE", "REGION", "WEBVTT")):
            out.append((block, []))
        else:
            out.append((block[: timing + 1], block[timing + 1 :]))
    return out


def translate_subtitles(source: str, translate: Translate) -> str:
    texts, rebuild = prepare_subtitles(source)
    return rebuild(translate(texts) if texts else [])


def prepare_subtitles(source: str) -> tuple[list[str], Callable[[list[str]], str]]:
    """The cues' texts, and the function that writes the subtitles again with their translations."""
    parsed = cues(source)
    texts = [" ".join(line.strip() for line in lines) for _, lines in parsed if lines]

    def rebuild(translated: list[str]) -> str:
        it = iter(translated)
        blocks = [[*head, next(it)] if lines else head for head, lines in parsed]
        return "\n\n".join("\n".join(block) for block in blocks) + "\n"

    return texts, rebuild
