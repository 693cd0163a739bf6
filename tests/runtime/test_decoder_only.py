"""runtime/decoder_only.py: the exported decoder-only graph, run torch-free, against transformers.

Logits at the prefill of a batch of prompts of different lengths and at each of 12 forced steps, per family, equal
to transformers' within fp32 rounding; a chunked prefill and prompts joining a running cache give a row the logits
it gets alone; a greedy loop (test-only: the search is the engine's) over the graph gives `generate()`'s tokens under
the model's generation config with do_sample off, repetition penalty over the prompt included.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from onnxmt.manifest import read_manifest
from onnxmt.runtime.decoder_only import DecoderOnlyGraphs, Prompts, right_padded
from onnxmt.runtime.options import RuntimeOptions
from tests.helpers.skips import importorskip

importorskip("torch")

FAMILIES = ("hy_mt", "hy_mt_7b", "qwen3", "translategemma", "gemma3_text")
# Measured 1.1e-06 to 2.4e-06 on the tiny models; an off-by-one position, a missed norm or a wrong rope base moves
# logits by 1e-2 and more.
TOLERANCE = 2e-5
TEXTS = ("Hello world.", "The river was quiet in the morning, and the market was not open yet.", "Good?")
PAIRS = {
    "hy_mt": ("en", "zh"),
    "hy_mt_7b": ("zh", "en"),
    "qwen3": ("en", "fr"),
    "translategemma": ("en", "de"),
    "gemma3_text": ("en", "zh"),
}


def _dirs(request: pytest.FixtureRequest, family: str) -> tuple[Path, Path]:
    return request.getfixturevalue(f"{family}_hf_dir"), request.getfixturevalue(f"{family}_onnx_dir")


def _graphs(onnx_dir: Path) -> DecoderOnlyGraphs:
    return DecoderOnlyGraphs(onnx_dir, read_manifest(onnx_dir), RuntimeOptions(threads=1, verify=False))


def _prompts(onnx_dir: Path, source: str, target: str) -> list[list[int]]:
    """The three TEXTS as the family's prompts, rendered and tokenized torch-free."""
    prompts = Prompts(onnx_dir, read_manifest(onnx_dir))
    return [prompts.ids(text, source, target) for text in TEXTS]


def _hf(hf_dir: Path) -> Any:
    from onnxmt.export.decoder_only import load

    return load(str(hf_dir))


def _reference_logits(model: Any, ids: list[int]) -> np.ndarray:
    """transformers' logits at every position of `ids`, run alone: (len, vocab)."""
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_and_forced_steps_match_transformers(request: pytest.FixtureRequest, family: str) -> None:
    hf_dir, onnx_dir = _dirs(request, family)
    prompts = _prompts(onnx_dir, *PAIRS[family])
    assert len({len(p) for p in prompts}) == 3  # a batch of three prompt lengths
    steps = 12
    rng = np.random.default_rng(0)
    forced = rng.integers(3, read_manifest(onnx_dir).model["vocab_size"] - 1, size=(len(prompts), steps))
    model, graphs = _hf(hf_dir), _graphs(onnx_dir)
    expected = [_reference_logits(model, p + forced[r].tolist()) for r, p in enumerate(prompts)]

    logits, cache = graphs.prefill(prompts)
    assert logits.shape == (3, graphs.vocab_size)
    worst = max(np.abs(logits[r] - expected[r][len(p) - 1]).max() for r, p in enumerate(prompts))
    assert worst < TOLERANCE, f"prefill: {worst}"
    for step in range(steps):
        logits, cache = graphs.step(forced[:, step : step + 1], cache)
        worst = max(np.abs(logits[r] - expected[r][len(p) + step]).max() for r, p in enumerate(prompts))
        assert worst < TOLERANCE, f"step {step}: {worst}"
    assert cache.self_len is not None
    assert cache.self_len.tolist() == [len(p) + steps for p in prompts]


def test_gemma_prompts_cross_the_sliding_window(translategemma_hf_dir: Path, translategemma_onnx_dir: Path) -> None:
    """The parity above covers Gemma's sliding layers: the prompts are longer than the window, and transformers'
    logits at their last position change when the window is widened."""
    model = _hf(translategemma_hf_dir)
    window = model.config.text_config.sliding_window
    prompt = _prompts(translategemma_onnx_dir, "en", "de")[0]
    assert len(prompt) > 4 * window
    windowed = _reference_logits(model, prompt)[-1]
    model.config.text_config.sliding_window = 10 * len(prompt)
    for layer in model.model.language_model.layers:
        if layer.self_attn.sliding_window is not None:
            layer.self_attn.sliding_window = 10 * len(prompt)
    wide = _reference_logits(model, prompt)[-1]
    assert np.abs(windowed - wide).max() > 1e-3


@pytest.mark.parametrize("family", ("hy_mt", "translategemma"))
def test_chunked_prefill_and_joining_rows_match_one_prefill(request: pytest.FixtureRequest, family: str) -> None:
    """A prompt prefilled in chunks, and a prompt joining a cache whose other row is mid-generation, get the logits
    of the prompt prefilled alone (within fp32 rounding: the calls' shapes differ)."""
    _, onnx_dir = _dirs(request, family)
    graphs = _graphs(onnx_dir)
    long, short, _ = _prompts(onnx_dir, *PAIRS[family])
    alone, _ = graphs.prefill([long])

    cache = graphs.empty_cache(1)
    for start in range(0, len(long), 7):
        chunk = np.array([long[start : start + 7]], dtype=np.int64)
        logits, cache = graphs.extend(chunk, np.array([chunk.shape[1]]), cache)
    assert np.abs(logits[0] - alone[0]).max() < TOLERANCE

    # Row 0 has the short prompt and two generated tokens; row 1 joins with the long prompt, in one call.
    _, running = graphs.prefill([short])
    for token in (5, 6):
        _, running = graphs.step(np.array([[token]]), running)
    joined = running.select(np.array([0, 0]))  # row 1: a copy of row 0's buffers, its length 0 (junk, masked)
    assert joined.self_len is not None
    joined = replace(joined, self_len=np.array([joined.self_len[0], 0]))
    ids, _ = right_padded([[7], long])
    logits, joined = graphs.extend(ids, np.array([1, len(long)]), joined)
    assert np.abs(logits[1] - alone[0]).max() < TOLERANCE
    steady, _ = graphs.step(np.array([[7]]), running)
    assert np.abs(logits[0] - steady[0]).max() < TOLERANCE


def _greedy(
    graphs: DecoderOnlyGraphs, prompts: list[list[int]], generation: dict[str, Any], eos: list[int], limit: int
):
    """A test-only greedy loop with transformers' repetition penalty (over the prompt and the output) and stop
    tokens; each row stops at its first eos id, which it keeps, as generate() does."""
    penalty = float(generation.get("repetition_penalty") or 1.0)
    logits, cache = graphs.prefill(prompts)
    seen = [list(p) for p in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(limit):
        tokens = []
        for r, row in enumerate(logits):
            scores = row.copy()
            if penalty != 1.0:
                ids = np.unique(seen[r])
                scores[ids] = np.where(scores[ids] < 0, scores[ids] * penalty, scores[ids] / penalty)
            token = int(np.argmax(scores))
            if not done[r]:
                out[r].append(token)
                seen[r].append(token)
                done[r] = token in eos
            tokens.append(token)
        if all(done):
            break
        logits, cache = graphs.step(np.array(tokens, dtype=np.int64)[:, None], cache)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_loop_gives_generate_tokens(request: pytest.FixtureRequest, family: str) -> None:
    import torch

    hf_dir, onnx_dir = _dirs(request, family)
    manifest = read_manifest(onnx_dir)
    prompts = _prompts(onnx_dir, *PAIRS[family])[:2]
    model = _hf(hf_dir)
    limit = 16
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = model.generate(ids, do_sample=False, max_new_tokens=limit, top_k=None, top_p=None)
            expected.append(generated[0, len(prompt) :].tolist())
    got = _greedy(_graphs(onnx_dir), prompts, manifest.generation, manifest.tokens["eos_ids"], limit)
    assert got == expected
    # Stopping: a random model rarely writes its eos, so one of its own tokens is made a stop token as well.
    stop = expected[0][5]
    eos = [*manifest.tokens["eos_ids"], stop]
    with torch.no_grad():
        for r, prompt in enumerate(prompts):
            ids = torch.tensor([prompt])
            generated = model.generate(
                ids, do_sample=False, max_new_tokens=limit, top_k=None, top_p=None, eos_token_id=eos
            )
            expected[r] = generated[0, len(prompt) :].tolist()  # one row: nothing padded
    stopped = _greedy(_graphs(onnx_dir), prompts, manifest.generation, eos, limit)
    assert stopped == expected
    assert stopped[0][-1] == stop and len(stopped[0]) <= 6
    if family == "hy_mt":  # the penalty is live in this comparison: without it the tokens differ
        assert manifest.generation["repetition_penalty"] == 1.05
        plain = _greedy(_graphs(onnx_dir), prompts, {}, manifest.tokens["eos_ids"], limit)
        assert plain != expected


@pytest.mark.parametrize("family", ("hy_mt", "qwen3", "translategemma"))
def test_a_rows_logits_are_the_same_bits_alone_and_in_a_batch(request: pytest.FixtureRequest, family: str) -> None:
    """Rows of other prompt lengths and cache capacities beside a row change none of its bits, at the prefill and at
    every step (the manifest's rows_bit_exact). Cutting its own prompt into other chunks may (about 1e-6 with the
    separate attention ops; GroupQueryAttention reads keys in position order whatever the chunks): a prompt's chunks
    must not depend on what else runs."""
    _, onnx_dir = _dirs(request, family)
    graphs = _graphs(onnx_dir)
    assert read_manifest(onnx_dir).model["rows_bit_exact"] is True
    rng = np.random.default_rng(1)
    for alone_len, other_len in ((5, 200), (63, 64), (100, 17)):
        row, other = (rng.integers(3, 500, size=n).tolist() for n in (alone_len, other_len))
        alone, alone_cache = graphs.prefill([row])
        batch, batch_cache = graphs.prefill([other, row, other[:3]])
        assert np.array_equal(alone[0], batch[1])
        for t in range(12):
            alone, alone_cache = graphs.step(np.array([[7 + t]]), alone_cache)
            batch, batch_cache = graphs.step(np.array([[9], [7 + t], [11]]), batch_cache)
            assert np.array_equal(alone[0], batch[1]), (alone_len, other_len, t)
    chunked = graphs.empty_cache(1)
    for start in range(0, len(row), 16):
        ids = np.array([row[start : start + 16]])
        logits, chunked = graphs.extend(ids, np.array([ids.shape[1]]), chunked)
    whole, _ = graphs.prefill([row])
    assert np.abs(logits[0] - whole[0]).max() < TOLERANCE


def test_the_separate_attention_graph_matches_transformers_and_keeps_rows_exact(
    translategemma_hf_dir: Path, translategemma_separate_onnx_dir: Path
) -> None:
    """`--separate-attention` (the attention as separate ops that return the new keys and values: any execution
    provider): transformers' logits past the sliding window, and a row's bits alone and beside others."""
    onnx_dir = translategemma_separate_onnx_dir
    graphs = _graphs(onnx_dir)
    assert not graphs.in_place
    prompts = _prompts(onnx_dir, *PAIRS["translategemma"])
    model = _hf(translategemma_hf_dir)
    logits, cache = graphs.prefill(prompts)
    for token in (5, 6, 7):
        logits, cache = graphs.step(np.full((len(prompts), 1), token), cache)
    for r, prompt in enumerate(prompts):
        expected = _reference_logits(model, [*prompt, 5, 6, 7])[-1]
        assert np.abs(logits[r] - expected).max() < TOLERANCE
    alone, alone_cache = graphs.prefill([prompts[1]])
    batch, batch_cache = graphs.prefill(prompts)
    assert np.array_equal(alone[0], batch[1])
    for t in range(3):
        alone, alone_cache = graphs.step(np.array([[7 + t]]), alone_cache)
        batch, batch_cache = graphs.step(np.array([[9], [7 + t], [11]]), batch_cache)
        assert np.array_equal(alone[0], batch[1])


@pytest.mark.parametrize("family", ("hy_mt", "qwen3", "translategemma"))
def test_a_batch_of_four_gives_generates_batched_tokens(request: pytest.FixtureRequest, family: str) -> None:
    """transformers' batched generate() (prompts left-padded, as decoder-only batches are) and the graph's rows of
    their own lengths (nothing padded) give the same tokens."""
    import torch

    hf_dir, onnx_dir = _dirs(request, family)
    manifest = read_manifest(onnx_dir)
    fourth = Prompts(onnx_dir, manifest).ids("A small fast model.", *PAIRS[family])
    prompts = [*_prompts(onnx_dir, *PAIRS[family]), fourth]
    width, pad = max(map(len, prompts)), manifest.tokens["pad"]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        generated = _hf(hf_dir).generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16, top_k=None, top_p=None
        )
    expected = [row[width:].tolist() for row in generated]
    assert all(len(row) == 16 for row in expected)  # no row stopped, so no padding after its output to strip
    got = _greedy(_graphs(onnx_dir), prompts, manifest.generation, manifest.tokens["eos_ids"], 16)
    assert got == expected


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "onnx"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from pathlib import Path
import numpy as np
from onnxmt.manifest import read_manifest
from onnxmt.runtime.decoder_only import DecoderOnlyGraphs, Prompts
from onnxmt.runtime.options import RuntimeOptions
directory = Path(sys.argv[1])
manifest = read_manifest(directory)
ids = Prompts(directory, manifest).ids("Hello world.", "en", "zh")
graphs = DecoderOnlyGraphs(directory, manifest, RuntimeOptions(threads=1))
logits, cache = graphs.prefill([ids])
logits, cache = graphs.step(logits.argmax(-1)[:, None], cache)
print(logits.shape, int(cache.self_len[0]) == len(ids) + 1)
"""


def test_prompts_and_graph_run_without_torch_or_transformers(hy_mt_onnx_dir: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", BLOCKER, str(hy_mt_onnx_dir)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    vocab = read_manifest(hy_mt_onnx_dir).model["vocab_size"]
    assert out.stdout.strip() == f"(1, {vocab}) True"


@pytest.mark.parametrize(("family", "capped"), [("gemma3_text", True), ("translategemma", False)])
def test_soft_capping_as_transformers_applies_it(tmp_path: Path, family: str, capped: bool) -> None:
    """Gemma 3 ships without soft-capping (Gemma 2 had it). Where a config sets both caps, transformers 5 caps the
    final logits of Gemma3ForCausalLM, not of the multimodal wrapper, and no Gemma 3 attention applies its cap: the
    export does the same. The caps are strong, so that getting either wrong moves the logits far past the
    tolerance."""
    from onnxmt.export.exporter import ExportOptions, export
    from onnxmt.testing.decoder_only import DecoderOnlySpec, build_decoder_only

    caps = {"attn_logit_softcapping": 1.0, "final_logit_softcapping": 2.0}
    hf_dir = build_decoder_only(tmp_path / "hf", DecoderOnlySpec(family=family, config_overrides=caps))
    export(str(hf_dir), tmp_path / "onnx", ExportOptions(), progress=lambda _: None)
    model = _hf(hf_dir)
    assert model.config.get_text_config().final_logit_softcapping == 2.0
    prompt = list(range(3, 40))
    expected = _reference_logits(model, prompt)
    assert (np.abs(expected).max() < 2.0) == capped
    graphs = _graphs(tmp_path / "onnx")
    logits, cache = graphs.prefill([prompt[:30]])
    assert np.abs(logits[0] - expected[29]).max() < TOLERANCE
    for i in range(30, len(prompt)):
        logits, cache = graphs.step(np.array([[prompt[i]]]), cache)
        assert np.abs(logits[0] - expected[i]).max() < TOLERANCE, i


def test_qwen3_sliding_window_layers(tmp_path: Path) -> None:
    """Qwen3 with `use_sliding_window` (off in the released configs): layers from max_window_layers on see a window
    of keys, as transformers' masks give them."""
    from onnxmt.export.exporter import ExportOptions, export
    from onnxmt.testing.decoder_only import DecoderOnlySpec, build_decoder_only

    window = {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1}
    hf_dir = build_decoder_only(tmp_path / "hf", DecoderOnlySpec(family="qwen3", config_overrides=window))
    export(str(hf_dir), tmp_path / "onnx", ExportOptions(), progress=lambda _: None)
    model = _hf(hf_dir)
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    prompt = list(range(3, 40))
    expected = _reference_logits(model, prompt)
    graphs = _graphs(tmp_path / "onnx")
    logits, cache = graphs.prefill([prompt[:30]])
    assert np.abs(logits[0] - expected[29]).max() < TOLERANCE
    for i in range(30, len(prompt)):
        logits, cache = graphs.step(np.array([[prompt[i]]]), cache)
        assert np.abs(logits[0] - expected[i]).max() < TOLERANCE, i


def test_the_fixtures_rotary_tables_are_the_families(hy_mt_hf_dir: Path, translategemma_hf_dir: Path) -> None:
    """What the parity tests cover: Hunyuan's "dynamic" rope with alpha is a static NTK-alpha base
    (1e4 * alpha ** (d / (d - 2))), Gemma 3's global layers divide the 1e6 base's frequencies by 8 (linear scaling)
    and its sliding layers use base 1e4."""
    hy = _hf(hy_mt_hf_dir).model.rotary_emb
    d = hy.inv_freq.shape[0] * 2
    assert hy.rope_type == "ntk_alpha"
    base = 1e4 * 1000 ** (d / (d - 2))
    np.testing.assert_allclose(hy.inv_freq.numpy(), 1.0 / base ** (np.arange(0, d, 2) / d), rtol=1e-5)
    gemma = _hf(translategemma_hf_dir).model.language_model.rotary_emb
    steps = np.arange(0, d, 2) / d
    np.testing.assert_allclose(gemma.full_attention_inv_freq.numpy(), 1.0 / 1e6**steps / 8, rtol=1e-5)
    np.testing.assert_allclose(gemma.sliding_attention_inv_freq.numpy(), 1.0 / 1e4**steps, rtol=1e-5)


def test_a_prompt_prefilled_alone_keeps_the_buffers_it_was_prefilled_into(hy_mt_onnx_dir: Path) -> None:
    """The service prefills one prompt per call: its cache is the buffers the graph wrote, not a copy (a copy held
    the prompt's cache twice; it is copied once more into the running batch as it joins). Prompts prefilled
    together get their own rows, copied out, as before; both give the prompt's cache and last logits as one call
    over the whole prompt does."""
    graphs = _graphs(hy_mt_onnx_dir)
    short, _, long = sorted(_prompts(hy_mt_onnx_dir, *PAIRS["hy_mt"]), key=len)
    written: list[tuple[np.ndarray, ...]] = []
    extend = graphs.extend

    def recorded(ids: np.ndarray, lengths: np.ndarray, cache: Any) -> Any:
        logits, cache = extend(ids, lengths, cache)
        written.append(cache.self_kv)
        return logits, cache

    graphs.extend = recorded  # type: ignore[method-assign]
    (alone,) = graphs.prefill_each([long], chunk=16)
    assert len(written) == -(-len(long) // 16)
    assert all(a is b for a, b in zip(alone.self_kv, written[-1], strict=True))
    together = graphs.prefill_each([short, long], chunk=16)
    # The short prompt's row, done first, is copied out of the call's buffers (they run on for the long one).
    assert all(not np.shares_memory(a, b) for a, b in zip(together[0].self_kv, written[-1], strict=True))
    graphs.extend = extend  # type: ignore[method-assign]
    _, whole = graphs.prefill([long])
    n = len(long)
    assert alone.self_len is not None and together[1].self_len is not None
    assert alone.self_len.tolist() == together[1].self_len.tolist() == [n]
    for a, b, c in zip(alone.self_kv, together[1].self_kv, whole.self_kv, strict=True):
        np.testing.assert_array_equal(a[:, :, :n], b[:, :, :n])
        np.testing.assert_allclose(a[:, :, :n], c[:, :, :n], atol=TOLERANCE)
