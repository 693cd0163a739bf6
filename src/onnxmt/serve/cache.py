"""The translation cache: translations already made, kept by (model, decoding options, text), least recently used
dropped first. LibreTranslate has one (`--translation-cache`) because its users send the same texts again (page
titles, menu items, the same sentence from many clients).

Per text, not per request: a request of 16 texts of which 10 are cached sends 6 to the decoder. The decoding
options include the target language token, the beams, the length limits and the number of alternatives, so a
cached answer is the answer the same request would get uncached. Used on the event loop only: no lock.
"""

from __future__ import annotations

from collections import OrderedDict

from ..runtime.options import DecodeOptions
from ..runtime.translator import Translation

CacheKey = tuple[str, DecodeOptions, str]  # model name, decoding options (target_lang among them), text


class TranslationCache:
    """A bounded LRU of translations. `size` 0 turns it off (nothing is stored, every lookup misses)."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"cache size must not be negative, got {size}")
        self.size = size
        self._entries: OrderedDict[CacheKey, Translation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> Translation | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: CacheKey, translation: Translation) -> None:
        # A cancelled translation is not a translation: never kept.
        if self.size == 0 or translation.cancelled:
            return
        self._entries[key] = translation
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
