"""Frozen option dataclasses shared by the library, the CLI and the service."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class BatchLimits:
    """What runs at once, apart from how each text is decoded (`DecodeOptions`): texts per decoder batch, and
    tokens x beams (None: no budget). For the scheduler (runtime/scheduler.py): `max_skip_age`, how many seconds a
    waiting request may be passed by later ones that fit before it; `reserve`, places past `batch_size` kept for
    requests holding less than their share while another holds more (None: an eighth of `batch_size`, at least
    1)."""

    batch_size: int = option(16, help="Texts per decoder batch.", min=1)
    # Which bounds the decoder's memory: batches are cut at `batch_size` texts or this budget, whichever comes first.
    max_batch_cost: int | None = option(
        None,
        help="Most tokens x beams per decoder batch (source tokens + max new tokens, times beams, summed over its "
        "texts; default: no budget).",
    )
    # The service's --max-skip-ms and --reserved-texts (ServeOptions) say these; a library call keeps the defaults.
    max_skip_age: float = 2.0
    reserve: int | None = None

    def __post_init__(self) -> None:
        check(self)

    @property
    def reserved(self) -> int:
        return max(1, self.batch_size // 8) if self.reserve is None else self.reserve


# A glossary as a call takes it: (source term, target term) pairs, or a {source: target} mapping.
Glossary = Sequence[tuple[str, str]] | Mapping[str, str]


@dataclass(frozen=True)
class CallOptions:
    """How one call's texts are translated, apart from how they are batched (`BatchLimits`): what
    `Translator.prepare` takes, and `Translator.translate`'s keyword arguments of the same names.

    `source_lang`, `target_lang`: one code for all texts, or one per text (None: the model's defaults).
    `glossary`, `context`: what a family with prompts for them (HY-MT) puts in each text's prompt.
    `options`: the decoding options (None: the translator's)."""

    source_lang: str | Sequence[str | None] | None = None
    target_lang: str | Sequence[str | None] | None = None
    glossary: Glossary = ()
    context: str | None = None
    options: DecodeOptions | None = None

    def over(self, keywords: Mapping[str, Any]) -> tuple[CallOptions, dict[str, Any]]:
        """The keyword arguments naming a field of CallOptions over this one, and the others (decoding options,
        batch limits) apart."""
        names = {f.name for f in fields(CallOptions)}
        mine = {name: value for name, value in keywords.items() if name in names}
        return replace(self, **mine), {name: value for name, value in keywords.items() if name not in names}


# The batch limits a call may set by keyword (the scheduler's fairness settings are the service's).
CALL_LIMITS = ("batch_size", "max_batch_cost")


def decode_options(decoding: DecodeOptions, keywords: Mapping[str, Any]) -> DecodeOptions:
    """`decoding` with a call's keyword arguments over it (`prepare(texts, beams=4)`), None keeping its value;
    TypeError naming the valid names for another."""
    _check_names(keywords, [f.name for f in fields(DecodeOptions)])
    return replace(decoding, **{name: value for name, value in keywords.items() if value is not None})


def call_options(
    decoding: DecodeOptions, batching: BatchLimits, keywords: Mapping[str, Any]
) -> tuple[DecodeOptions, BatchLimits]:
    """A call's keyword arguments (`translate(texts, beams=4, batch_size=8)`) over its options, as typed options:
    each name a field of `DecodeOptions` or one of `CALL_LIMITS`, None keeping the value given; TypeError naming
    the valid names for another. The one place where keyword arguments become options: the public API's edge."""
    _check_names(keywords, [f.name for f in fields(DecodeOptions)] + list(CALL_LIMITS))
    limits = {name: value for name, value in keywords.items() if name in CALL_LIMITS and value is not None}
    decode = {name: value for name, value in keywords.items() if name not in CALL_LIMITS}
    return decode_options(decoding, decode), replace(batching, **limits)


def _check_names(keywords: Mapping[str, Any], valid: list[str]) -> None:
    unknown = set(keywords) - set(valid)
    if unknown:
        raise TypeError(f"unknown decoding option(s) {sorted(unknown)}; valid: {sorted(valid)}")
