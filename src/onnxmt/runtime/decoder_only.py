"""The graph of a decoder-only translator (HY-MT, Qwen3, TranslateGemma) behind the interface the decoding loop
drives: `prefill(prompts)` runs the prompts into a fresh cache and returns each row's last-position logits;
`step(tokens, cache)` runs one token per row, as `Graphs.step` does for an encoder-decoder; `extend(ids, lengths,
cache)` is both (a chunk of a prompt, or prompts joining a running cache).

The cache is graphs.Cache with no cross-attention: per layer a key and a value buffer (rows, kv_heads, capacity,
head_dim) that this module grows and writes, and each row's own length (`self_len`), so rows of different lengths
share one call (the graph takes one position per row: export/decoder_only.py). Its `mask` is empty, (rows, 0).
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..architectures import Prompt
from ..architectures.decoder_only import render_prompt
from ..manifest import Manifest, ModelDirError
from ..tokenization import JsonTokenizer
from ..tokenization.chat import ChatTemplate
from .cache import Cache, aligned, grown, next_capacity
from .graphs import Graphs
from .options import RuntimeOptions
from .sessions import load_session, release_memory

# Prompt positions a prefill call takes per row: a prompt is cut into chunks at these fixed boundaries, whatever
# runs beside it, so that its cache is the same bits alone and in any batch (the chunks' boundaries change the
# last bits: tests/runtime/test_decoder_only.py). The service runs a chunk between two steps (serve/inflight.py), so
# that a chunk's time is the longest a running row or a short prompt waits for one; on CPU a chunk of this size is
# already a large matrix product, and prefills nearly as many positions per second as larger ones
# (benchmarks/results/prefill-chunks-*.json).
PREFILL_CHUNK = 64


class DecoderOnlyGraphs(Graphs):
    """One ONNX Runtime session of a decoder-only model directory's `decoder` graph, its names read from the
    manifest. To the running batch (runtime/running.py) it is an encoder-decoder's graphs without cross-attention:
    `prefill_each` stands for the encoder (a text's prompt but its last token into its own cache), and `step`
    steps every row at its own length."""

    per_row = True
    per_sentence = True
    decoder_only = True

    def __init__(
        self, directory: Path, manifest: Manifest, options: RuntimeOptions, session: Any | None = None
    ) -> None:
        """`session`: the decoder graph's ONNX Runtime session, already open (export's check opens its own)."""
        super().__init__(manifest, options)
        spec = manifest.graphs["decoder"]
        self.kv_heads = int(manifest.model["num_kv_heads"])
        self.heads = self.kv_heads  # the cache's heads (grouped-query attention: fewer than the queries')
        self.vocab_size = int(manifest.model["vocab_size"])
        if session is None:
            session = load_session(directory / spec.file, options)
            release_memory(directory)
        self.decoder = session
        for role in ("input_ids", "input_length", "past_length"):
            if not spec.has_input(role):
                raise ModelDirError(f"{spec.file}: not a decoder-only graph (no input {role!r})")
        self.ids_name = spec.input_name("input_ids")
        self.input_length_name = spec.input_name("input_length")
        self.past_length_name = spec.input_name("past_length")
        roles = [f"{kv}.{i}" for i in range(self.layers) for kv in ("key", "value")]
        self.past_names = [spec.input_name(f"past_{r}") for r in roles]
        # A graph that writes the cache in place (GroupQueryAttention: its `present_*` outputs are the buffers,
        # bound to the same memory as the `past_*` inputs), or one that returns the new positions' keys and values.
        self.in_place = spec.has_output(f"present_{roles[0]}")
        kind = "present" if self.in_place else "new"
        self.out_names = [spec.output_name("logits")] + [spec.output_name(f"{kind}_{r}") for r in roles]
        # Per thread (the service prefills on its encoder thread while the decoder thread steps): the last
        # buffers' addresses and shapes and their IOBinding, so that one thread never runs on another's binding.
        self._bound = threading.local()

    def empty_cache(self, rows: int, max_positions: int | None = None) -> Cache:
        """A cache of `rows` empty rows; `max_positions`: the most positions a row will hold (prompt and output),
        past which a buffer is never grown; None if not known."""
        shape = (rows, self.kv_heads, 0, self.head_dim)
        return Cache(
            mask=np.zeros((rows, 0), dtype=np.int64),
            self_kv=tuple(np.zeros(shape, dtype=np.float32) for _ in range(2 * self.layers)),
            cross_kv=(),
            per_sentence=True,
            self_len=np.zeros(rows, dtype=np.int64),
            max_positions=max_positions,
        )

    def prefill_each(self, prompts: Sequence[Sequence[int]], chunk: int | None = None) -> list[Cache]:
        """Each prompt's own cache (one row, its length; an empty prompt's is empty), the prompts run together in
        calls of at most `chunk` positions per row, cut at fixed boundaries (PREFILL_CHUNK says why)."""
        steps = self.prefill_steps(prompts, chunk)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return cast("list[Cache]", done.value)

    def prefill_steps(
        self, prompts: Sequence[Sequence[int]], chunk: int | None = None
    ) -> Generator[int, None, list[Cache]]:
        """`prefill_each` one call at a time: yields the positions each call took (so that a caller can run other
        work between a long prompt's chunks: the service's short requests), returns the caches. `chunk`: None,
        PREFILL_CHUNK."""
        chunk = chunk or PREFILL_CHUNK
        out: list[Cache] = [self.empty_cache(1) for _ in prompts]
        active = [i for i, p in enumerate(prompts) if len(p)]
        if not active:
            return out
        longest = max(len(prompts[i]) for i in active)
        cache = self.empty_cache(len(active), longest)
        # Room for the whole prompt at once (no chunk runs past it): grown chunk by chunk, the cache would be
        # copied at every chunk, and held twice meanwhile.
        cache = replace(cache, self_kv=self._room(cache, longest))
        start = 0
        while active:
            ids, lengths = right_padded([prompts[i][start : start + chunk] for i in active])
            _, cache = self.extend(ids, lengths, cache)
            start += chunk
            done = [len(prompts[i]) <= start for i in active]
            for row, i in enumerate(active):
                if done[row]:
                    n = len(prompts[i])
                    # A prompt alone keeps the buffers it was prefilled into (the service's prefills: one prompt a
                    # call): a copy would hold its cache twice for a moment, and it is copied once more as it joins.
                    kv = (
                        cache.self_kv
                        if len(active) == 1
                        else tuple(b[row : row + 1, :, :n].copy() for b in cache.self_kv)
                    )
                    out[i] = replace(self.empty_cache(1), self_kv=kv, self_len=np.array([n], dtype=np.int64))
            if all(done):
                break
            cache = cache.select(np.flatnonzero(~np.array(done)))
            active = [i for i, d in zip(active, done, strict=True) if not d]
            yield int(lengths.sum())
        return out

    def prefill(self, prompts: Sequence[Sequence[int]], max_positions: int | None = None) -> tuple[np.ndarray, Cache]:
        """Each prompt's ids into a fresh cache, one row each: ((rows, vocab) logits at each prompt's last position,
        the cache)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prefill needs at least one prompt, each of at least one token")
        ids, lengths = right_padded(prompts)
        return self.extend(ids, lengths, self.empty_cache(len(prompts), max_positions))

    def step(self, tokens: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        """One token per row, `tokens` (rows, 1): ((rows, vocab) logits, the grown cache). As `Graphs.step`: the
        cache passed in keeps its positions, the one returned shares its buffers."""
        if tokens.ndim != 2 or tokens.shape[1] != 1:
            raise ValueError(f"step takes one token per row, (rows, 1); got {tokens.shape}")
        return self.extend(tokens, np.ones(len(tokens), dtype=np.int64), cache)

    def extend(self, ids: np.ndarray, lengths: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        """Row r's first `lengths[r]` ids of `ids` (rows, new_len), right-padded, appended to its cache at its own
        length: ((rows, vocab) logits at each row's last new position, the cache). Every length at least 1."""
        assert cache.self_len is not None
        if ids.shape[0] != len(cache.self_len) or len(lengths) != ids.shape[0]:
            raise ValueError(f"{ids.shape[0]} rows of ids, {len(lengths)} lengths, {len(cache.self_len)} cache rows")
        if (lengths < 1).any() or (lengths > ids.shape[1]).any():
            raise ValueError("each row's length must be between 1 and the width of its ids")
        start = cache.self_len
        # In place, the operator needs room for the whole padded chunk after each row's cache.
        needed = int(start.max()) + ids.shape[1] if self.in_place else int((start + lengths).max())
        buffers = self._room(cache, needed)
        feed = {
            self.ids_name: np.ascontiguousarray(ids, dtype=np.int64),
            self.input_length_name: np.asarray(lengths, dtype=np.int64),
            self.past_length_name: start,
        }
        if self.in_place:
            buffers = tuple(np.ascontiguousarray(b, dtype=np.float32) for b in buffers)  # bound by address
            logits = self._run_in_place(feed, buffers)
            return logits, replace(cache, self_kv=buffers, self_len=start + lengths)
        feed.update(zip(self.past_names, buffers, strict=True))
        logits, *new = self.decoder.run(self.out_names, feed)
        if ids.shape[1] == 1:  # a step: each row's one new key or value at its own length
            rows = np.arange(len(start))
            for buffer, kv in zip(buffers, new, strict=True):
                buffer[rows, :, start] = kv[:, :, 0]
        else:
            for r, (at, n) in enumerate(zip(start.tolist(), lengths.tolist(), strict=True)):
                for buffer, kv in zip(buffers, new, strict=True):
                    buffer[r, :, at : at + n] = kv[r, :, :n]
        return logits, replace(cache, self_kv=buffers, self_len=start + lengths)

    def _run_in_place(self, feed: dict[str, np.ndarray], buffers: tuple[np.ndarray, ...]) -> np.ndarray:
        """Run the graph with each buffer bound as both its `past_*` input and its `present_*` output, so that the
        graph writes the new positions into it; returns the logits (rows, vocab)."""
        binding = self._binding(buffers)
        for name, array in feed.items():
            binding.bind_cpu_input(name, array)
        # The logits into an array of our own: no OrtValue per output to wrap and convert after the run.
        logits = np.empty((len(buffers[0]), self.vocab_size), dtype=np.float32)
        binding.bind_output(self.out_names[0], "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        self.decoder.run_with_iobinding(binding)
        return logits

    def _binding(self, buffers: tuple[np.ndarray, ...]) -> Any:
        """An IOBinding with the buffers bound (the `present_*` outputs to the `past_*` inputs' memory). Steps of
        an unchanged batch run on the same buffers: the previous step's binding is reused, and only the small
        inputs and the logits are bound again (rebinding 2 x layers buffers was most of a step's Python)."""
        key = tuple((b.ctypes.data, b.shape) for b in buffers)
        bound = getattr(self._bound, "last", None)
        if bound is not None and bound[0] == key:
            return bound[1]
        binding = self.decoder.io_binding()
        for past, present, buffer in zip(self.past_names, self.out_names[1:], buffers, strict=True):
            shape, address = list(buffer.shape), buffer.ctypes.data
            binding.bind_input(past, "cpu", 0, np.float32, shape, address)
            binding.bind_output(present, "cpu", 0, np.float32, shape, address)
        # The binding holds addresses, not arrays: buffers at the same addresses and shapes bind the same way,
        # whatever arrays they are now, and a finished batch's buffers are not kept alive by it.
        self._bound.last = (key, binding)
        return binding

    def _room(self, cache: Cache, needed: int) -> tuple[np.ndarray, ...]:
        """The cache's buffers, grown (copied) when a row needs more than their capacity, to whole KEY_BLOCKs."""
        buffers = cache.self_kv
        capacity = buffers[0].shape[2]
        if needed <= capacity:
            return buffers
        filled = int(cache.self_len.max(initial=0)) if cache.self_len is not None else capacity
        grow_to = max(aligned(needed), next_capacity(filled, cache.max_positions))
        return tuple(grown(b, filled, grow_to) for b in buffers)


class Prompts:
    """A translation request as the model's prompt: the family's messages (architectures/decoder_only.py) through
    the directory's chat template, tokenized in one call without added special tokens."""

    def __init__(self, directory: Path, manifest: Manifest, tokenizer: JsonTokenizer | None = None) -> None:
        self.languages = manifest.languages
        self.template = ChatTemplate.from_dir(directory)
        self.tokenizer = tokenizer or JsonTokenizer.from_dir(directory)

    def text(self, text: str, source: str | None, target: str, **request: Any) -> str:
        """`request`: a glossary or context (architectures.decoder_only.prompt_messages)."""
        return render_prompt(self.template, self.languages, text, source, target, **request)

    def ids(self, text: str, source: str | None, target: str, **request: Any) -> list[int]:
        return self.tokenizer.prompt_ids(self.text(text, source, target, **request))

    def render(self, text: str, prompt: Prompt) -> str:
        """The prompt text of `text` under a chat `Prompt` (its language pair, glossary and context)."""
        assert prompt.chat is not None
        return self.text(text, *prompt.chat, glossary=prompt.glossary, context=prompt.context)

    def encode(self, text: str, prompt: Prompt) -> list[int]:
        return self.tokenizer.prompt_ids(self.render(text, prompt))


def check_prompt_lengths(texts: Sequence[str], prompts: Sequence[Sequence[int]], limit: int) -> None:
    """ValueError for a prompt past `limit`, the most tokens the model takes (its tokenizer's model_max_length, at
    most its positions). A decoder-only prompt is never truncated, as transformers' apply_chat_template does not
    truncate it: its end is the turn the model answers. Past its positions the model would run where it was never
    trained, on a cache that grows with the prompt; so a prompt too long is refused before any of it runs."""
    for text, ids in zip(texts, prompts, strict=True):
        if len(ids) > limit:
            shown = text if len(text) <= 40 else text[:40] + "..."
            raise ValueError(
                f"the prompt of {shown!r} has {len(ids)} tokens (the chat template around the text, with its "
                f"glossary terms or context); this model takes at most {limit}: shorten the text, the glossary or "
                "the context (documents and `onnxmt translate` cut a long text to fit)"
            )


def right_padded(prompts: Sequence[Sequence[int]], pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Prompts as one (rows, longest) int64 matrix padded on the right with `pad`, and their lengths."""
    lengths = np.array([len(p) for p in prompts], dtype=np.int64)
    ids = np.full((len(prompts), int(lengths.max())), pad, dtype=np.int64)
    for r, prompt in enumerate(prompts):
        ids[r, : len(prompt)] = prompt
    return ids, lengths
