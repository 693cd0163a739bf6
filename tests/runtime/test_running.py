"""In-flight batching (runtime/running.py): texts joining a running batch at any step, with their own settings and
target languages, and leaving as they finish, are translated token for token as they are alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from onnxmt import Translator
from onnxmt.runtime import slots
from onnxmt.runtime.cache import KEY_BLOCK
from onnxmt.runtime.cancel import CancelToken
from onnxmt.runtime.options import BatchLimits
from onnxmt.runtime.running import RunningBatch, encode_texts
from onnxmt.runtime.translator import Prepared
from onnxmt.testing import generate_corpus

ENGLISH = generate_corpus(31, lines=40)[0]


def _run(
    translator: Translator, joins: Sequence[tuple[int, list[Prepared]]], beams: int, ahead: bool = False
) -> dict[object, list]:
    """Admit each group of prepared texts at its step; step until every text is done. Keys: (group, index).
    `ahead`: every text encoded at the start, in one call (as the service encodes requests waiting for a place),
    and admitted with its encoding."""
    pad = translator.manifest.tokens["pad"]
    batch = RunningBatch(translator.graphs, beams, pad)
    encoded = iter(encode_texts(translator.graphs, pad, [p.ids for _, items in joins for p in items]) if ahead else [])
    results: dict[object, list] = {}
    pending = sorted(joins, key=lambda join: join[0])
    step, group = 0, 0
    rows_seen, capacities, cohorts = [], [], []
    while pending or batch.rows:
        while pending and pending[0][0] <= step:
            _, items = pending.pop(0)
            keys = [(group, i) for i in range(len(items))]
            caches = [next(encoded) for _ in items] if ahead else None
            forced = [p.prompt.forced_bos for p in items]
            batch.admit([p.ids for p in items], items[0].settings, keys, forced, encoded=caches)
            group += 1
        if batch.rows:
            rows_seen.append(batch.rows)
            for key, hypotheses in batch.step().finished:
                results[key] = hypotheses
            if batch.slots is not None:
                capacities.append(batch.slots.capacity)
            cohorts.append(len(batch.cohorts))
        step += 1
    results["rows"] = rows_seen
    results["capacities"] = capacities
    results["cohorts"] = cohorts
    return results


def _alone(translator: Translator, prepared: Prepared) -> tuple[list[int], float]:
    translation = translator.translate_prepared([prepared], batching=BatchLimits(1))[0]
    return translation.token_ids, translation.score


@pytest.fixture(scope="module")
def per_row_int8_dir(tiny_multi_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The multi-target model in int8 with a scale per row: batch-invariant, so in-flight batching is exact too."""
    from onnxmt.export.quantize import QuantizeOptions, quantize

    out = tmp_path_factory.mktemp("int8-rows") / "model"
    quantize(tiny_multi_onnx_dir, out, QuantizeOptions(per_row_scales=True), progress=lambda _: None)
    return out


@pytest.mark.parametrize("encoded", ["joining", "ahead"])
@pytest.mark.parametrize("precision", ["fp32", "int8-rows"])
@pytest.mark.parametrize("beams", [1, 3])
def test_texts_joining_mid_batch_translate_as_alone(
    tiny_multi_onnx_dir: Path, per_row_int8_dir: Path, beams: int, precision: str, encoded: str
) -> None:
    """`encoded`: each group encoded as it joins, or all texts encoded together before any joins (padded to the
    longest of all, in groups by length)."""
    translator = Translator(tiny_multi_onnx_dir if precision == "fp32" else per_row_int8_dir)
    # Groups of different lengths, settings and target languages joining at different steps; short ones leave early.
    groups = [
        (0, translator.prepare(ENGLISH[0:3], beams=beams, max_new_tokens=24, target_lang="cmn_Hans")),
        (0, translator.prepare(ENGLISH[11:13], beams=beams, max_new_tokens=9, target_lang="yue_Hant")),
        (2, translator.prepare(ENGLISH[3:4], beams=beams, max_new_tokens=5, target_lang="cmn_Hant")),
        (3, translator.prepare(ENGLISH[4:7], beams=beams, max_new_tokens=16, target_lang="yue_Hant")),
        # Same setting, same step, another target: merged into one cohort with the group above.
        (3, translator.prepare(ENGLISH[14:16], beams=beams, max_new_tokens=16, target_lang="cmn_Hans")),
        (9, translator.prepare([ENGLISH[7] * 3], beams=beams, max_new_tokens=30, target_lang="cmn_Hans")),
        (9, translator.prepare(ENGLISH[8:10], beams=beams, max_new_tokens=3, target_lang="cmn_Hans")),
    ]
    results = _run(translator, groups, beams, ahead=encoded == "ahead")
    for g, (_, items) in enumerate(groups):
        for i, prepared in enumerate(items):
            (hypothesis,) = results[(g, i)]
            tokens, score = _alone(translator, prepared)
            assert hypothesis.tokens == tokens, (g, i)
            assert hypothesis.score == pytest.approx(score, abs=1e-5)
    rows = results["rows"]
    assert max(rows) > beams * 3 and rows[-1] < max(rows)  # groups shared calls; finished rows left


@pytest.mark.parametrize("beams", [1, 2])
def test_a_batch_that_grows_past_its_buffers_and_empties_again_translates_as_alone(
    tiny_onnx_dir: Path, beams: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two texts join per step with their own length, 60 in all, then a long one joins the few left: the cache
    buffers grow (rows, source width, positions), rows leave from everywhere in the batch, and the buffers shrink
    when little of them is used (here after 2 steps so); every text is what it is alone."""
    monkeypatch.setattr(slots, "SHRINK_AFTER", 2)
    translator = Translator(tiny_onnx_dir)
    texts = [ENGLISH[i % 40] for i in range(60)]
    groups = [
        (i, translator.prepare(texts[2 * i : 2 * i + 2], beams=beams, max_new_tokens=n, min_new_tokens=n))
        for i, n in enumerate(2 + (7 * i) % 23 for i in range(30))
    ]
    groups.append((48, translator.prepare([ENGLISH[3]], beams=beams, max_new_tokens=40, min_new_tokens=40)))
    results = _run(translator, groups, beams)
    for g, (_, items) in enumerate(groups):
        for i, prepared in enumerate(items):
            assert results[(g, i)][0].tokens == _alone(translator, prepared)[0], (g, i)
    capacities = np.array(results["capacities"])  # (steps, 4): rows, sentences, width, positions
    peak = capacities.max(axis=0)
    positions = capacities[:, 3]
    assert ((positions % KEY_BLOCK == 0) | (positions == 1)).all()  # whole blocks of key positions (cache.aligned)
    assert peak[0] > 16 and peak[3] > 16, peak  # rows and positions outgrew their first buffers
    assert capacities[-1][0] < peak[0] and capacities[-1][1] < peak[1]  # and shrank once the batch emptied


def test_forced_target_languages_mix_in_a_running_batch(tiny_nllb_onnx_dir: Path) -> None:
    """NLLB: each text's target language is its forced first token, joining a batch of other languages."""
    translator = Translator(tiny_nllb_onnx_dir)
    languages = ["zho_Hans", "fra_Latn", "deu_Latn", "zho_Hans"]
    # The last two join at the same step with one setting: one cohort, each row its own forced target.
    groups = [
        (min(step, 2), translator.prepare(ENGLISH[5 * step : 5 * step + 2], source_lang="eng_Latn", target_lang=lang))
        for step, lang in enumerate(languages)
    ]
    for beams in (1, 2):
        groups = [(s, translator.prepare([p.text for p in items], beams=beams, source_lang="eng_Latn",
                                         target_lang=languages[g], max_new_tokens=12))
                  for g, (s, items) in enumerate(groups)]  # fmt: skip
        results = _run(translator, groups, beams)
        for g, (_, items) in enumerate(groups):
            for i, prepared in enumerate(items):
                assert results[(g, i)][0].tokens == _alone(translator, prepared)[0], (beams, g, i)


def test_greedy_texts_of_one_setting_joining_one_by_one_run_as_one_cohort(tiny_nllb_onnx_dir: Path) -> None:
    """One-text requests of one setting joining at every step (what a service under load sees), each with its own
    target language: one cohort whose texts are at different lengths, each text what it is alone."""
    translator = Translator(tiny_nllb_onnx_dir)
    languages = ["zho_Hans", "fra_Latn", "deu_Latn"]
    groups = [
        (step, translator.prepare([ENGLISH[step]], source_lang="eng_Latn", target_lang=languages[step % 3],
                                  beams=1, max_new_tokens=10))
        for step in range(12)
    ]  # fmt: skip
    results = _run(translator, groups, beams=1)
    for g, (_, (prepared,)) in enumerate(groups):
        assert results[(g, 0)][0].tokens == _alone(translator, prepared)[0], g
    assert max(results["cohorts"]) == 1 and max(results["rows"]) >= 5


@pytest.mark.parametrize("early_stopping", [False, True, "never"])
def test_beam_texts_of_one_setting_but_their_limits_joining_one_by_one_run_as_one_cohort(
    tiny_onnx_dir: Path, tiny_nllb_onnx_dir: Path, early_stopping: bool | str
) -> None:
    """One-text beam requests joining at every step, each with its own max_new_tokens (what a service under load
    sees): one cohort whose sentences are at different lengths with different limits, each what it is alone, the
    score too. opus-mt's metadata forces eos at each text's own last step (`forced_eos_token_id`) and renormalises;
    NLLB forces each text's target language at its own first step; no_repeat_ngram reads each text's history.
    Without the forced eos, texts that reach their limits end there without one (no pad from longer limits)."""
    opus, nllb = Translator(tiny_onnx_dir), Translator(tiny_nllb_onnx_dir)
    languages = ["zho_Hans", "fra_Latn", "deu_Latn"]
    options = {"beams": 2, "early_stopping": early_stopping, "length_penalty": 0.6, "no_repeat_ngram_size": 3}
    for translator, forced in ((opus, True), (opus, False), (nllb, True)):
        groups = [
            (step, translator.prepare([ENGLISH[step]], max_new_tokens=3 + (5 * step) % 12, **options,
                                      **({"source_lang": "eng_Latn", "target_lang": languages[step % 3]}
                                         if translator is nllb else {})))
            for step in range(12)
        ]  # fmt: skip
        if not forced:
            groups = [(step, [replace(p, settings=replace(p.settings, forced_eos=None)) for p in items])
                      for step, items in groups]  # fmt: skip
        results = _run(translator, groups, beams=2)
        at_limit = {True: 0, False: 0}  # texts that ran to their limits, by whether they end with eos
        for g, (_, (prepared,)) in enumerate(groups):
            (hypothesis,) = results[(g, 0)]
            tokens, score = _alone(translator, prepared)
            assert hypothesis.tokens == tokens, g
            assert hypothesis.score == pytest.approx(score, abs=1e-5), g
            if len(tokens) == prepared.settings.max_length - 1:
                at_limit[tokens[-1] in prepared.settings.eos_ids] += 1
        assert max(results["cohorts"]) == 1 and max(results["rows"]) >= 10
        if translator is opus:
            assert at_limit[forced] >= 3 and not at_limit[not forced]  # eos forced at their own limits, or none


def test_an_emptied_batch_keeps_its_buffers_for_the_next_texts_until_released(tiny_onnx_dir: Path) -> None:
    """Rows that all leave keep the cache buffers (the next texts join into them, as alone); `release` lets an
    empty batch's go, and texts joining after it run in new ones, as alone too."""
    translator = Translator(tiny_onnx_dir)
    batch = RunningBatch(translator.graphs, 1, translator.manifest.tokens["pad"])

    def run(start: int) -> None:
        items = translator.prepare(ENGLISH[start : start + 3], beams=1, max_new_tokens=6, min_new_tokens=6)
        batch.admit([p.ids for p in items], items[0].settings, list(range(3)))
        finished: dict[object, list] = {}
        while batch.rows:
            finished.update(batch.step().finished)
        assert [finished[i][0].tokens for i in range(3)] == [_alone(translator, p)[0] for p in items]

    run(0)
    buffers = batch.slots
    assert buffers is not None and buffers.rows == 0
    run(3)
    assert batch.slots is buffers  # the second texts ran in the buffers the first left
    batch.release()
    assert batch.slots is None
    run(6)
    assert batch.slots is not None and batch.slots is not buffers


def test_a_cancelled_text_leaves_at_the_next_step_and_the_others_are_unchanged(tiny_onnx_dir: Path) -> None:
    translator = Translator(tiny_onnx_dir)
    items = translator.prepare(ENGLISH[10:14], beams=1, max_new_tokens=20, min_new_tokens=20)
    batch = RunningBatch(translator.graphs, 1, translator.manifest.tokens["pad"])
    gone = np.zeros(len(items), dtype=bool)
    batch.admit([p.ids for p in items], items[0].settings, list(range(4)), cancelled=lambda: gone)
    finished: dict[object, list] = {}
    for step in range(30):
        if step == 3:
            gone[1] = True
        if not batch.rows:
            break
        finished.update(batch.step().finished)
        if step == 3:
            assert 1 in finished and finished[1][0].cancelled and len(finished[1][0].tokens) == 4
            assert batch.rows == 3
    for i in (0, 2, 3):
        assert finished[i][0].tokens == _alone(translator, items[i])[0]


@pytest.mark.parametrize("beams", [1, 3])
def test_a_text_joining_running_rows_gets_the_logits_it_gets_alone(tiny_onnx_dir: Path, beams: int) -> None:
    """Bit for bit, in fp32: the decoder calls a text joins (other rows at other lengths, another capacity, a wider
    source) compute its rows as `translate` computes them alone, at every step, beam search's first included."""
    translator = Translator(tiny_onnx_dir)
    calls: list[np.ndarray] = []
    step = translator.graphs.step

    def recorded(tokens: np.ndarray, cache):  # type: ignore[no-untyped-def]
        logits, cache = step(tokens, cache)
        calls.append(logits.copy())
        return logits, cache

    translator.graphs.step = recorded  # type: ignore[method-assign]
    running = translator.prepare([ENGLISH[7] * 2, ENGLISH[3]], beams=beams, max_new_tokens=20, min_new_tokens=20)
    (joining,) = translator.prepare([ENGLISH[5]], beams=beams, max_new_tokens=6, min_new_tokens=6)
    assert len(joining.ids) < max(len(p.ids) for p in running)  # a narrower source than the batch's
    translator.translate_prepared([joining], batching=BatchLimits(1))
    alone = list(calls)  # each of its steps, `beams` rows each
    assert len(alone) == 6
    batch = RunningBatch(translator.graphs, beams, translator.manifest.tokens["pad"])
    batch.admit([p.ids for p in running], running[0].settings, ["a", "b"])
    for _ in range(5):
        batch.step()
    batch.admit([joining.ids], joining.settings, ["c"])
    calls.clear()
    finished: dict[object, list] = {}
    while "c" not in finished:
        finished.update(batch.step().finished)
    assert [len(logits) for logits in calls] == [3 * beams] * len(alone)  # beside the others' rows all along
    for got, expected in zip(calls, alone, strict=True):
        np.testing.assert_array_equal(got[-beams:], expected)  # its rows come last: it joined last


def test_old_decoders_are_refused(tiny_concat_onnx_dir: Path) -> None:
    translator = Translator(tiny_concat_onnx_dir)
    with pytest.raises(ValueError, match="one cache length per row"):
        RunningBatch(translator.graphs, 1, 0)


@pytest.mark.parametrize("beams", [1, 3])
def test_the_librarys_running_batch_translates_as_alone_within_the_limits(
    hy_mt_onnx_dir: Path, beams: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`generate` of a decoder-only model (the library's path through the scheduler and the running batch): the
    next texts join as others finish, never more than batch_size texts nor more than max_batch_cost running; each
    text's translation the same as alone (fp32); a text cancelled before its turn is never started."""
    translator = Translator(hy_mt_onnx_dir)
    texts = ENGLISH[:10]
    prepared = translator.prepare(
        texts, beams=beams, max_new_tokens=10, source_lang="en", target_lang=["zh", "fr"] * (len(texts) // 2)
    )
    alone = {i: next(e.translation for e in translator.generate([p]) if e.translation) for i, p in enumerate(prepared)}
    running: list[int] = []
    step = RunningBatch.step

    def counted(self: RunningBatch) -> object:
        running.append(self.texts)
        return step(self)

    monkeypatch.setattr(RunningBatch, "step", counted)
    gone = CancelToken()
    gone.cancel()
    cancel = [gone if i == 7 else None for i in range(len(texts))]
    events = list(translator.generate(prepared, batching=BatchLimits(4), cancel=cancel))
    together = {e.index: e.translation for e in events if e.translation}
    assert sorted(together) == list(range(len(texts)))
    assert together[7].cancelled and together[7].token_ids == []
    for i in set(range(len(texts))) - {7}:
        assert together[i].token_ids == alone[i].token_ids, i
    assert max(running) == 4 and len(running) < sum(len(t.token_ids) for t in alone.values())  # shared steps
    # A cost budget of twice the cheapest text: never three running (a text alone always fits).
    running.clear()
    budget = 2 * min(p.cost for p in prepared)
    list(translator.generate(prepared, batching=BatchLimits(16, budget)))
    assert 1 <= max(running) <= 2
