"""What a request and a batch may cost, in tokens x beams, per model: --max-request-cost and --max-batch-cost, each
capped by --max-cache-mb over the bytes of attention cache one token x beam holds in that model."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ..manifest import Manifest
from ..runtime.translator import Prepared
from .options import ServeOptions
from .protocol import ApiError


class CostLimits(NamedTuple):
    """A model's limits in tokens x beams (None: none)."""

    cache_bytes_per_token: int  # attention-cache bytes one token x beam may hold (cache_bytes_per_cost)
    cap: int | None  # --max-cache-mb over that
    request: int | None  # --max-request-cost, capped
    batch: int | None  # --max-batch-cost, capped


def cache_bytes_per_cost(manifest: Manifest) -> int:
    """Bytes of attention cache one token x beam of cost may hold: K and V, fp32, in every decoder layer. A
    generated token holds them in the self-attention cache of each beam; a source token in the cross-attention
    K/V, once per sentence (so counting it per beam, as the cost does, bounds it from above). A decoder-only model
    with grouped-query attention caches its `num_kv_heads`, fewer than its query heads: counted by its query heads,
    HY-MT1.5-1.8B's cap would be a quarter of what --max-cache-mb holds, and five 1,500-token prompts would fill
    its batch."""
    m = manifest.model
    heads = int(m.get("num_kv_heads") or m["num_heads"])
    return int(m["num_layers"]) * 2 * heads * int(m["head_dim"]) * 4


def cost_limits(manifest: Manifest, options: ServeOptions) -> CostLimits:
    """The model's limits in tokens x beams: --max-request-cost and --max-batch-cost, each capped by
    --max-cache-mb over the model's cache bytes per token x beam."""
    o = options
    per_token = cache_bytes_per_cost(manifest)
    cap = max(1, int(o.max_cache_mb * 2**20) // per_token) if o.max_cache_mb else None
    request, batch = _least(o.max_request_cost or None, cap), _least(o.max_batch_cost or None, cap)
    return CostLimits(per_token, cap, request, batch)


def smallest_request_limit(manifests: Iterable[Manifest], options: ServeOptions) -> int | None:
    """The lowest request limit of the models (what a document's requests are cut by, whichever model reads
    them)."""
    limits = [cost_limits(m, options).request for m in manifests]
    return min((x for x in limits if x is not None), default=None)


def check_cost(prepared: Sequence[Prepared], manifest: Manifest, options: ServeOptions) -> None:
    """ApiError 413 when the request's cost in tokens x beams is above the model's request limit."""
    cost = sum(p.cost for p in prepared)
    limits = cost_limits(manifest, options)
    limit = limits.request
    if limit and cost > limit:
        settings = prepared[0].settings
        if limits.cap == limit:
            why = (
                f"max_cache_mb: {options.max_cache_mb:g} MB of attention caches at "
                f"{limits.cache_bytes_per_token / 1024:g} KB per token x beam in this model"
            )
        else:
            why = "max_request_cost"
        raise ApiError(
            413,
            f"request too large: it costs {cost} tokens x beams ((source tokens + {settings.max_length - 1} "
            f"new tokens) x {settings.num_beams} beams, over {len(prepared)} texts); the limit is {limit} "
            f"({why}): send fewer or shorter texts, fewer beams or a lower max_new_tokens",
        )


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)
