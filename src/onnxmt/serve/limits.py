"""Limits per API key, as LibreTranslate has them (`--req-limit`, `--char-limit`, daily limits, a key database),
kept in SQLite: the keys and their own limits, and the counts of each key (of each client address, for requests
without a key) in fixed windows.

With `--key-db PATH` the database is a file, created on first start (`onnxmt keys` manages its keys): keys are
then needed, its keys valid beside `--api-keys`, and the counts survive a restart and are shared by every process
that opens the same file (SQLite's own locking). Without it the counts live in an in-memory database of the process.

Windows are fixed and aligned: a request window of `--limit-window` seconds (60: "per minute") starting at a
multiple of it, a day from midnight UTC. A request refused for its count is not counted.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .options import ServeOptions
from .protocol import ApiError

if TYPE_CHECKING:
    from starlette.requests import Request

DAY = 86400.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    key TEXT PRIMARY KEY,
    req_limit INTEGER,          -- NULL: the server's --req-limit
    char_limit INTEGER,         -- NULL: the server's --char-limit
    daily_char_limit INTEGER,   -- NULL: the server's --daily-char-limit
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS usage (
    who TEXT NOT NULL,          -- "key:<key>" or "addr:<client address>"
    kind TEXT NOT NULL,         -- "requests" (per --limit-window) or "chars" (per day)
    window INTEGER NOT NULL,    -- the window's start over its length
    count INTEGER NOT NULL,
    PRIMARY KEY (who, kind, window)
);
"""


class LimitExceeded(ApiError):
    """429 with Retry-After. `daily`: the day's characters are spent (DeepL answers those 456)."""

    def __init__(self, message: str, retry_after: float, *, daily: bool = False) -> None:
        super().__init__(429, message, {"Retry-After": str(max(1, math.ceil(retry_after)))})
        self.daily = daily


@dataclass(frozen=True)
class KeyLimits:
    """A key's limits (0: none)."""

    req_limit: int = 0
    char_limit: int = 0
    daily_char_limit: int = 0


@dataclass(frozen=True)
class KeyRow:
    key: str
    req_limit: int | None
    char_limit: int | None
    daily_char_limit: int | None


class KeyStore:
    """The SQLite database of keys and counts. Thread-safe (one connection, one lock): the service calls it off
    the event loop."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else Path(path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        target = ":memory:" if self.path is None else str(self.path)
        self._db = sqlite3.connect(target, check_same_thread=False, timeout=10.0, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            if self.path is not None:
                self._db.execute("PRAGMA journal_mode=WAL")  # readers do not wait for the writer
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- keys -------------------------------------------------------------------------------------------------

    def add(
        self,
        key: str,
        req_limit: int | None = None,
        char_limit: int | None = None,
        daily_char_limit: int | None = None,
    ) -> None:
        if not key or key != key.strip():
            raise ValueError("a key must be non-empty text without surrounding blanks")
        for name, value in (("req_limit", req_limit), ("char_limit", char_limit), ("daily", daily_char_limit)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO keys VALUES (?, ?, ?, ?, ?)",
                (key, req_limit, char_limit, daily_char_limit, time.time()),
            )

    def remove(self, key: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM keys WHERE key = ?", (key,)).rowcount > 0

    def keys(self) -> list[KeyRow]:
        with self._lock:
            rows = self._db.execute("SELECT key, req_limit, char_limit, daily_char_limit FROM keys ORDER BY created")
            return [KeyRow(*row) for row in rows.fetchall()]

    def find(self, key: str) -> KeyRow | None:
        with self._lock:
            row = self._db.execute(
                "SELECT key, req_limit, char_limit, daily_char_limit FROM keys WHERE key = ?", (key,)
            ).fetchone()
        return None if row is None else KeyRow(*row)

    # --- counts -----------------------------------------------------------------------------------------------

    def charge(self, who: str, chars: int, limits: KeyLimits, window: float, now: float | None = None) -> None:
        """Count one request of `chars` characters for `who`, or raise: ApiError 400 when the request alone has
        more characters than the char limit, LimitExceeded when the window's requests or the day's characters
        are spent."""
        if limits.char_limit and chars > limits.char_limit:
            raise ApiError(
                400,
                f"Invalid request: the request has {chars} characters, the limit is {limits.char_limit} per request",
            )
        now = time.time() if now is None else now
        slot, day = int(now // window), int(now // DAY)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")  # the check and the count as one, across processes too
            try:
                self._check_and_count(who, chars, limits, (slot, window), (day, now))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _check_and_count(
        self, who: str, chars: int, limits: KeyLimits, slot: tuple[int, float], day: tuple[int, float]
    ) -> None:
        (window_index, window), (day_index, now) = slot, day
        requests = self._count(who, "requests", window_index)
        if limits.req_limit and requests >= limits.req_limit:
            raise LimitExceeded(
                f"Too many requests: the limit is {limits.req_limit} per {window:g} seconds",
                (window_index + 1) * window - now,
            )
        used = self._count(who, "chars", day_index)
        if limits.daily_char_limit and used + chars > limits.daily_char_limit:
            raise LimitExceeded(
                f"Too many characters today: {used} of {limits.daily_char_limit} are used, this request has {chars}",
                (day_index + 1) * DAY - now,
                daily=True,
            )
        upsert = (
            "INSERT INTO usage VALUES (?, ?, ?, ?) "
            "ON CONFLICT (who, kind, window) DO UPDATE SET count = count + excluded.count"
        )
        self._db.execute(upsert, (who, "requests", window_index, 1))
        self._db.execute(upsert, (who, "chars", day_index, chars))
        # Past windows are of no use: dropped as new ones start (one row per who and kind survives).
        if requests == 0:
            self._db.execute("DELETE FROM usage WHERE kind = 'requests' AND window < ?", (window_index,))
            self._db.execute("DELETE FROM usage WHERE kind = 'chars' AND window < ?", (day_index,))

    def _count(self, who: str, kind: str, window: int) -> int:
        row = self._db.execute(
            "SELECT count FROM usage WHERE who = ? AND kind = ? AND window = ?", (who, kind, window)
        ).fetchone()
        return int(row[0]) if row else 0

    def used_today(self, who: str, now: float | None = None) -> int:
        now = time.time() if now is None else now
        with self._lock:
            return self._count(who, "chars", int(now // DAY))


class Quota:
    """The service's side of the limits: the server's settings over the key database, per request."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self._store: KeyStore | None = None

    @property
    def store(self) -> KeyStore:
        """Opened on first use (the file created then), so that building an app touches no disk."""
        if self._store is None:
            self._store = KeyStore(self.options.key_db)
        return self._store

    def open(self) -> None:
        """Open (create) --key-db now: sqlite3.Error or OSError when it cannot be."""
        if self.options.key_db is not None:
            self.store.keys()  # the schema is there and readable

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def keys_on(self) -> bool:
        """Whether requests need a key: --api-keys, or --key-db (its keys as they are at each request: added or
        removed while the server runs too; with none in it, none is right)."""
        return bool(self.options.api_keys) or self.options.key_db is not None

    def check_key(self, api_key: object) -> None:
        """ApiError 403 unless `api_key` is one of --api-keys or of the key database (when keys are on)."""
        if not self.keys_on():
            return
        if not isinstance(api_key, str) or not api_key:
            raise ApiError(403, "Invalid API key: this server needs an api_key")
        # compare_digest on every key: the time taken does not reveal how much of a key matched.
        # surrogatepass: a key with a lone surrogate (possible in JSON) is a wrong key, not an encoding error.
        given = api_key.encode("utf-8", "surrogatepass")
        listed = any(hmac.compare_digest(given, key.encode()) for key in self.options.api_keys)
        if not listed and not self.known(api_key):
            raise ApiError(403, "Invalid API key")

    def known(self, key: str) -> bool:
        """`key` is in the key database (a key that is not valid text never is)."""
        try:
            key.encode()
        except UnicodeEncodeError:
            return False
        return self.options.key_db is not None and self.store.find(key) is not None

    def limits_for(self, key: str | None) -> KeyLimits:
        """The server's limits, each overridden by the key's own where the database gives one."""
        o = self.options
        row = self.store.find(key) if key is not None and o.key_db is not None else None

        def own(value: int | None, default: int) -> int:
            return default if value is None else value

        if row is None:
            return KeyLimits(o.req_limit, o.char_limit, o.daily_char_limit)
        return KeyLimits(
            own(row.req_limit, o.req_limit),
            own(row.char_limit, o.char_limit),
            own(row.daily_char_limit, o.daily_char_limit),
        )

    def who(self, key: str | None, address: str | None) -> tuple[str, str | None]:
        """(whom a request is counted for, the key whose limits apply): its key when keys are on (it has been
        checked by then), else its client address, so that made-up keys do not make fresh counts."""
        if key and self.keys_on():
            return f"key:{key}", key
        return f"addr:{address or 'unknown'}", None

    async def charge(self, key: str | None, address: str | None, chars: int) -> None:
        """Count a request (`chars`: the characters it translates), or raise ApiError 400 / LimitExceeded 429."""
        o = self.options
        if o.key_db is None and not (o.req_limit or o.char_limit or o.daily_char_limit):
            return
        who, own_key = self.who(key, address)
        limits = self.limits_for(own_key)
        if not (limits.req_limit or limits.char_limit or limits.daily_char_limit):
            return
        await asyncio.to_thread(self.store.charge, who, chars, limits, o.limit_window)

    def used_today(self, key: str | None, address: str | None) -> tuple[int, int]:
        """(characters counted today, the day's limit; 0: none) for a request's key or address."""
        who, own_key = self.who(key, address)
        return self.store.used_today(who), self.limits_for(own_key).daily_char_limit


async def charge(request: Request, quota: Quota, key: object, chars: int) -> None:
    """Count a request against the limits of its key (of its client address without one): ApiError 400 or 429."""
    address = request.client.host if request.client else None
    await quota.charge(key if isinstance(key, str) else None, address, chars)
