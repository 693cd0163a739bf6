"""Does a sentence's translation depend on what it is batched with? The check `validate` and `eval` report.

In fp32 it does not (padding moves some logits by ~1e-6, below any measured token change). In dynamic int8 it can:
`DynamicQuantizeLinear` computes one activation scale over the whole batch tensor, so batch-mates move the rounding
grid of every row, and at a near-tie a token flips (docs/serve.md). `onnxmt quantize --per-row-scales` gives each
row its own scale. This module measures the rate on a bounded sample: each sentence alone, then the same sentences
shuffled into batches, as the service's micro-batcher mixes concurrent requests.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..manifest import Manifest
from ..options import check, option
from .capabilities import activation_scales
from .options import DecodeOptions
from .translator import Translator, resolve_settings

SAMPLE = 32  # sentences: ~5 s at batch 1 for opus-mt's architecture in int8 on 2 cores, greedy
BATCH_SIZE = 8


@dataclass(frozen=True)
class InvarianceOptions:
    """Whether `validate` and `eval` run the check, and on how many sentences."""

    batch_check: bool | None = option(
        None,
        help="Also translate a sample alone and in shuffled batches and report how many sentences agree (default: "
        "only for dynamic int8, whose activation scales depend on the batch).",
        flags=("--batch-check/--no-batch-check",),
    )
    batch_sample: int = option(
        SAMPLE, help=f"Sentences the batch check translates (alone, then in batches of {BATCH_SIZE}).", min=1
    )

    def __post_init__(self) -> None:
        check(self)

    def wanted(self, manifest: Manifest) -> bool:
        """Asked for, or not refused and the directory is dynamic int8."""
        return bool(self.batch_check or (self.batch_check is None and activation_scales(manifest)))


@dataclass(frozen=True)
class BatchInvariance:
    """How many sentences of a sample got the same tokens alone and in shuffled batches."""

    sentences: int
    identical: int
    batch_size: int
    beams: int
    scales: str | None  # the directory's activation scales (None: not dynamic int8)

    @property
    def rate(self) -> float:
        return self.identical / self.sentences if self.sentences else 1.0

    def describe(self) -> str:
        """e.g. "96.9% of sentences (31/32; alone vs shuffled batches of 8, int8 per-tensor scales)"."""
        kind = f"int8 {self.scales.replace(' ', '-')} scales" if self.scales else "not dynamic int8"
        return (
            f"{self.rate:.1%} of sentences ({self.identical}/{self.sentences}; alone vs shuffled batches of "
            f"{self.batch_size}, {kind})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate": self.rate}


def batch_invariance(
    translator: Translator,
    texts: Sequence[str],
    *,
    sample: int = SAMPLE,
    batch_size: int = BATCH_SIZE,
    seed: int = 0,
    options: DecodeOptions | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
) -> BatchInvariance:
    """Translate up to `sample` non-empty `texts` one at a time and in shuffled batches of `batch_size` (each
    sorted by length inside, as `translate` does); count the sentences whose tokens are the same both ways.
    `options`: the decoding options (default: the translator's); the language pair as `Translator.translate`
    takes it."""
    if sample < 1 or batch_size < 2:
        raise ValueError(f"sample must be at least 1 and batch_size at least 2, got {sample} and {batch_size}")
    chosen = [t for t in texts if t.strip()][:sample]
    options = options or translator.decoding

    def translated(group: list[str], size: int) -> list[list[int]]:
        batching = replace(translator.batching, batch_size=size)
        translations = translator.translate(
            group, source_lang=source_lang, target_lang=target_lang, options=options, batching=batching
        )
        return [t.token_ids for t in translations]

    alone = [translated([t], 1)[0] for t in chosen]
    order = list(range(len(chosen)))
    random.Random(seed).shuffle(order)
    batched: dict[int, list[int]] = {}
    for start in range(0, len(order), batch_size):
        group = order[start : start + batch_size]
        batched.update(zip(group, translated([chosen[i] for i in group], batch_size), strict=True))
    identical = sum(alone[i] == batched[i] for i in order)
    used = resolve_settings(translator.manifest, options).num_beams
    return BatchInvariance(len(chosen), identical, batch_size, used, activation_scales(translator.manifest))
