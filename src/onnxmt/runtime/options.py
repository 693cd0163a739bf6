"""Frozen option dataclasses shared by the library, the CLI and the service."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from ..layout import canonical_variant


@dataclass(frozen=True)
class RuntimeOptions:
    """How ONNX Runtime runs the graphs.

    threads: intra-op threads per session (None: one per core). spinning: let idle ORT threads busy-wait; off by
    default because on small machines the spinning threads steal the cores the work needs (measured 38-50% slower
    at batch 1 on 2 cores). verify: check every file's sha256 against the manifest when loading. variant: which
    graphs of an Optimum or Transformers.js directory to load (fp32, quantized or q8, int8, uint8, q4, bnb4, fp16,
    q4f16); None takes fp32 if present, else the first complete one of layout.DEFAULT_VARIANT_ORDER.
    """

    threads: int | None = None
    spinning: bool = False
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    verify: bool = True
    variant: str | None = None

    def __post_init__(self) -> None:
        if self.variant is not None:
            canonical_variant(self.variant)  # ValueError naming the valid ones, before anything is loaded


@dataclass(frozen=True)
class DecodeOptions:
    """Decoding settings. None means: take the model's generation default from the manifest (as transformers does).

    beams: 1 is greedy search. max_new_tokens takes precedence over max_length (which counts the decoder start
    token, as in transformers). min_new_tokens = max_new_tokens forces an exact output length (benchmarks).
    target_lang: a target language of a multi-target model ("cmn_Hans", "zho_Hans"), or its token (">>cmn_Hans<<").
    source_lang: the source language of a model told it by a token (NLLB's "eng_Latn", M2M100's "en"); None: the
    model's default source (transformers' tokenizer default).
    renormalize_logits: log-softmax the beam scores again after the logits processors (the model's
    generation_config decides by default; opus-mt models set it). max_batch_cost: most tokens x beams per decoder
    batch (source tokens + max new tokens, times beams, summed over its texts; None: no budget), which bounds the
    decoder's memory; batches are cut at `batch_size` texts or this budget, whichever comes first.
    """

    beams: int | None = None
    max_new_tokens: int | None = None
    max_length: int | None = None
    min_new_tokens: int | None = None
    min_length: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    no_repeat_ngram_size: int | None = None
    repetition_penalty: float | None = None
    renormalize_logits: bool | None = None
    num_return_sequences: int = 1
    batch_size: int = 16
    target_lang: str | None = None
    max_batch_cost: int | None = None
    source_lang: str | None = None

    def merged(self, **overrides: Any) -> DecodeOptions:
        """A copy with the non-None overrides applied; unknown names raise TypeError."""
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown decoding option(s) {sorted(unknown)}; valid: {sorted(known)}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})
