"""What the small probes (attention.py, steps.py, vocab_ops.py) share: interleaved timing and their Markdown output."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

K = TypeVar("K")


def interleaved(calls: Mapping[K, Callable[[], object]], repeats: int) -> dict[K, list[float]]:
    """Seconds per call of each of `calls`, `repeats` times, taking turns call by call so that the machine's drift
    hits them alike."""
    times: dict[K, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


def emit(lines: list[str], out: Path | None) -> None:
    """Print the table, and write it to `out` too when given."""
    text = "\n".join(lines)
    print(text)
    if out:
        out.write_text(text + "\n", encoding="utf-8")
