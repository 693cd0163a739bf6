"""Parity of the decoding loop with transformers' generate(), token by token, on tiny random models."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from onnxmt.runtime.cancel import CancelToken
from onnxmt.runtime.options import RuntimeOptions
from onnxmt.runtime.search import Settings, build_processors, topk
from onnxmt.runtime.translator import Translator
from onnxmt.runtime.vocab import CHUNKED_TOPK_MIN, VocabOps, chunk_length
from tests.helpers.hf import generated_ids
from tests.helpers.sentences import SENTENCES
from tests.helpers.skips import importorskip

torch = importorskip("torch")
transformers = importorskip("transformers")


@functools.cache
def hf_model(model_dir: Path) -> tuple[Any, Any]:
    return transformers.MarianTokenizer.from_pretrained(model_dir), transformers.MarianMTModel.from_pretrained(
        model_dir
    ).eval()


def reference(model_dir: Path, texts: list[str], target_token: str | None = None, **generate_kwargs) -> list[list[int]]:
    """transformers' generate() token ids under the model's generation config: decoder start dropped, trailing
    padding dropped, eos kept. Sources are truncated at the model's positions, as onnxmt does (opus-mt's
    tokenizer_config.json names no length, so MarianTokenizer alone would keep 512 tokens). Cached: several tests
    compare other batch sizes or layouts with the same reference."""
    key = tuple(sorted(generate_kwargs.items()))
    return [list(row) for row in _reference(model_dir, tuple(texts), target_token, key)]


@functools.cache
def _reference(
    model_dir: Path, texts: tuple[str, ...], target_token: str | None, kwargs: tuple[tuple[str, Any], ...]
) -> tuple[tuple[int, ...], ...]:
    generate_kwargs = dict(kwargs)
    tokenizer, model = hf_model(model_dir)
    batch = [f"{target_token} {t}" for t in texts] if target_token else list(texts)
    limit = model.config.max_position_embeddings
    encoded = tokenizer(batch, return_tensors="pt", padding=True, truncation=True, max_length=limit)
    with torch.no_grad():
        out = model.generate(**encoded, **generate_kwargs)
    return tuple(tuple(row) for row in generated_ids(out, model.generation_config.pad_token_id))


@pytest.fixture(scope="module")
def translator(tiny_onnx_dir: Path) -> Translator:
    return Translator(tiny_onnx_dir)


def test_the_fixture_carries_the_real_generation_config(tiny_hf_dir: Path) -> None:
    # What the tests below call "the model's own generation config" is opus-mt-en-zh's: renormalised beam search.
    config = transformers.GenerationConfig.from_pretrained(tiny_hf_dir)
    assert (config.num_beams, config.renormalize_logits) == (4, True)
    assert config.bad_words_ids == [[config.pad_token_id]] and config.forced_eos_token_id == 0


@pytest.mark.parametrize("batch_size", [16, 5, 1])
@pytest.mark.parametrize("beams", [1, 4])
def test_translations_match_transformers(
    translator: Translator, tiny_hf_dir: Path, beams: int, batch_size: int
) -> None:
    # batch 16: one padded batch; 5: mixed batches (sorted by length, so rows of other lengths pad each other); 1.
    if batch_size == 1:
        expected = [reference(tiny_hf_dir, [t], num_beams=beams)[0] for t in SENTENCES]
    else:
        expected = reference(tiny_hf_dir, SENTENCES, num_beams=beams)
    got = [t.token_ids for t in translator.translate(SENTENCES, beams=beams, batch_size=batch_size)]
    assert got == expected


def test_beam_search_runs_its_first_step_on_every_beam(tiny_onnx_dir: Path, tiny_hf_dir: Path) -> None:
    # At the first step every beam holds only the start token, and its rows are computed all the same, as
    # transformers does: so a sentence's first step has the matrix shapes it has in a running batch it joins
    # (tests/runtime/test_running.py checks its logits are the same there).
    translator = Translator(tiny_onnx_dir)
    rows: list[int] = []
    step = translator.graphs.step

    def counted(tokens: np.ndarray, cache):  # type: ignore[no-untyped-def]
        rows.append(len(tokens))
        return step(tokens, cache)

    translator.graphs.step = counted  # type: ignore[method-assign]
    texts = SENTENCES[:3]
    got = translator.translate(texts, beams=4, batch_size=3, max_new_tokens=6)
    assert rows[:2] == [12, 12]
    assert [t.token_ids for t in got] == reference(tiny_hf_dir, texts, num_beams=4, max_new_tokens=6)


@pytest.mark.parametrize("beams", [1, 4])
def test_cancelled_rows_leave_the_batch_at_the_next_step(tiny_onnx_dir: Path, beams: int) -> None:
    # Forced to 30 tokens, no row would finish before the limit: only the cancellation can make the batch shrink.
    translator = Translator(tiny_onnx_dir)
    forced = {"beams": beams, "batch_size": 3, "max_new_tokens": 30, "min_new_tokens": 30}
    texts = SENTENCES[:3]
    expected = translator.translate(texts, **forced)
    rows: list[int] = []
    tokens = [CancelToken() for _ in texts]
    step = translator.graphs.step

    def counted(ids: np.ndarray, cache):  # type: ignore[no-untyped-def]
        rows.append(len(ids))
        if len(rows) == 3:
            tokens[1].cancel()  # during the third step: the row leaves before the fourth
        return step(ids, cache)

    translator.graphs.step = counted  # type: ignore[method-assign]
    got = translator.translate(texts, cancel=tokens, **forced)
    assert rows[:5] == ([3, 3, 3, 2, 2] if beams == 1 else [12, 12, 12, 8, 8])  # a sentence's beams leave together
    assert len(rows) == 30
    assert got[1].cancelled and len(got[1].token_ids) == 3
    assert [t.token_ids for t in got[::2]] == [t.token_ids for t in expected[::2]]
    assert not any(t.cancelled for t in got[::2] + expected)


@pytest.mark.parametrize("beams", [1, 4])
def test_max_new_tokens_reached_and_not_reached(translator: Translator, tiny_hf_dir: Path, beams: int) -> None:
    limit = 20
    expected = reference(tiny_hf_dir, SENTENCES, num_beams=beams, max_new_tokens=limit)
    got = [t.token_ids for t in translator.translate(SENTENCES, beams=beams, max_new_tokens=limit)]
    assert got == expected
    lengths = {len(ids) for ids in got}
    # Both cases occur: some sentences stop at eos before the limit, others are cut at it (forced eos).
    assert limit in lengths and min(lengths) < limit


@pytest.mark.parametrize("beams", [1, 4])
def test_target_language_token_matches_transformers(
    tiny_multi_onnx_dir: Path, tiny_multi_hf_dir: Path, beams: int
) -> None:
    translator = Translator(tiny_multi_onnx_dir)
    for lang in ("cmn_Hans", "yue_Hant"):
        expected = reference(
            tiny_multi_hf_dir, SENTENCES, target_token=f">>{lang}<<", num_beams=beams, max_new_tokens=16
        )
        got = translator.translate(SENTENCES, beams=beams, target_lang=lang, max_new_tokens=16)
        assert [t.token_ids for t in got] == expected
    # Without a token the model sees the bare text, as transformers does.
    expected = reference(tiny_multi_hf_dir, SENTENCES, num_beams=beams, max_new_tokens=16)
    assert [t.token_ids for t in translator.translate(SENTENCES, beams=beams, max_new_tokens=16)] == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"length_penalty": 0.5, "no_repeat_ngram_size": 2},
        {"repetition_penalty": 1.3},
        {"length_penalty": 2.0, "early_stopping": True},
        {"early_stopping": "never"},
        {"min_new_tokens": 12, "max_new_tokens": 12},
    ],
)
def test_generation_options_match_transformers(translator: Translator, tiny_hf_dir: Path, kwargs: dict) -> None:
    for beams in (1, 4):
        if beams == 1 and "early_stopping" in kwargs:
            continue
        expected = reference(tiny_hf_dir, SENTENCES, num_beams=beams, **kwargs)
        got = translator.translate(SENTENCES, beams=beams, **kwargs)
        assert [t.token_ids for t in got] == expected, (beams, kwargs)


@pytest.mark.parametrize(
    "kwargs", [{"min_new_tokens": 10}, {"no_repeat_ngram_size": 3}, {"repetition_penalty": 1.3}, {"min_length": 6}]
)
@pytest.mark.parametrize("batch_size", [16, 5])
@pytest.mark.parametrize("beams", [1, 4])
def test_renormalised_search_with_processors_matches_transformers(
    translator: Translator, tiny_hf_dir: Path, beams: int, batch_size: int, kwargs: dict
) -> None:
    # Each processor removes probability mass; the model's config renormalises after them (renormalize_logits).
    expected = reference(tiny_hf_dir, SENTENCES, num_beams=beams, **kwargs)
    got = translator.translate(SENTENCES, beams=beams, batch_size=batch_size, **kwargs)
    assert [t.token_ids for t in got] == expected, (beams, batch_size, kwargs)


def test_renormalisation_changes_beams_and_is_honoured(translator: Translator, tiny_hf_dir: Path) -> None:
    # The case the real opus-mt-en-zh config hits: banned pad + min length, beam 4. On this fixture renormalising
    # changes some beams (so the parity above proves something), and both settings match transformers.
    kwargs = {"num_beams": 4, "min_new_tokens": 10}
    renormalised = reference(tiny_hf_dir, SENTENCES, **kwargs)
    plain = reference(tiny_hf_dir, SENTENCES, renormalize_logits=False, **kwargs)
    assert renormalised != plain
    assert [t.token_ids for t in translator.translate(SENTENCES, beams=4, min_new_tokens=10)] == renormalised
    got = translator.translate(SENTENCES, beams=4, min_new_tokens=10, renormalize_logits=False)
    assert [t.token_ids for t in got] == plain


def test_num_return_sequences_match_transformers(translator: Translator, tiny_hf_dir: Path) -> None:
    expected = reference(tiny_hf_dir, SENTENCES[:3], num_beams=4, num_return_sequences=3, max_new_tokens=8)
    got = translator.translate(SENTENCES[:3], beams=4, num_return_sequences=3, max_new_tokens=8)
    flat = [[t.token_ids, *[a.token_ids for a in t.alternatives]] for t in got]
    assert [ids for group in flat for ids in group] == expected


def test_beam_scores_match_transformers(translator: Translator, tiny_hf_dir: Path) -> None:
    tokenizer = transformers.MarianTokenizer.from_pretrained(tiny_hf_dir)
    model = transformers.MarianMTModel.from_pretrained(tiny_hf_dir).eval()
    encoded = tokenizer(SENTENCES, return_tensors="pt", padding=True, truncation=True, max_length=64)
    with torch.no_grad():
        out = model.generate(**encoded, num_beams=4, output_scores=True, return_dict_in_generate=True)
    got = [t.score for t in translator.translate(SENTENCES, beams=4)]
    np.testing.assert_allclose(got, out.sequences_scores.numpy(), rtol=1e-4)


def test_first_step_logits_within_1e4(translator: Translator, tiny_hf_dir: Path) -> None:
    tokenizer = transformers.MarianTokenizer.from_pretrained(tiny_hf_dir)
    model = transformers.MarianMTModel.from_pretrained(tiny_hf_dir).eval()
    encoded = tokenizer(SENTENCES, return_tensors="np", padding=True, truncation=True, max_length=64)
    start = model.config.decoder_start_token_id
    cache = translator.graphs.encode(encoded["input_ids"].astype(np.int64), encoded["attention_mask"].astype(np.int64))
    logits, _ = translator.graphs.step(np.full((len(SENTENCES), 1), start, dtype=np.int64), cache)
    with torch.no_grad():
        expected = model(
            input_ids=torch.from_numpy(encoded["input_ids"]),
            attention_mask=torch.from_numpy(encoded["attention_mask"]),
            decoder_input_ids=torch.full((len(SENTENCES), 1), start),
        ).logits[:, -1]
    assert np.abs(logits - expected.numpy()).max() < 1e-4


def test_logits_with_and_without_cache_agree(tiny_concat_onnx_dir: Path) -> None:
    translator = Translator(tiny_concat_onnx_dir)  # the Concat form: it takes several new tokens per row
    assert not translator.graphs.buffered
    pad = translator.manifest.tokens["pad"]
    ids = np.array([[5, 6, 7, 8, 0], [9, 10, 0, pad, pad]], dtype=np.int64)
    mask = (ids != pad).astype(np.int64)
    tokens = np.array([[pad, 20, 21, 22, 23, 24], [pad, 30, 31, 32, 33, 34]], dtype=np.int64)
    cache = translator.graphs.encode(ids, mask)
    step_logits = []
    for t in range(tokens.shape[1]):
        logits, cache = translator.graphs.step(tokens[:, t : t + 1], cache)
        step_logits.append(logits)
    # The same graph with an empty cache and the whole prefix at once gives the last position's logits.
    for length in (1, 3, tokens.shape[1]):
        full, _ = translator.graphs.step(tokens[:, :length], translator.graphs.encode(ids, mask))
        np.testing.assert_allclose(full, step_logits[length - 1], atol=1e-5)


def _padded(translator: Translator, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    from onnxmt.runtime.translator import pad_batch

    ids = sorted((translator.encode(t, translator.prompt()) for t in texts), key=len)
    return pad_batch(ids, translator.manifest.tokens["pad"])


def test_parity_batches_are_encoded_in_groups(translator: Translator) -> None:
    # What makes the batch-16 parity tests above cover the encoder's groups: their batch is cut by length.
    from onnxmt.runtime.encoder_groups import encoder_groups

    _, mask = _padded(translator, SENTENCES)
    groups = encoder_groups(mask)
    assert len(groups) >= 2 and groups[-1][1] == mask.shape[1] and groups[0][1] < mask.shape[1] // 2


def test_an_encoder_group_gives_each_row_the_values_of_one_call(translator: Translator) -> None:
    from onnxmt.runtime.encoder_groups import encoder_groups

    graphs = translator.graphs
    ids, mask = _padded(translator, SENTENCES)
    groups = encoder_groups(mask)
    assert len(groups) >= 2
    whole = graphs.encoder.run(graphs.enc_out, dict(zip(graphs.enc_in, (ids, mask), strict=True)))
    grouped = graphs.encode(ids, mask).cross_kv
    assert grouped is not None and len(grouped) == len(whole)
    real = mask.astype(bool)[:, None, :, None]  # (rows, 1, src_len, 1): each row's own positions
    for one, parts in zip(whole, grouped, strict=True):
        assert parts.shape == one.shape
        assert np.array_equal(np.where(real, parts, 0), np.where(real, one, 0))  # the same bits (fp32 encoder)
        for rows, width in groups:  # zero past the group's width (the padding it was not run with)
            assert not parts[rows, :, width:].any()


def test_an_encoder_on_one_thread_groups_rows_at_its_own_call_cost(tiny_onnx_dir: Path) -> None:
    """An encoder on one thread (the service's default beside the decoder on 2 cores) counts a call as fewer padded
    tokens, so it cuts a batch into more groups; the translations are the same (a group's rows get the values of
    one call over the whole batch)."""
    from onnxmt.runtime.encoder_groups import ENCODER_CALL_TOKENS, SINGLE_THREAD_CALL_TOKENS, encoder_groups

    one = Translator(tiny_onnx_dir, RuntimeOptions(threads=2, encoder_threads=1))
    two = Translator(tiny_onnx_dir, RuntimeOptions(threads=2))
    assert one.graphs.encoder.get_session_options().intra_op_num_threads == 1
    assert two.graphs.encoder.get_session_options().intra_op_num_threads == 2
    assert (one.graphs.call_tokens, two.graphs.call_tokens) == (SINGLE_THREAD_CALL_TOKENS, ENCODER_CALL_TOKENS)
    ids, mask = _padded(one, SENTENCES)
    assert len(encoder_groups(mask, SINGLE_THREAD_CALL_TOKENS)) > len(encoder_groups(mask, ENCODER_CALL_TOKENS))
    # Both ways into the encoder (a batch's, and the running batch's text by text) group at the graphs' own cost.
    import onnxmt.runtime.graphs as graphs_module

    costs: list[int] = []

    def recording(attention_mask: np.ndarray, call_tokens: int = ENCODER_CALL_TOKENS) -> Any:
        costs.append(call_tokens)
        return encoder_groups(attention_mask, call_tokens)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graphs_module, "encoder_groups", recording)
        one.graphs.encode(ids, mask)
        one.graphs.encode_each(ids, mask)
        two.graphs.encode(ids, mask)
    assert costs == [SINGLE_THREAD_CALL_TOKENS, SINGLE_THREAD_CALL_TOKENS, ENCODER_CALL_TOKENS]
    for beams in (1, 4):
        ours = one.translate(SENTENCES, beams=beams, max_new_tokens=12)
        theirs = two.translate(SENTENCES, beams=beams, max_new_tokens=12)
        assert [t.token_ids for t in ours] == [t.token_ids for t in theirs]


def _grouping_cost(lengths: list[int], bounds: list[int], call_tokens: int) -> int:
    return sum((b - a) * lengths[b - 1] + call_tokens for a, b in itertools.pairwise(bounds))


def test_encoder_groups_are_the_cheapest_cut_by_length() -> None:
    from onnxmt.runtime.encoder_groups import encoder_groups

    def mask_of(lengths: list[int]) -> np.ndarray:
        return (np.arange(max(lengths)) < np.array(lengths)[:, None]).astype(np.int64)

    assert [(r.tolist(), w) for r, w in encoder_groups(mask_of([3, 60, 3, 60]), 16)] == [([0, 2], 3), ([1, 3], 60)]
    assert len(encoder_groups(mask_of([20] * 8))) == 1  # nothing to save
    assert len(encoder_groups(mask_of([3, 60]), call_tokens=100)) == 1  # saving 57 tokens is not worth a call
    assert len(encoder_groups(mask_of([7]))) == 1
    left = mask_of([3, 60])[:, ::-1].copy()  # left-padded: the rows cannot be cut to a width
    assert [(r.tolist(), w) for r, w in encoder_groups(left, 0)] == [([0, 1], 60)]
    rng = np.random.default_rng(0)
    for _ in range(30):  # against every cut of the sorted rows into consecutive groups
        lengths = rng.integers(1, 80, rng.integers(2, 9)).tolist()
        call_tokens = int(rng.integers(0, 200))
        groups = encoder_groups(mask_of(lengths), call_tokens)
        assert sorted(i for rows, _ in groups for i in rows.tolist()) == list(range(len(lengths)))
        assert all(w == max(lengths[i] for i in rows) for rows, w in groups)
        ordered = sorted(lengths)
        n = len(ordered)
        cuts = ([0, *c, n] for k in range(n) for c in itertools.combinations(range(1, n), k))
        best = min(_grouping_cost(ordered, b, call_tokens) for b in cuts)
        assert sum(len(rows) * w + call_tokens for rows, w in groups) == best, (lengths, call_tokens)


@pytest.fixture(scope="module")
def buffered(tiny_buffered_onnx_dir: Path) -> Translator:
    return Translator(tiny_buffered_onnx_dir)


@pytest.mark.parametrize("limited", [False, True])
def test_cache_buffer_steps_match_transformers_past_its_growth(
    buffered: Translator, tiny_hf_dir: Path, limited: bool
) -> None:
    # Teacher-forced: each step's logits against transformers' full forward pass at that position, for more steps
    # than the buffer first holds (so it grows, three times; twice, the second time to the limit (rounded up to a
    # whole block of key positions), when the decoding loop's limit is given), on a padded batch.
    from onnxmt.runtime.cache import SELF_KV_CHUNK, aligned

    assert buffered.graphs.buffered
    model = transformers.MarianMTModel.from_pretrained(tiny_hf_dir).eval()
    pad = buffered.manifest.tokens["pad"]
    ids = np.array([[5, 6, 7, 8, 0], [9, 10, 0, pad, pad]], dtype=np.int64)
    mask = (ids != pad).astype(np.int64)
    steps = 2 * SELF_KV_CHUNK + 7
    tokens = np.random.default_rng(0).integers(2, pad, size=(2, steps)).astype(np.int64)
    tokens[:, 0] = pad  # the decoder start token
    cache = buffered.graphs.encode(ids, mask, max_positions=steps if limited else None)
    got, capacities = [], []
    for t in range(steps):
        logits, cache = buffered.graphs.step(tokens[:, t : t + 1], cache)
        got.append(logits)
        capacities.append(cache.self_kv[0].shape[2])
    assert cache.self_len is not None and (cache.self_len == steps).all()
    first = aligned(1 + SELF_KV_CHUNK)  # grown after the first step, to whole blocks of key positions
    if limited:
        assert sorted(set(capacities)) == [1, first, aligned(steps)]
    else:
        assert sorted(set(capacities)) == [1, first, first + SELF_KV_CHUNK, first + 2 * SELF_KV_CHUNK]
    with torch.no_grad():
        source, source_mask, target = (torch.from_numpy(a) for a in (ids, mask, tokens))
        expected = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=target).logits.numpy()
    np.testing.assert_allclose(np.stack(got, axis=1), expected, atol=1e-4)
    with pytest.raises(ValueError, match="one new token per row"):
        buffered.graphs.step(tokens[:, :3], buffered.graphs.encode(ids, mask))


def test_cache_buffers_grow_by_a_chunk_to_whole_key_blocks_and_not_past_the_limit() -> None:
    from onnxmt.runtime.cache import KEY_BLOCK, SELF_KV_CHUNK, next_capacity

    assert KEY_BLOCK == 4 and SELF_KV_CHUNK == 16
    assert next_capacity(1, None) == 20  # a chunk, to a whole block
    assert next_capacity(1, 199) == 20  # far from the limit: a chunk
    assert next_capacity(20, None) == 36
    assert next_capacity(1, 30) == 32  # less than a chunk would be left: straight to the limit (30 new tokens)
    assert next_capacity(20, 30) == 32
    assert next_capacity(32, 32) == 36  # stepped past the limit anyway (validate, tests): still room for one more
    assert all(next_capacity(f, lim) % KEY_BLOCK == 0 for f in range(1, 80) for lim in (None, *range(1, 90)))


def test_a_cache_buffer_can_be_stepped_again(buffered: Translator) -> None:
    # The step writes the new key/value into the buffers past the cache's length, never below it: stepping the
    # same cache again (as `bench.py probes steps` does) gives the same logits.
    ids = np.array([[5, 6, 7, 0]], dtype=np.int64)
    cache = buffered.graphs.encode(ids, np.ones_like(ids))
    for token in (11, 12, 13):
        _, cache = buffered.graphs.step(np.array([[token]], dtype=np.int64), cache)
    first, _ = buffered.graphs.step(np.array([[20]], dtype=np.int64), cache)
    buffered.graphs.step(np.array([[21]], dtype=np.int64), cache)
    again, _ = buffered.graphs.step(np.array([[20]], dtype=np.int64), cache)
    np.testing.assert_array_equal(first, again)


@pytest.mark.parametrize("beams", [1, 4])
def test_cache_buffer_translates_like_transformers(buffered: Translator, tiny_hf_dir: Path, beams: int) -> None:
    expected = reference(tiny_hf_dir, SENTENCES, num_beams=beams)
    out = buffered.translate(SENTENCES, beams=beams, batch_size=3)  # batches of 3: finished rows leave mid-batch
    assert [t.token_ids for t in out] == expected


def test_processors_edit_scores_like_transformers() -> None:
    from transformers.generation.logits_process import (
        ForcedEOSTokenLogitsProcessor,
        MinLengthLogitsProcessor,
        NoBadWordsLogitsProcessor,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    rng = np.random.default_rng(0)
    sequences = rng.integers(0, 12, size=(3, 7)).astype(np.int64)
    scores = rng.normal(size=(3, 12)).astype(np.float32)
    settings = Settings(
        num_beams=1, max_length=8, min_length=9, length_penalty=1.0, early_stopping=False, num_return_sequences=1,
        decoder_start=11, eos_ids=(0,), pad=11, bad_words=((11,), (3, 4)), forced_eos=0,
        no_repeat_ngram_size=2, repetition_penalty=1.5,
    )  # fmt: skip
    ours = scores.copy()
    for processor in build_processors(settings):
        processor(sequences, ours)
    theirs = torch.from_numpy(scores.copy())
    ids = torch.from_numpy(sequences)
    for processor in (
        RepetitionPenaltyLogitsProcessor(1.5),
        NoRepeatNGramLogitsProcessor(2),
        NoBadWordsLogitsProcessor([[11], [3, 4]], eos_token_id=0),
        MinLengthLogitsProcessor(9, eos_token_id=0),
        ForcedEOSTokenLogitsProcessor(8, eos_token_id=0),
    ):
        theirs = processor(ids, theirs)
    np.testing.assert_array_equal(ours, theirs.numpy())


def test_topk_orders_largest_first_with_stable_ties() -> None:
    x = np.array([[1.0, 5.0, 5.0, -np.inf, 3.0]], dtype=np.float32)
    assert topk(x, 3).tolist() == [[1, 2, 4]]
    assert topk(x, 2, tiebreak=np.array([[0, 9, 8, 0, 0]])).tolist() == [[2, 1]]


def test_vocab_ops_log_softmax_and_topk() -> None:
    ops = VocabOps(RuntimeOptions(threads=2))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 1000)).astype(np.float32)
    x[0, 3] = -np.inf
    out = ops.log_softmax(x)
    assert out[0, 3] == -np.inf
    expected = torch.log_softmax(torch.from_numpy(x), dim=-1).numpy()
    np.testing.assert_allclose(out, expected, atol=1e-6)
    x[1, 10] = x[1, 20] = 50.0  # a tie: the lower index comes first, as in numpy's fallback
    values, indices = ops.topk(x, 8)
    assert indices[1, :2].tolist() == [10, 20]
    assert indices.tolist() == topk(x, 8).tolist()
    np.testing.assert_array_equal(values, np.take_along_axis(x, indices, axis=1))


@pytest.mark.parametrize("shape", [(1, 5), (5, 1000), (128, 65001), (4, 256206)])
def test_log_softmax_inplace_is_the_same_bits_in_the_same_buffer(shape: tuple[int, int]) -> None:
    # One buffer read and written by ORT's LogSoftmax: bit for bit the out-of-place result (it reads a row before
    # it writes it). A kernel that wrote while it still read would differ here.
    ops = VocabOps(RuntimeOptions(threads=2))
    x = (np.random.default_rng(2).normal(size=shape) * 8).astype(np.float32)
    x[0, :2] = -np.inf
    expected = ops.log_softmax(x)
    buffer = x.copy()
    out = ops.log_softmax_inplace(buffer)
    assert out is buffer and np.shares_memory(out, buffer)
    np.testing.assert_array_equal(out, expected)
    assert not np.array_equal(buffer, x)  # it was overwritten
    # Views it cannot write in place (not contiguous) are still overwritten, by way of a copy.
    strided = x.copy()[:, ::2]
    np.testing.assert_array_equal(ops.log_softmax_inplace(strided), ops.log_softmax(np.ascontiguousarray(x[:, ::2])))


def test_chunk_length_divides_the_vocabulary_or_is_none() -> None:
    assert chunk_length(65001, 8) == 141  # opus-mt: 65001 = 3 * 47 * 461
    for vocab, k in ((65001, 8), (32000, 8), (250_000, 12), (1000, 2)):
        chunk = chunk_length(vocab, k)
        assert chunk is not None and vocab % chunk == 0 and chunk >= 16 and vocab // chunk >= 4 * k
    assert chunk_length(65003, 8) is None  # a prime: the plain TopK
    assert chunk_length(64, 8) is None  # too few chunks


@pytest.mark.parametrize("values", ["normal", "ties", "infinite"])
def test_chunked_topk_is_the_plain_topk(values: str) -> None:
    # Rows of 65001 (opus-mt's vocabulary) big enough for the chunked graph; the reference is numpy's stable
    # sort (ties to the lower index). "ties": a handful of distinct values, so the chunk maxima tie everywhere.
    ops = VocabOps(RuntimeOptions(threads=2))
    rng = np.random.default_rng(1)
    rows, vocab, k = 8, 65001, 8
    assert rows * vocab >= CHUNKED_TOPK_MIN
    if values == "normal":
        x = rng.normal(size=(rows, vocab)).astype(np.float32)
        x[0, [5, 60000, 30000]] = 9.0  # equal entries in different chunks
        x[1, 141:150] = 7.0  # a whole run of equal entries inside one chunk
    elif values == "ties":
        x = rng.integers(0, 4, size=(rows, vocab)).astype(np.float32)
    else:
        x = np.full((rows, vocab), -np.inf, dtype=np.float32)
        x[1, [3, 70, 64999]] = [-1.0, 2.0, 2.0]  # fewer finite entries than k: the rest are -inf, lowest first
    values_, indices = ops.topk(x, k)
    assert indices.tolist() == topk(x, k).tolist()
    np.testing.assert_array_equal(values_, np.take_along_axis(x, indices, axis=1))
    # The same through the chunked graph directly, at several chunk lengths, and the plain graph agrees.
    for chunk in (47, 141, 461):
        feed = {"scores": x, "k": np.array([k]), "chunk": np.array([chunk])}
        assert ops._topk_chunked.run(None, feed)[1].tolist() == indices.tolist()
    assert ops._topk.run(None, {"scores": x, "k": np.array([k])})[1].tolist() == indices.tolist()


def test_greedy_scores_match_transformers_transition_scores(translator: Translator, tiny_hf_dir: Path) -> None:
    # A greedy score is the sum of the chosen tokens' log-probabilities after the processors:
    # transformers' normalised transition scores.
    tokenizer = transformers.MarianTokenizer.from_pretrained(tiny_hf_dir)
    model = transformers.MarianMTModel.from_pretrained(tiny_hf_dir).eval()
    encoded = tokenizer(SENTENCES, return_tensors="pt", padding=True, truncation=True, max_length=64)
    with torch.no_grad():
        out = model.generate(**encoded, num_beams=1, max_new_tokens=6, output_scores=True, return_dict_in_generate=True)
    steps = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    finite = torch.where(torch.isfinite(steps), steps, torch.zeros_like(steps))  # padding after eos: -inf
    got = [t.score for t in translator.translate(SENTENCES, beams=1, max_new_tokens=6)]
    np.testing.assert_allclose(got, finite.sum(dim=1).numpy(), rtol=1e-5, atol=1e-5)
