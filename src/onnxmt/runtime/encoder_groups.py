"""How a batch's rows are grouped for the encoder: by length, in the groups that cost the fewest padded tokens
plus what each more encoder call costs (which depends on the encoder's threads)."""

from __future__ import annotations

import itertools

import numpy as np

# What one more encoder call costs, in padded source tokens: a call's fixed work and the smaller matrices' lower
# throughput. On NLLB-600M's shape (int8, 2 threads) the 32 FLORES sentences of the benchmark (14-69 tokens) took
# 4.9 s in one call (2208 padded tokens), 2.7 s in 4 groups of 8 (1384), 3.1 s in 8 groups of 4 (1288) and 3.1 s
# one by one (1202): below a few hundred tokens a call, fewer padded tokens stop paying.
ENCODER_CALL_TOKENS = 128
# An encoder on one thread has no thread pool to start and join at each operator, so a call costs far less: on
# opus-mt's shape (int8, 1 thread) 192 FLORES sentences in arrival-order pools of 16 took 1,029 ms with 16 tokens a
# call, 1,161 ms with 128; sorted, 940 against 955 ms (benchmarks/encoder_pools.py; of 0-256 tokens a call, 8-16
# were the fastest). On 2 threads 128 stays: 692 against 708 ms.
SINGLE_THREAD_CALL_TOKENS = 16


def encoder_call_tokens(threads: int) -> int:
    """What one more encoder call costs, in padded source tokens, for an encoder on `threads` threads."""
    return SINGLE_THREAD_CALL_TOKENS if threads == 1 else ENCODER_CALL_TOKENS


def encoder_groups(attention_mask: np.ndarray, call_tokens: int = ENCODER_CALL_TOKENS) -> list[tuple[np.ndarray, int]]:
    """The batch's rows in groups of similar length for the encoder, each with its width (its longest row): the
    grouping of rows by length with the fewest padded tokens plus `call_tokens` per group (a shortest path over
    the rows sorted by length). A batch whose masks are not right-padded stays one group at its full width."""
    lengths = attention_mask.sum(axis=1)
    width = attention_mask.shape[1]
    one = [(np.arange(len(lengths)), width)]
    if len(lengths) < 2 or not (attention_mask == (np.arange(width) < lengths[:, None])).all():
        return one
    order = np.argsort(lengths, kind="stable")
    ordered = lengths[order].tolist()
    n = len(ordered)
    # best[j]: the least cost of the first j rows (in length order); cut[j]: where its last group starts.
    best, cut = [0] * (n + 1), [0] * (n + 1)
    for j in range(1, n + 1):
        best[j], cut[j] = min((best[i] + (j - i) * ordered[j - 1] + call_tokens, i) for i in range(j))
    bounds = [n]
    while bounds[-1] > 0:
        bounds.append(cut[bounds[-1]])
    bounds.reverse()
    if len(bounds) == 2:
        return one
    return [(np.sort(order[a:b]), max(int(ordered[b - 1]), 1)) for a, b in itertools.pairwise(bounds)]
