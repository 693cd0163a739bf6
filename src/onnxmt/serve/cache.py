"""The translation cache: translations already made, kept by (model, prepared text), least recently used dropped
first. LibreTranslate has one (`--translation-cache`) because its users send the same texts again (page
titles, menu items, the same sentence from many clients).

Per text, not per request: a request of 16 texts of which 10 are cached sends 6 to the decoder. A prepared text
(`Translator.prepare`) holds its source ids, its language prompt and its resolved decoding settings (beams, length
limits, number of alternatives), so a cached answer is the answer the same request would get uncached. Used on
the event loop only: no lock.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

from ..runtime.translator import Prepared, Translation

CacheKey = tuple[str, Prepared]  # model name, the text prepared for it


# What an entry holds beyond its strings and ids: the key tuple, the Translation, the OrderedDict's node.
ENTRY_OVERHEAD = 400


def entry_bytes(key: CacheKey, translation: Translation) -> int:
    """About what an entry keeps alive: the text and its source ids, its translations (str sizes as Python stores
    them), their token id lists, and the containers (the settings and prompt are shared by many entries: not
    counted)."""
    total = ENTRY_OVERHEAD + sys.getsizeof(key[1].text) + sys.getsizeof(key[1].ids)
    for hypothesis in (translation, *translation.alternatives):
        total += sys.getsizeof(hypothesis.text) + sys.getsizeof(hypothesis.token_ids) + 32 * len(hypothesis.token_ids)
    return total


class TranslationCache:
    """A bounded LRU of translations: at most `size` entries and `max_bytes` bytes (entry_bytes; 0: no bound on
    bytes). `size` 0 turns it off (nothing is stored, every lookup misses)."""

    def __init__(self, size: int, max_bytes: int = 0) -> None:
        if size < 0:
            raise ValueError(f"cache size must not be negative, got {size}")
        if max_bytes < 0:
            raise ValueError(f"cache bytes must not be negative, got {max_bytes}")
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[CacheKey, tuple[Translation, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> Translation | None:
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: CacheKey, translation: Translation) -> None:
        # A cancelled translation is not a translation: never kept.
        if self.size == 0 or translation.cancelled:
            return
        size = entry_bytes(key, translation)
        if self.max_bytes and size > self.max_bytes:
            return  # larger than the whole cache: it would only push everything else out
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._entries[key] = (translation, size)
        self.bytes += size
        while len(self._entries) > self.size or (self.max_bytes and self.bytes > self.max_bytes):
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
