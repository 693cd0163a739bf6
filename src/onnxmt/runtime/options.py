"""Frozen option dataclasses shared by the library, the CLI and the service."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from ..layout import canonical_variant
from ..options import check, option


@dataclass(frozen=True)
class RuntimeOptions:
    """How ONNX Runtime runs the graphs."""

    threads: int | None = option(None, help="ONNX Runtime intra-op threads (default: all cores).")
    # The service encodes waiting requests while the decoder steps (serve/inflight.py): an encoder on every core
    # beside a decoder on every core oversubscribes them. On 2 cores, 2 encoder threads gave 0.94-1.00x the tokens/s
    # of 1 under 32 and 64 clients (docs/benchmarks.md, "The encoder beside the decoder").
    encoder_threads: int | None = option(
        None,
        help="ONNX Runtime intra-op threads of the encoder (default in `onnxmt serve`: half of --threads, at least "
        "1, for a model batched in flight, whose encoder runs beside the decoder; --threads otherwise).",
        min=1,
    )
    # Off by default because on small machines the spinning threads steal the cores the work needs (measured
    # 38-50% slower at batch 1 on 2 cores); `onnxmt tune` measures it.
    spinning: bool = option(False, help="Let idle ONNX Runtime threads busy-wait for work.")
    providers: tuple[str, ...] = option(("CPUExecutionProvider",), help="ONNX Runtime execution providers.")
    verify: bool = option(True, help="Check every file's sha256 against the manifest when loading.")
    # None: fp32 if present, else the first complete one of layout.DEFAULT_VARIANT_ORDER.
    variant: str | None = option(
        None,
        help="Graphs of an Optimum/Transformers.js directory to load: fp32, quantized (q8), int8, uint8, q4, bnb4, "
        "fp16, q4f16 (default: fp32 if present, else the first of those present).",
        env=True,
    )

    def __post_init__(self) -> None:
        check(self)
        if self.variant is not None:
            canonical_variant(self.variant)  # ValueError naming the valid ones, before anything is loaded


@dataclass(frozen=True)
class DecodeOptions:
    """Decoding settings. None means: take the model's generation default from the manifest (as transformers does).
    A text's language pair is not a decoding setting: it is given with the texts (`Translator.translate`'s
    `source_lang` and `target_lang`)."""

    beams: int | None = option(None, help="Beam size (1 is greedy; default: the model's).", min=1)
    max_new_tokens: int | None = option(None, help="Most tokens to generate per text.", min=1)
    max_length: int | None = option(
        None, help="Most tokens of an output, the decoder start token counted (transformers'); max_new_tokens wins."
    )
    min_new_tokens: int | None = option(
        None, help="Fewest tokens to generate per text; = max_new_tokens: an exact output length (benchmarks)."
    )
    min_length: int | None = option(None, help="Fewest tokens of an output, the decoder start token counted.")
    length_penalty: float | None = option(
        None, help="Beam search: the exponent of the length a hypothesis's log-probability is divided by."
    )
    early_stopping: bool | str | None = option(
        None, help='Beam search: True stops at num_beams finished hypotheses; False and "never" as in transformers.'
    )
    no_repeat_ngram_size: int | None = option(None, help="No n-gram of this size is generated twice (0: any may).")
    repetition_penalty: float | None = option(
        None, help="Penalty on the logits of tokens already generated, as transformers applies it (1.0: none)."
    )
    renormalize_logits: bool | None = option(
        None, help="Log-softmax the beam scores again after the logits processors (opus-mt models set it)."
    )
    num_return_sequences: int = option(1, help="Translations returned per text, best first (at most beams).")
    batch_size: int = option(16, help="Texts per decoder batch.", min=1)
    # Which bounds the decoder's memory: batches are cut at `batch_size` texts or this budget, whichever comes first.
    max_batch_cost: int | None = option(
        None,
        help="Most tokens x beams per decoder batch (source tokens + max new tokens, times beams, summed over its "
        "texts; default: no budget).",
    )

    def __post_init__(self) -> None:
        check(self)

    def merged(self, **overrides: Any) -> DecodeOptions:
        """A copy with the non-None overrides applied; unknown names raise TypeError."""
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown decoding option(s) {sorted(unknown)}; valid: {sorted(known)}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})
