"""`CancelToken`: how a caller tells the decoding loop that the work for some texts is no longer wanted."""

from __future__ import annotations

import threading
import time


class CancelToken:
    """Set by `cancel()` (from any thread), or by itself once `deadline` (a `time.monotonic()` value) has passed.

    The decoding loop reads `cancelled` once per step for each row: a cancelled row leaves the decoder batch at the
    next step, as a finished row does, and its translation comes back with `cancelled=True`.
    """

    __slots__ = ("_event", "deadline")

    def __init__(self, deadline: float | None = None) -> None:
        self._event = threading.Event()
        self.deadline = deadline

    @classmethod
    def after(cls, seconds: float | None) -> CancelToken:
        """A token that cancels itself `seconds` from now (None: only by `cancel()`)."""
        return cls(None if seconds is None else time.monotonic() + seconds)

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        if self._event.is_set():
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self._event.set()
            return True
        return False
