"""ONNX Runtime sessions for the encoder and decoder graphs, behind one small interface.

`encode(ids, mask)` returns a `Cache`; `step(tokens, cache)` runs one decoder call and returns the last-position
logits and the grown cache. The decoding loop sees only that, whatever the directory's layout:

- onnxmt's own: the encoder also returns every layer's cross-attention K/V; one decoder graph takes an empty or
  filled self-attention cache, and returns it grown by the new positions, or (exported with `--cache-buffer`) takes
  a buffer per layer that this module grows and writes the new positions into.
- Optimum's: `decoder_model.onnx` for the first step (it returns the cross-attention K/V), then
  `decoder_with_past_model.onnx`; or `decoder_model_merged.onnx` with its `use_cache_branch` switch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..manifest import GraphSpec, Manifest
from .cache import Cache, grown, next_capacity, whole_blocks
from .encoder_groups import encoder_call_tokens, encoder_groups
from .options import RuntimeOptions
from .sessions import load_session, release_memory
from .vocab import VocabOps


class Graphs:
    """Common part: names by role from the manifest, empty caches of the right shape, the vocabulary ops."""

    encoder: Any  # the encoder's ONNX Runtime session
    per_row = False  # the decoder takes one cache length per row (format 4)
    per_sentence = False  # one cross-attention K/V per sentence, broadcast over its beams
    decoder_only = False  # no encoder: a prompt prefilled into the decoder's cache (runtime/decoder_only.py)

    def __init__(self, manifest: Manifest, options: RuntimeOptions) -> None:
        self.ops = VocabOps(options)
        self.layers = int(manifest.model["num_layers"])
        self.heads = int(manifest.model["num_heads"])
        self.head_dim = int(manifest.model["head_dim"])

    def empty_self_kv(self, rows: int, capacity: int = 0) -> tuple[np.ndarray, ...]:
        """Per layer key, value: (rows, heads, capacity, head_dim) zeros, each its own array (buffers are written)."""
        shape = (rows, self.heads, capacity, self.head_dim)
        return tuple(np.zeros(shape, dtype=np.float32) for _ in range(2 * self.layers))

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, max_positions: int | None = None) -> Cache:
        """The encoder's cache for a batch; `max_positions`: the most decoder positions that will be stepped (a
        self-attention cache buffer is never grown past it), None if not known."""
        raise NotImplementedError

    def step(self, tokens: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        raise NotImplementedError

    def encode_each(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> list[tuple[np.ndarray, ...]]:
        """Each row's cross-attention K/V, cut to its length (right-padded masks): per layer key, value
        (1, heads, length, head_dim). What `encode` gives that row; for the running batch (onnxmt's graphs)."""
        raise NotImplementedError


def _kv_roles(prefix: str, layers: int) -> list[str]:
    return [f"{prefix}_{kv}.{i}" for i in range(layers) for kv in ("key", "value")]


class OnnxmtGraphs(Graphs):
    def __init__(self, directory: Path, manifest: Manifest, options: RuntimeOptions) -> None:
        super().__init__(manifest, options)
        enc, dec = manifest.graphs["encoder"], manifest.graphs["decoder"]
        # The decoder first: prepacking its LM head from the embedding is the largest transient of loading, so it
        # comes with nothing else loaded yet; what it no longer needs is given back before the encoder.
        self.decoder = load_session(directory / dec.file, options)
        release_memory(directory, trim=False)
        self.encoder = load_session(directory / enc.file, options, encoder=True)
        release_memory(directory)
        self.call_tokens = encoder_call_tokens(self.encoder.get_session_options().intra_op_num_threads)
        self.enc_in = (enc.input_name("input_ids"), enc.input_name("attention_mask"))
        self.enc_out = [enc.output_name(r) for r in _kv_roles("cross", self.layers)]
        self.dec_ids, self.dec_mask = dec.input_name("input_ids"), dec.input_name("encoder_attention_mask")
        self.dec_past = [dec.input_name(r) for r in _kv_roles("past", self.layers)]
        self.dec_cross = [dec.input_name(r) for r in _kv_roles("cross", self.layers)]
        # Buffered: the graph reads `past_length` positions of the buffers and returns the new token's K/V.
        self.buffered = dec.has_input("past_length")
        self.dec_length = dec.input_name("past_length") if self.buffered else None
        # Format 4: one length per row (rows of different lengths may share a call); before: one for all rows.
        self.per_row = dec.per_row_positions()
        returned = _kv_roles("new" if self.buffered else "present", self.layers)
        self.dec_out = [dec.output_name("logits")] + [dec.output_name(r) for r in returned]
        # Exports before this flag existed take the cross-attention K/V repeated per beam.
        self.per_sentence = bool(manifest.model.get("cross_kv_per_sentence", False))

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, max_positions: int | None = None) -> Cache:
        """The encoder runs once per group of rows of similar length (`encoder_groups`), each cut to its own longest
        row, and the groups' cross-attention K/V are joined at the batch's width, zero past each group's width (where
        its rows' masks are 0). A float encoder gives each row the same values as one call over the whole batch."""
        input_ids, attention_mask = whole_blocks(input_ids), whole_blocks(attention_mask)  # see KEY_BLOCK
        groups = encoder_groups(attention_mask, self.call_tokens)
        cross: list[np.ndarray] = []
        for rows, width, out in self._encoder_runs(input_ids, attention_mask, groups):
            if len(groups) == 1:
                cross = out
                break
            if not cross:  # (rows, heads, src_len, head_dim) each
                shape = (len(input_ids), out[0].shape[1], input_ids.shape[1], out[0].shape[3])
                cross = [np.zeros(shape, o.dtype) for o in out]
            for joined, part in zip(cross, out, strict=True):
                joined[rows, :, :width] = part
            del out
        # Buffers have room for the first step only; they grow at the second step (next_capacity).
        return Cache(
            mask=attention_mask,
            self_kv=self.empty_self_kv(len(input_ids), capacity=1 if self.buffered else 0),
            cross_kv=tuple(cross),
            per_sentence=self.per_sentence,
            self_len=np.zeros(len(input_ids), dtype=np.int64) if self.buffered else None,
            max_positions=max_positions,
        )

    def _encoder_runs(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, groups: list[tuple[np.ndarray, int]]
    ) -> Iterator[tuple[np.ndarray, int, list[np.ndarray]]]:
        """The encoder run on each group of rows (`encoder_groups`): (the group's rows, its width, its outputs)."""
        if len(groups) == 1:
            feed = dict(zip(self.enc_in, (input_ids, attention_mask), strict=True))
            yield np.arange(len(input_ids)), input_ids.shape[1], self.encoder.run(self.enc_out, feed)
            return
        for rows, width in groups:
            feed_rows = (input_ids[rows, :width], attention_mask[rows, :width])  # fancy indexing: contiguous copies
            yield rows, width, self.encoder.run(self.enc_out, dict(zip(self.enc_in, feed_rows, strict=True)))

    def encode_each(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> list[tuple[np.ndarray, ...]]:
        """As `Graphs.encode_each`: views into each group's own outputs, the groups not joined at the
        batch's width (texts that join a running batch are written into its buffers one by one, so the joined
        arrays would be one copy more)."""
        lengths = attention_mask.sum(axis=1).tolist()
        each: list[tuple[np.ndarray, ...]] = [()] * len(input_ids)
        groups = encoder_groups(attention_mask, self.call_tokens)
        for rows, _, out in self._encoder_runs(input_ids, attention_mask, groups):
            for j, i in enumerate(rows.tolist()):
                each[i] = tuple(a[j : j + 1, :, : lengths[i]] for a in out)
        return each

    def step(self, tokens: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        """Buffered graphs: one token per row; the new K/V are written into the cache's buffers at its length (or
        into grown copies). The cache passed in stays valid (its positions are not touched), but the one returned
        shares its buffers: stepping the cache passed in again overwrites the returned one's last position."""
        assert cache.cross_kv is not None
        feed = {self.dec_ids: tokens, self.dec_mask: cache.mask}
        feed.update(zip(self.dec_cross, cache.cross_kv, strict=True))
        if not self.buffered:
            feed.update(zip(self.dec_past, cache.self_kv, strict=True))
            logits, *present = self.decoder.run(self.dec_out, feed)
            return logits, replace(cache, self_kv=tuple(present))  # logits: (rows, vocab)
        if tokens.shape[1] != 1:
            raise ValueError(f"this decoder graph takes one new token per row, got {tokens.shape[1]}")
        assert cache.self_len is not None and self.dec_length is not None  # encode() made a buffered cache
        lengths = cache.self_len
        filled = int(lengths.max(initial=0))
        buffers = cache.self_kv
        if filled == buffers[0].shape[2]:
            capacity = next_capacity(filled, cache.max_positions)
            buffers = tuple(grown(b, filled, capacity) for b in buffers)
        if not self.per_row and (lengths != filled).any():
            raise ValueError("this decoder graph takes one cache length for all rows (exported before format 4)")
        feed.update(zip(self.dec_past, buffers, strict=True))
        feed[self.dec_length] = lengths if self.per_row else np.array([filled], dtype=np.int64)
        logits, *new = self.decoder.run(self.dec_out, feed)
        rows = np.arange(len(lengths))
        for buffer, kv in zip(buffers, new, strict=True):
            buffer[rows, :, lengths] = kv[:, :, 0]  # each row's new key or value at its own length
        return logits, replace(cache, self_kv=buffers, self_len=lengths + 1)


class OptimumGraphs(Graphs):
    """Optimum's files: the first step computes the cross-attention K/V, later steps reuse them.

    fp16 graphs (Optimum `--dtype fp16`, some Transformers.js `_fp16`, `_q4f16`) take and return float16 states and
    caches: every float input is fed in the dtype its graph declares (only the empty first-step caches and the
    placeholders, made here in float32, are cast; what the graphs return stays in their dtype between steps), and the
    logits are returned as float32 for the decoding loop.
    """

    def __init__(
        self, directory: Path, manifest: Manifest, options: RuntimeOptions, sessions: dict[str, Any] | None = None
    ) -> None:
        super().__init__(manifest, options)
        self.specs = manifest.graphs
        self.d_model = int(manifest.model["d_model"])
        opened = sessions or {}

        def session(part: str) -> Any:
            file = self.specs[part].file
            if file in opened:
                return opened[file]
            return load_session(directory / file, options, encoder=part == "encoder")

        self.encoder = session("encoder")
        self.float_inputs = {part: _float_inputs(spec) for part, spec in self.specs.items()}
        self.merged = "decoder_merged" in self.specs
        if self.merged:
            self.first = self.later = session("decoder_merged")
        else:
            self.first, self.later = session("decoder"), session("decoder_with_past")
        release_memory(directory)

    def _part(self, first: bool) -> str:
        if self.merged:
            return "decoder_merged"
        return "decoder" if first else "decoder_with_past"

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, max_positions: int | None = None) -> Cache:
        spec = self.specs["encoder"]
        feed = {spec.input_name("input_ids"): input_ids, spec.input_name("attention_mask"): attention_mask}
        (states,) = self.encoder.run([spec.output_name("encoder_hidden_states")], feed)
        return Cache(mask=attention_mask, self_kv=(), cross_kv=None, encoder_states=states)

    def step(self, tokens: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        first = cache.cross_kv is None
        part = self._part(first)
        spec = self.specs[part]
        feed: dict[str, np.ndarray] = {spec.input_name("input_ids"): tokens}
        if spec.has_input("encoder_attention_mask"):
            feed[spec.input_name("encoder_attention_mask")] = cache.mask
        if spec.has_input("encoder_hidden_states"):
            states = cache.encoder_states if first else self._placeholder_states(len(tokens))
            assert states is not None
            feed[spec.input_name("encoder_hidden_states")] = states
        if spec.has_input("use_cache_branch"):
            feed[spec.input_name("use_cache_branch")] = np.array([not first])
        if spec.has_input("past_key.0"):
            rows = len(tokens)
            self_kv = self.empty_self_kv(rows) if first else cache.self_kv
            cross_kv = self._placeholder_cross(rows) if first else cache.cross_kv
            feed.update(zip((spec.input_name(r) for r in _kv_roles("past", self.layers)), self_kv, strict=True))
            assert cross_kv is not None
            feed.update(zip((spec.input_name(r) for r in _kv_roles("cross", self.layers)), cross_kv, strict=True))
        for name, dtype in self.float_inputs[part].items():
            if name in feed and feed[name].dtype != dtype:
                feed[name] = feed[name].astype(dtype)
        wanted = ["logits", *_kv_roles("present", self.layers)]
        if first:
            wanted += _kv_roles("cross", self.layers)
        outputs = (self.first if first else self.later).run([spec.output_name(r) for r in wanted], feed)
        # Every position (rows, new_len, vocab), maybe in fp16: the last one, as float32.
        logits = np.ascontiguousarray(outputs[0][:, -1, :], dtype=np.float32)
        present = tuple(outputs[1 : 1 + 2 * self.layers])
        cross = tuple(outputs[1 + 2 * self.layers :]) if first else cache.cross_kv
        # The encoder states are not needed once the cross-attention K/V exist.
        return logits, Cache(mask=cache.mask, self_kv=present, cross_kv=cross)

    def _placeholder_cross(self, rows: int) -> tuple[np.ndarray, ...]:
        # The merged graph's first-step branch ignores its past inputs, but they must be fed.
        return self.empty_self_kv(rows)

    def _placeholder_states(self, rows: int) -> np.ndarray:
        # Likewise its later-step branch ignores the encoder states (it has the cross-attention K/V): an empty
        # array instead of carrying (rows, src_len, d_model) through every step.
        return np.zeros((rows, 0, self.d_model), dtype=np.float32)


def _float_inputs(spec: GraphSpec) -> dict[str, np.dtype]:
    """Name -> dtype of a graph's floating-point inputs (states, caches)."""
    return {t.name: np.dtype(t.dtype) for t in spec.inputs if t.dtype in ("float32", "float16")}
