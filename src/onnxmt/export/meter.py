"""A long step's progress on the status line: how far it is and the time left, from the rate so far."""

from __future__ import annotations

import time
from collections.abc import Callable


class Meter:
    """`progress` is told `label: 41% of 25.5 GB, ~35 s left` as `advance(n)` counts work done (bytes), at most
    every `every` seconds, and at 100% by `finish()` (a step may do less or more than its estimate)."""

    def __init__(self, progress: Callable[[str], None], label: str, total: int, every: float = 0.5) -> None:
        self.progress, self.label, self.total, self.every = progress, label, max(total, 1), every
        self.done = 0
        self._start = self._told = time.monotonic()

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._told >= self.every:
            self._told = now
            left = (now - self._start) * max(self.total - self.done, 0) / max(self.done, 1)
            self._tell(min(self.done / self.total, 1.0), left)

    def finish(self) -> None:
        self._tell(1.0, 0.0)

    def _tell(self, part: float, left: float) -> None:
        self.progress(f"{self.label}: {part:.0%} of {_size(self.total)}, ~{left:.0f} s left")


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"
