"""`onnxmt tune`: measure thread count and spinning on this machine instead of guessing them.

Every setting translates the same sentences with the same forced output length (so each does the same work), and
the settings are measured interleaved, round by round, so that background load on a shared machine hits them
alike. Reported: median batch-1 latency per sentence and generated tokens per second at a larger batch.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .options import RuntimeOptions
from .translator import Translator

# Short and long English sentences (the lengths real traffic has); the model's own language only matters for BLEU.
SAMPLE = (
    "The meeting has been moved to Thursday afternoon.",
    "Please send me the report before the end of the week so that I can review it.",
    "Scientists at the university announced on Monday that they had developed a new diagnostic tool that can sort "
    "cells by type.",
    "Where is the nearest train station?",
    "The museum, which opened in 1902, houses one of the largest collections of ancient maps in the world.",
    "I would like a cup of tea, please.",
)


@dataclass(frozen=True)
class TuneResult:
    threads: int
    spinning: bool
    latency_ms: float  # median per sentence, batch 1
    tokens_per_s: float  # at `batch_size`


def candidates(max_threads: int | None = None) -> list[RuntimeOptions]:
    cores = max_threads or os.cpu_count() or 1
    return [RuntimeOptions(threads=t, spinning=s, verify=False) for t in range(1, cores + 1) for s in (False, True)]


def tune(
    model_dir: str | Path,
    settings: Sequence[RuntimeOptions],
    *,
    texts: Sequence[str] = SAMPLE,
    tokens: int = 30,
    batch_size: int = 16,
    rounds: int = 3,
    source_lang: str | None = None,
    target_lang: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[TuneResult]:
    """Measure every setting on `texts`, `rounds` times interleaved; the medians, one result per setting.
    `source_lang`, `target_lang`: as `Translator.translate`'s (a model without a default target, such as NLLB-200,
    needs `target_lang`; with the output length forced, which one hardly changes the work)."""
    translators = [Translator(model_dir, options) for options in settings]
    forced: dict[str, Any] = {"beams": 1, "max_new_tokens": tokens, "min_new_tokens": tokens}
    forced.update(source_lang=source_lang, target_lang=target_lang)
    batch = list(texts) * max(1, -(-batch_size // len(texts)))
    latencies: list[list[float]] = [[] for _ in settings]
    speeds: list[list[float]] = [[] for _ in settings]
    for translator in translators:
        translator.translate(list(texts[:1]), **forced)  # warm-up: first-run allocations are not the setting's cost
    for round_ in range(rounds):
        for i, translator in enumerate(translators):
            progress(f"round {round_ + 1}/{rounds}: {_label(settings[i])}")
            for text in texts:
                start = time.perf_counter()
                translator.translate([text], **forced)
                latencies[i].append(time.perf_counter() - start)
            start = time.perf_counter()
            translator.translate(batch[:batch_size], batch_size=batch_size, **forced)
            speeds[i].append(batch_size * tokens / (time.perf_counter() - start))
    return [
        TuneResult(
            threads=int(options.threads or 1),
            spinning=options.spinning,
            latency_ms=1000 * statistics.median(latencies[i]),
            tokens_per_s=statistics.median(speeds[i]),
        )
        for i, options in enumerate(settings)
    ]


def _label(options: RuntimeOptions) -> str:
    return f"threads={options.threads} spinning={'on' if options.spinning else 'off'}"
