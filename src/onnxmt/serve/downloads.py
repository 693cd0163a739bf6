"""Translated files kept for `GET /download_file/{name}`: in a temporary folder of the service's, bounded in bytes
(the oldest files go first to make room), each kept `keep_seconds` (removed on a timer, whether or not other
uploads come), and the folder removed when the service stops."""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

# The names this module gives files: 128 random bits (token_urlsafe(16): 22 characters), a dot, the upload's own
# (cleaned) name.
STORED_NAME = re.compile(r"[A-Za-z0-9_-]{22}\.[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class TooLargeToStore(ValueError):
    """A translated file larger than the whole store."""


class Downloads:
    def __init__(self, max_bytes: int, keep_seconds: float) -> None:
        self.max_bytes = max_bytes
        self.keep_seconds = keep_seconds
        self.directory: Path | None = None
        self._files: OrderedDict[str, tuple[int, float]] = OrderedDict()  # name -> (bytes, stored at), oldest first
        self._sweeper: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # store and sweep run on threads (they touch the disk)

    @property
    def stored_bytes(self) -> int:
        return sum(size for size, _ in self._files.values())

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_every(min(60.0, self.keep_seconds / 4)), name="onnxmt-files")

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        with self._lock:
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
                self.directory = None
            self._files.clear()

    def store(self, filename: str, data: bytes) -> str:
        """Keep `data` as a translation of `filename`; its name in /download_file. Runs off the event loop."""
        if len(data) > self.max_bytes:
            raise TooLargeToStore(
                f"the translated file has {len(data)} bytes; the store for translated files holds "
                f"{self.max_bytes} (max_stored_mb)"
            )
        self.sweep()
        with self._lock:
            while self._files and self.stored_bytes + len(data) > self.max_bytes:
                self._remove(next(iter(self._files)))
            if self.directory is None:
                self.directory = Path(tempfile.mkdtemp(prefix="onnxmt-translated-"))
            name = f"{secrets.token_urlsafe(16)}.{_clean(filename)}"
            (self.directory / name).write_bytes(data)
            self._files[name] = (len(data), time.monotonic())
        return name

    def path(self, name: str) -> Path | None:
        """The stored file of `name`, None when there is none (never made, expired or removed for room)."""
        found = self._files.get(name) if STORED_NAME.fullmatch(name) else None
        if found is None or self.directory is None or time.monotonic() - found[1] > self.keep_seconds:
            return None
        return self.directory / name

    def sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            for name in [n for n, (_, stored) in self._files.items() if now - stored > self.keep_seconds]:
                self._remove(name)

    def _remove(self, name: str) -> None:
        self._files.pop(name, None)
        if self.directory is not None:
            (self.directory / name).unlink(missing_ok=True)

    async def _sweep_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.sweep)


def _clean(filename: str) -> str:
    """A file name safe to store and to put in a URL: letters, digits, dot, dash, underscore."""
    stem, suffix = Path(filename).stem, Path(filename).suffix.lower()
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._-")[:80] or "file"
    return f"{cleaned}{suffix}"
