"""Decoder-only translators through the one engine (Translator, the running batch, the search rules): the model's
prompt in, `generate(do_sample=False)`'s tokens out, greedy and beam 4, single texts and batches of four, the
repetition penalty over the prompt, every eos id of the generation config; a text is the same bits alone and joined
mid-run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from onnxmt import Translator
from onnxmt.runtime.options import BatchLimits, RuntimeOptions
from onnxmt.runtime.running import RunningBatch, encode_texts
from onnxmt.runtime.translator import Prepared
from tests.helpers.skips import importorskip

importorskip("torch")

TEXTS = (
    "Hello world.",
    "The river was quiet in the morning, and the market was not open yet.",
    "Good?",
    "A small fast model.",
)
# The pairs: HY-MT en->zh (the Chinese template), zh->en (Chinese source), en->fr (the English template);
# TranslateGemma en->de, en->zh; Qwen3 en->zh.
CASES = [
    ("hy_mt", "en", "zh"),
    ("hy_mt", "zh", "en"),
    ("hy_mt", "en", "fr"),
    ("translategemma", "en", "de"),
    ("translategemma", "en", "zh"),
    ("qwen3", "en", "zh"),
]
NEW_TOKENS = 16


def _translator(directory: Path) -> Translator:
    return Translator(directory, RuntimeOptions(threads=1))


def _hf(hf_dir: Path) -> Any:
    from onnxmt.export.decoder_only import load

    return load(str(hf_dir))


def _generate(model: Any, prompt: tuple[int, ...], beams: int, **kwargs: Any) -> list[int]:
    """transformers' tokens for one prompt alone, the vendor's sampling set aside (greedy or beam search)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, top_k=None, top_p=None, num_beams=beams, **kwargs)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize(("family", "source", "target"), CASES)
def test_translations_are_generates_tokens(
    request: pytest.FixtureRequest, family: str, source: str, target: str, beams: int
) -> None:
    """Four texts translated together (one running batch of prompts of four lengths) and each alone give
    transformers' tokens for the text alone under the model's chat template."""
    onnx_dir = request.getfixturevalue(f"{family}_onnx_dir")
    model = _hf(request.getfixturevalue(f"{family}_hf_dir"))
    translator = _translator(onnx_dir)
    options = {"beams": beams, "max_new_tokens": NEW_TOKENS}
    prepared = translator.prepare(list(TEXTS), source_lang=source, target_lang=target, **options)
    assert len({len(p.ids) for p in prepared}) == 4  # four prompt lengths share the batch
    assert prepared[0].ids == tuple(translator.chat.ids(TEXTS[0], source, target))  # type: ignore[union-attr]
    together = translator.translate_prepared(prepared, batching=BatchLimits(4))
    for p, got in zip(prepared, together, strict=True):
        assert got.token_ids == _generate(model, p.ids, beams, max_new_tokens=NEW_TOKENS), p.text
    alone = translator.translate_prepared(prepared[1:2], batching=BatchLimits(1))[0]
    assert alone.token_ids == together[1].token_ids and alone.score == together[1].score


def test_the_repetition_penalty_applies_over_the_prompt(hy_mt_onnx_dir: Path, hy_mt_hf_dir: Path) -> None:
    """HY-MT's generation config has a repetition penalty of 1.05 (kept at export, the sampling set aside); it
    changes this model's tokens, and only the penalty over the prompt as well as the output gives generate()'s."""
    translator = _translator(hy_mt_onnx_dir)
    assert translator.manifest.generation["repetition_penalty"] == 1.05
    assert "do_sample" not in translator.manifest.generation
    texts = list(TEXTS)
    prepared = translator.prepare(texts, source_lang="en", target_lang="zh", max_new_tokens=NEW_TOKENS)
    with_penalty = [t.token_ids for t in translator.translate_prepared(prepared)]
    plain = translator.translate(
        texts, source_lang="en", target_lang="zh", max_new_tokens=NEW_TOKENS, repetition_penalty=1.0
    )
    assert with_penalty != [t.token_ids for t in plain]
    model = _hf(hy_mt_hf_dir)
    assert with_penalty == [_generate(model, p.ids, 1, max_new_tokens=NEW_TOKENS) for p in prepared]


def _with_stop(qwen3_onnx_dir: Path, out: Path, beams: int) -> tuple[Path, int]:
    """The tiny Qwen3 with one more stop id: a token its second text writes at step 3 or later under this search
    (a random model rarely writes its own eos), added to the manifest's eos ids as a generation config's list
    would give it."""
    translator = _translator(qwen3_onnx_dir)
    first = translator.translate([TEXTS[1]], source_lang="en", target_lang="zh", beams=beams, max_new_tokens=24)[0]
    ids = first.token_ids
    stop = next(t for i, t in enumerate(ids) if i >= 2 and t not in ids[:i])
    out = Path(shutil.copytree(qwen3_onnx_dir, out / "model"))
    manifest = json.loads((out / "onnxmt.json").read_text(encoding="utf-8"))
    manifest["tokens"]["eos_ids"] = [*manifest["tokens"]["eos_ids"], stop]
    (out / "onnxmt.json").write_text(json.dumps(manifest), encoding="utf-8")
    return out, stop


@pytest.mark.parametrize("beams", [1, 4])
def test_every_eos_id_stops_a_text(qwen3_onnx_dir: Path, qwen3_hf_dir: Path, tmp_path: Path, beams: int) -> None:
    directory, stop = _with_stop(qwen3_onnx_dir, tmp_path, beams)
    translator = _translator(directory)
    eos = translator.manifest.tokens["eos_ids"]
    assert len(eos) == 3 and eos[-1] == stop  # Qwen3's <|im_end|> and <|endoftext|>, and the added one
    prepared = translator.prepare(list(TEXTS), source_lang="en", target_lang="zh", beams=beams, max_new_tokens=24)
    got = translator.translate_prepared(prepared)
    model = _hf(qwen3_hf_dir)
    expected = [_generate(model, p.ids, beams, max_new_tokens=24, eos_token_id=eos) for p in prepared]
    assert [t.token_ids for t in got] == expected
    assert any(len(t.token_ids) < 24 and t.token_ids[-1] == stop for t in got)  # some text stopped on it


def _alone(translator: Translator, prepared: Prepared) -> tuple[list[int], float]:
    translation = translator.translate_prepared([prepared], batching=BatchLimits(1))[0]
    return translation.token_ids, translation.score


@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("family", ["hy_mt", "translategemma", "qwen3"])
def test_prompts_joining_mid_run_are_the_same_bits_as_alone(
    request: pytest.FixtureRequest, family: str, beams: int
) -> None:
    """Groups of prompts prefilled ahead or as they join, admitted at different steps with their own limits, beside
    rows mid-generation: each text's tokens and score are the bits it gets alone."""
    translator = _translator(request.getfixturevalue(f"{family}_onnx_dir"))
    pad = translator.manifest.tokens["pad"]
    source, target = ("en", "de") if family == "translategemma" else ("en", "zh")
    groups = [
        (0, translator.prepare([TEXTS[0], TEXTS[1]], source_lang=source, target_lang=target, beams=beams,
                               max_new_tokens=12)),
        (2, translator.prepare([TEXTS[2]], source_lang=source, target_lang=target, beams=beams, max_new_tokens=5)),
        (3, translator.prepare([TEXTS[3] * 4, TEXTS[0]], source_lang=source, target_lang=target, beams=beams,
                               max_new_tokens=9)),
    ]  # fmt: skip
    batch = RunningBatch(translator.graphs, beams, pad)
    results: dict[object, Any] = {}
    step, rows = 0, []
    pending = list(enumerate(groups))
    while pending or batch.rows:
        while pending and pending[0][1][0] <= step:
            g, (_, items) = pending.pop(0)
            ahead = encode_texts(translator.graphs, pad, [p.ids for p in items]) if g == 1 else None
            batch.admit([p.ids for p in items], items[0].settings, [(g, i) for i in range(len(items))],
                        encoded=ahead)  # fmt: skip
        if batch.rows:
            rows.append(batch.rows)
            results.update(batch.step().finished)
        step += 1
    assert max(rows) == 5 * beams  # all five texts ran together at some step
    for g, (_, items) in enumerate(groups):
        for i, prepared in enumerate(items):
            (hypothesis,) = results[(g, i)]
            assert (hypothesis.tokens, hypothesis.score) == _alone(translator, prepared), (g, i)


def test_a_prompt_longer_than_a_prefill_chunk_is_cut_at_fixed_boundaries(hy_mt_onnx_dir: Path) -> None:
    """A prompt past PREFILL_CHUNK is prefilled in chunks; beside a short prompt or alone its cache is the same
    bits (the chunks do not depend on the other rows). Other chunk sizes may change its last bits (the separate
    attention ops; GroupQueryAttention reads the keys in position order whatever the chunks)."""
    from onnxmt.runtime.decoder_only import DecoderOnlyGraphs

    translator = _translator(hy_mt_onnx_dir)
    graphs = translator.graphs
    assert isinstance(graphs, DecoderOnlyGraphs)
    long = list(translator.prepare([" ".join(TEXTS) * 6], source_lang="en", target_lang="zh")[0].ids)
    short = list(translator.prepare([TEXTS[0]], source_lang="en", target_lang="zh")[0].ids)
    assert len(long) > 40
    (alone,) = graphs.prefill_each([long], chunk=16)
    _, beside = graphs.prefill_each([short, long], chunk=16)
    assert alone.self_len.tolist() == beside.self_len.tolist() == [len(long)]  # type: ignore[union-attr]
    for a, b in zip(alone.self_kv, beside.self_kv, strict=True):
        assert np.array_equal(a, b)
    (whole,) = graphs.prefill_each([long], chunk=1024)
    assert all(np.abs(a - b).max() < 1e-4 for a, b in zip(alone.self_kv, whole.self_kv, strict=True))


def _chat_ids(hf_dir: Path, user: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def test_a_glossary_and_a_context_are_hy_mts_prompts(hy_mt_onnx_dir: Path, hy_mt_hf_dir: Path) -> None:
    """The model card's terminology and context templates, written out here, through transformers' chat template:
    the prompt ids `model_input` shows and the tokens generate() gives for them. A text holds only its own terms."""
    translator = _translator(hy_mt_onnx_dir)
    model = _hf(hy_mt_hf_dir)
    text = "The river was quiet, the mountain was far."
    glossary = {"river": "江", "mountain": "山", "sea": "海"}
    request = "将以下文本翻译为中文，注意只需要输出翻译后的结果，不要额外解释：\n"
    cases = [
        ({"glossary": glossary}, f"参考下面的翻译：\nriver 翻译成 江\nmountain 翻译成 山\n\n{request}{text}"),
        (
            {"context": "A story."},
            f"A story.\n参考上面的信息，把下面的文本翻译成中文，注意不需要翻译上文，也不要额外解释：\n{text}",
        ),
    ]
    for given, user in cases:
        shown = translator.model_input(text, source_lang="en", target_lang="zh", **given)
        assert shown.ids == tuple(_chat_ids(hy_mt_hf_dir, user)) and user in shown.text
        got = translator.translate([text], source_lang="en", target_lang="zh", max_new_tokens=NEW_TOKENS, **given)
        assert got[0].token_ids == _generate(model, shown.ids, 1, max_new_tokens=NEW_TOKENS)
    plain = translator.model_input("Good?", source_lang="en", target_lang="zh", glossary=glossary)
    assert plain == translator.model_input("Good?", source_lang="en", target_lang="zh")  # no term: the plain prompt
    with pytest.raises(ValueError, match="not both at once"):
        translator.translate([text], source_lang="en", target_lang="zh", glossary=glossary, context="c")
    with pytest.raises(ValueError, match="glossary entry 1 is not a"):
        translator.translate([text], source_lang="en", target_lang="zh", glossary=["river"])  # type: ignore[list-item]


def test_a_glossary_is_refused_without_a_terminology_prompt(translategemma_onnx_dir: Path, tiny_onnx_dir: Path):
    for directory, kind, target in ((translategemma_onnx_dir, "translategemma", "de"), (tiny_onnx_dir, "marian", "zh")):
        translator = _translator(directory)
        with pytest.raises(ValueError, match=rf"prompt \({kind}.*\) has no such template"):
            translator.translate(["Hi"], source_lang="en", target_lang=target, glossary={"Hi": "Hallo"})
        with pytest.raises(ValueError, match="a context goes into HY-MT's"):
            translator.prepare(["Hi"], source_lang="en", target_lang=target, context="before")


def test_a_running_batchs_buffers_are_allocated_as_prompts_join_never_as_they_decode(hy_mt_onnx_dir: Path) -> None:
    """A prompt joining the running batch gets its positions up to its limit (prompt and max_new_tokens) at once:
    the batch's buffers are reallocated when a text joins past their rows, never while rows decode (they grew a
    chunk of positions at a time, each growth a copy of every row's cache). Each text is the bits it gets alone."""
    translator = _translator(hy_mt_onnx_dir)
    pad = translator.manifest.tokens["pad"]
    first, second = (
        translator.prepare([text], source_lang="en", target_lang="zh", max_new_tokens=tokens)[0]
        for text, tokens in ((TEXTS[1], 40), (TEXTS[0], 8))
    )
    batch = RunningBatch(translator.graphs, 1, pad)
    batch.admit([first.ids], first.settings, ["first"])
    buffers: list[np.ndarray] = []  # the first layer's key buffer after each step, each kept once
    results: dict[object, Any] = {}
    step = 0
    while batch.rows:
        if step == 3:
            batch.admit([second.ids], second.settings, ["second"])
        results.update(batch.step().finished)
        assert batch.slots is not None
        if not any(buffer is batch.slots.kv[0] for buffer in buffers):
            buffers.append(batch.slots.kv[0])
        step += 1
    assert step > 20  # the first text decoded past a chunk of positions (16)
    # (rows, positions): one row with room for the first prompt and its 40 tokens; then two rows, as the second joins.
    limit = len(first.ids) - 1 + 40
    assert [b.shape[0] for b in buffers] == [1, 2]
    assert all(b.shape[2] == -(-limit // 4) * 4 for b in buffers)
    for key, prepared in (("first", first), ("second", second)):
        (hypothesis,) = results[key]
        assert (hypothesis.tokens, hypothesis.score) == _alone(translator, prepared)
