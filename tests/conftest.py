"""Shared fixtures: tiny random models (Marian, M2M100, NLLB-200) built offline, their onnxmt exports, and the
Optimum and Transformers.js layouts of one of them.

Each model is one spec below and one line: `_built` makes a session fixture that builds it (and checks that its
outputs have many lengths), `_exported` one that exports it. Building needs the export extra (torch,
transformers); tests of the run side that need only an exported directory still get it from here, built once per
session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from onnxmt.testing import M2M100Spec, MarianSpec, MBart50Spec, ModelSpec, MT5Spec, NllbSpec, T5Spec, TcBigSpec
from onnxmt.testing.marian import OPUS_MT_EN_ZH_TARGETS
from tests.helpers.hf import M2M100_PAIRS, MBART50_PAIRS, NLLB_PAIRS, assert_varied_m2m100, assert_varied_outputs

# init_std and eos_bias chosen by measurement so that outputs have many lengths (assert_varied_outputs): with
# larger weights a random model loops until the length limit, with a larger eos bias it stops at the first step.
TINY = MarianSpec(init_std=0.2, eos_bias=2.0)
# The multi-target model (opus-mt-en-zh's 13 language tokens) was measured over seeds 0-8 and eos biases 1.5-3.5:
# with a language token in front, no random draw had most outputs longer than 10 tokens; this one has outputs from
# 1 token to the limit, which its tests (language tokens, max_new_tokens 16) need. The parity of long outputs is
# proven on TINY.
# zh→en, with opus-mt-zh-en's metadata (`zho` → `eng`, one target language): the other direction of TINY_MULTI, for
# a service with two models.
TINY_ZH_EN = MarianSpec(init_std=0.2, eos_bias=4.0, seed=3, reverse=True)
TINY_MULTI = MarianSpec(target_languages=OPUS_MT_EN_ZH_TARGETS, init_std=0.2, eos_bias=3.0, seed=6)
# A tiny model's tied LM head (~45 kB) is far below the size real heads are cut into chunks at (48 MiB, see
# export/weights.py): cut it anyway (12 chunks in fp32, 3 in int8), so that every test runs the chunked head.
TINY_HEAD_CHUNK_BYTES = 4 << 10


@pytest.fixture(scope="session", autouse=True)
def _chunked_heads() -> Iterator[None]:
    from onnxmt.export import weights

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(weights, "HEAD_CHUNK_BYTES", TINY_HEAD_CHUNK_BYTES)
        yield


def _varied_per_token(directory: Path) -> None:
    for token in (">>cmn_Hans<<", ">>yue_Hant<<"):
        assert_varied_outputs(directory, token, most_long=False)


def _built(spec: ModelSpec, folder: str, doc: str, check: Callable[[Path], None] | None = None) -> Any:
    """A session fixture: a random model of `spec` built into a fresh folder `folder`, then `check`ed."""

    @pytest.fixture(scope="session")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
        from onnxmt.testing import build_random_model

        directory = build_random_model(tmp_path_factory.mktemp(folder), spec)
        if check is not None:
            check(directory)
        return directory

    fixture.__doc__ = doc
    return fixture


def _exported(hf_fixture: str, folder: str, doc: str, **options: Any) -> Any:
    """A session fixture: the directory of the fixture `hf_fixture` exported by onnxmt with ExportOptions(**options)
    into `folder`/model. Read-only: copy it before changing anything."""

    @pytest.fixture(scope="session")
    def fixture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
        from onnxmt.export.exporter import ExportOptions, export

        out = tmp_path_factory.mktemp(folder) / "model"
        export(str(request.getfixturevalue(hf_fixture)), out, ExportOptions(**options), progress=lambda _: None)
        return out

    fixture.__doc__ = doc
    return fixture


tiny_hf_dir = _built(
    TINY,
    "tiny-hf",
    "A tiny random MarianMT directory (single target language), as transformers saves it.",
    assert_varied_outputs,
)
tiny_multi_hf_dir = _built(
    TINY_MULTI,
    "tiny-multi-hf",
    "A tiny random multi-target MarianMT directory (`>>cmn_Hans<<`, `>>yue_Hant<<` tokens in the vocab).",
    _varied_per_token,
)
tiny_zh_en_hf_dir = _built(TINY_ZH_EN, "tiny-zh-en-hf", "A tiny random zh→en MarianMT directory (TINY_ZH_EN).")
tiny_onnx_dir = _exported("tiny_hf_dir", "tiny-onnx", "`tiny_hf_dir` exported by onnxmt (fp32).")
tiny_concat_onnx_dir = _exported(
    "tiny_hf_dir",
    "tiny-concat-onnx",
    "`tiny_hf_dir` exported with `--cache-concat` (the decoder takes the self-attention cache and returns it grown "
    "by a Concat: the default export until the buffer became it, so directories exported before have it).",
    buffered_cache=False,
)
tiny_multi_onnx_dir = _exported(
    "tiny_multi_hf_dir", "tiny-multi-onnx", "`tiny_multi_hf_dir` exported by onnxmt (no default target language)."
)
tiny_zh_en_onnx_dir = _exported("tiny_zh_en_hf_dir", "tiny-zh-en-onnx", "`tiny_zh_en_hf_dir` exported by onnxmt.")

# Tiny random opus-mt-tc-big models (onnxmt/testing/marian.py TcBigSpec): eos mid-vocab, relu, float16 weights; and
# the separate-vocabulary form. The eos biases and seeds were measured for outputs of many lengths (1 to 63 tokens).
TINY_TC_BIG = TcBigSpec(init_std=0.2, eos_bias=3.2)
TINY_TC_BIG_SEPARATE = TcBigSpec(init_std=0.2, eos_bias=4.1, source_pieces=300, target_vocab_size=200)
tiny_tc_big_hf_dir = _built(TINY_TC_BIG, "tiny-tc-big-hf", "A tiny random opus-mt-tc-big directory (zle-en metadata).")
tiny_tc_big_onnx_dir = _exported("tiny_tc_big_hf_dir", "tiny-tc-big-onnx", "`tiny_tc_big_hf_dir` exported by onnxmt.")
tiny_separate_hf_dir = _built(
    TINY_TC_BIG_SEPARATE, "tiny-separate-hf", "A tiny random Marian directory with separate source/target vocabularies."
)
tiny_separate_onnx_dir = _exported(
    "tiny_separate_hf_dir", "tiny-separate-onnx", "`tiny_separate_hf_dir` exported by onnxmt."
)


@pytest.fixture(scope="session")
def tiny_buffered_onnx_dir(tiny_onnx_dir: Path) -> Path:
    """`tiny_hf_dir` exported with the self-attention cache as a buffer (the decoder reads a buffer and returns the
    new token's key and value): the default export, `tiny_onnx_dir` itself, named for the tests of that form."""
    from onnxmt.manifest import read_manifest

    assert read_manifest(tiny_onnx_dir).graphs["decoder"].has_input("past_length")
    return tiny_onnx_dir


# Optimum exports of `tiny_hf_dir`. Optimum's exporter needs transformers < 4.58, so they are made in a venv of their
# own (tests/helpers/optimum_env.py), created on first use and reused across runs.


@pytest.fixture(scope="session")
def optimum_python() -> Path:
    """The Optimum venv's python, created on first use from PyPI. Skips when it cannot be created; in CI, which
    creates it before the tests (.ci/run), fails when it is not there: the CI test run installs nothing."""
    from tests.helpers.optimum_env import OptimumEnvError, ensure_venv, venv_path
    from tests.helpers.skips import IN_CI, skip

    try:
        return ensure_venv(create=not IN_CI)
    except (OptimumEnvError, OSError) as e:
        skip(
            f"no Optimum venv at {venv_path()} (`python tests/helpers/optimum_env.py venv` creates it; it needs PyPI): "
            f"{e}"
        )


@pytest.fixture(scope="session")
def tiny_optimum_dir(tiny_hf_dir: Path, optimum_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_hf_dir` exported by Optimum: encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx."""
    from tests.helpers.optimum_env import export

    return export(tiny_hf_dir, tmp_path_factory.mktemp("tiny-optimum") / "model", python=optimum_python)


@pytest.fixture(scope="session")
def tiny_optimum_merged_dir(tiny_hf_dir: Path, optimum_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Optimum's default export of `tiny_hf_dir`: the three files above plus decoder_model_merged.onnx."""
    from tests.helpers.optimum_env import export

    out = tmp_path_factory.mktemp("tiny-optimum-merged") / "model"
    return export(tiny_hf_dir, out, merged=True, python=optimum_python)


@pytest.fixture(scope="session")
def tiny_optimum_int8_dir(
    tiny_optimum_dir: Path, optimum_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """`tiny_optimum_dir` quantized by Optimum (ORTQuantizer, its avx2 dynamic recipe: uint8 weights per tensor):
    `*_quantized.onnx` files."""
    from tests.helpers.optimum_env import quantize

    return quantize(tiny_optimum_dir, tmp_path_factory.mktemp("tiny-optimum-int8") / "model", python=optimum_python)


# Transformers.js variants (its scripts/quantize.py): "quantized" is its q8, dynamic 8-bit with int8 weights (uint8
# only for models with Conv), per channel and reduced range for Marian, subgraphs (the merged decoder's If branches)
# included; int8 and uint8 force the weight type.
TRANSFORMERSJS_Q8 = {"quantized": "QInt8", "uint8": "QUInt8"}
TRANSFORMERSJS_GRAPHS = ("encoder_model", "decoder_model_merged")


@pytest.fixture(scope="session")
def tiny_transformersjs_dir(tiny_optimum_merged_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_optimum_merged_dir` laid out as Transformers.js / onnx-community repositories are: configs and tokenizer
    at the top, `onnx/encoder_model{suffix}.onnx` and `onnx/decoder_model_merged{suffix}.onnx` for the variants
    fp32, quantized, uint8, q4, fp16, and an encoder-only `_q4f16` (a variant the decoder lacks). Read-only."""
    import shutil

    out = tmp_path_factory.mktemp("tiny-transformersjs") / "model"
    shutil.copytree(tiny_optimum_merged_dir, out, ignore=shutil.ignore_patterns("*.onnx"))
    onnx_dir = out / "onnx"
    onnx_dir.mkdir()
    for stem in TRANSFORMERSJS_GRAPHS:
        shutil.copy2(tiny_optimum_merged_dir / f"{stem}.onnx", onnx_dir / f"{stem}.onnx")
        make_transformersjs_variants(onnx_dir / f"{stem}.onnx")
    # Only its encoder: a variant listed as incomplete, never mixed with another variant's decoder.
    shutil.copy2(onnx_dir / "encoder_model_fp16.onnx", onnx_dir / "encoder_model_q4f16.onnx")
    return out


def make_transformersjs_variants(path: Path) -> None:
    """`{stem}_quantized`, `_uint8`, `_q4` and `_fp16` beside the fp32 graph at `path`, made as Transformers.js does."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.quantization.registry import IntegerOpsRegistry
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    stem = path.with_suffix("")
    for suffix, weight_type in TRANSFORMERSJS_Q8.items():
        quantize_dynamic(
            path,
            f"{stem}_{suffix}.onnx",
            per_channel=True,
            reduce_range=True,
            weight_type=getattr(QuantType, weight_type),
            op_types_to_quantize=list(IntegerOpsRegistry),
            extra_options={"EnableSubgraph": True, "MatMulConstBOnly": True},
        )
    q4 = MatMulNBitsQuantizer(onnx.load(path), block_size=32, is_symmetric=True)
    q4.process()
    q4.model.save_model_to_file(f"{stem}_q4.onnx")
    # fp16 inputs and outputs (keep_io_types=False), the case the runtime has to cast for. Range stays off the
    # block list: blocking it makes the converter put its input Cast in the outer graph of the merged decoder, out
    # of reach of the If branch that uses it (an invalid model); its inputs here are integers anyway.
    blocked = [op for op in DEFAULT_OP_BLOCK_LIST if op != "Range"]
    onnx.save(
        convert_float_to_float16(onnx.load(path), keep_io_types=False, op_block_list=blocked), f"{stem}_fp16.onnx"
    )


# Tiny random M2M100 and NLLB-200 models (onnxmt/testing/m2m100.py), with the real checkpoints' metadata. M2M100 has
# no final_logits_bias: eos is raised through the final layer norm instead. The biases were measured (seed 0,
# init_std 0.2) so that outputs have many lengths over the target languages the tests use (assert_varied_m2m100).
TINY_M2M100 = M2M100Spec(eos_bias=4.5)
TINY_NLLB = NllbSpec(eos_bias=5.0, seed=6)

tiny_m2m100_hf_dir = _built(
    TINY_M2M100, "tiny-m2m100-hf", "A tiny random M2M100 directory.", lambda d: assert_varied_m2m100(d, *M2M100_PAIRS)
)
tiny_nllb_hf_dir = _built(
    TINY_NLLB, "tiny-nllb-hf", "A tiny random NLLB-200 directory.", lambda d: assert_varied_m2m100(d, *NLLB_PAIRS)
)
tiny_m2m100_onnx_dir = _exported("tiny_m2m100_hf_dir", "tiny-m2m100-onnx", "`tiny_m2m100_hf_dir` exported by onnxmt.")
tiny_nllb_onnx_dir = _exported("tiny_nllb_hf_dir", "tiny-nllb-onnx", "`tiny_nllb_hf_dir` exported by onnxmt.")

# A tiny random mBART-50 many-to-many model (onnxmt/testing/mbart.py), with the real checkpoint's metadata; the eos
# bias and seed were measured so that outputs have many lengths (assert_varied_m2m100).
TINY_MBART50 = MBart50Spec(eos_bias=3.0, seed=1)
tiny_mbart50_hf_dir = _built(
    TINY_MBART50, "tiny-mbart50-hf", "A tiny random mBART-50 directory.",
    lambda d: assert_varied_m2m100(d, *MBART50_PAIRS),
)  # fmt: skip
# Tiny random T5 models (onnxmt/testing/t5.py): t5-small's layout and MADLAD-400's. n_positions 256, so that decoding
# runs past 128 positions, where the relative position buckets saturate; init and eos bias measured for outputs of
# several lengths.
TINY_T5 = T5Spec(init_std=1.0, eos_bias=4.0)
TINY_MADLAD = T5Spec(init_std=1.0, eos_bias=1.2, madlad=True)  # its own head: outputs of 1-2 and 51-60+ tokens
tiny_t5_hf_dir = _built(TINY_T5, "tiny-t5-hf", "A tiny random T5 directory (t5-small's layout and task prefixes).")
tiny_t5_onnx_dir = _exported("tiny_t5_hf_dir", "tiny-t5-onnx", "`tiny_t5_hf_dir` exported by onnxmt.")
tiny_madlad_hf_dir = _built(TINY_MADLAD, "tiny-madlad-hf", "A tiny random MADLAD-400 directory (<2xx> tokens).")
tiny_madlad_onnx_dir = _exported("tiny_madlad_hf_dir", "tiny-madlad-onnx", "`tiny_madlad_hf_dir` exported by onnxmt.")
# A tiny random mT5 model (google/mt5-base's metadata, only spiece.model); eos bias measured (seed 0): greedy outputs
# of 1 to 255 tokens, 12 lengths, over tests/helpers/sentences.py.
TINY_MT5 = MT5Spec(init_std=1.0, eos_bias=0.6)
tiny_mt5_hf_dir = _built(TINY_MT5, "tiny-mt5-hf", "A tiny random mT5 directory (spiece.model, no tokenizer.json).")
tiny_mt5_onnx_dir = _exported("tiny_mt5_hf_dir", "tiny-mt5-onnx", "`tiny_mt5_hf_dir` exported by onnxmt.")


@pytest.fixture(scope="session")
def tiny_madlad_no_length_hf_dir(tiny_madlad_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_madlad_hf_dir` with no length in its configs, as MADLAD-400 and mT5 ship them (ids only). Read-only."""
    import json
    import shutil

    out = Path(shutil.copytree(tiny_madlad_hf_dir, tmp_path_factory.mktemp("tiny-madlad-no-length-hf") / "model"))
    for name in ("config.json", "generation_config.json"):
        data = json.loads((out / name).read_text(encoding="utf-8"))
        data.pop("max_length", None)
        (out / name).write_text(json.dumps(data), encoding="utf-8")
    return out


tiny_madlad_no_length_onnx_dir = _exported(
    "tiny_madlad_no_length_hf_dir", "tiny-madlad-no-length-onnx", "`tiny_madlad_no_length_hf_dir` exported by onnxmt."
)
tiny_mbart50_onnx_dir = _exported(
    "tiny_mbart50_hf_dir", "tiny-mbart50-onnx", "`tiny_mbart50_hf_dir` exported by onnxmt."
)


# Tiny random decoder-only translators (onnxmt/testing/decoder_only.py): HY-MT1.5-1.8B's, Qwen3-0.6B's and
# TranslateGemma-4B's configs shrunk, real transformers classes, BPE tokenizers with the families' special tokens
# and chat templates; and their onnxmt exports.
def _built_decoder_only(family: str) -> Any:
    @pytest.fixture(scope="session")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
        from onnxmt.testing.decoder_only import DecoderOnlySpec, build_decoder_only

        return build_decoder_only(tmp_path_factory.mktemp(f"{family}-hf"), DecoderOnlySpec(family=family))

    fixture.__doc__ = f"A tiny random {family} directory, as transformers saves it (testing/decoder_only.py)."
    return fixture


hy_mt_hf_dir = _built_decoder_only("hy_mt")
hy_mt_7b_hf_dir = _built_decoder_only("hy_mt_7b")
qwen3_hf_dir = _built_decoder_only("qwen3")
translategemma_hf_dir = _built_decoder_only("translategemma")
gemma3_text_hf_dir = _built_decoder_only("gemma3_text")
hy_mt_onnx_dir = _exported("hy_mt_hf_dir", "hy-mt-onnx", "`hy_mt_hf_dir` exported by onnxmt (fp32).")
hy_mt_7b_onnx_dir = _exported("hy_mt_7b_hf_dir", "hy-mt-7b-onnx", "`hy_mt_7b_hf_dir` exported by onnxmt (fp32).")
qwen3_onnx_dir = _exported("qwen3_hf_dir", "qwen3-onnx", "`qwen3_hf_dir` exported by onnxmt (fp32).")
translategemma_onnx_dir = _exported(
    "translategemma_hf_dir", "translategemma-onnx", "`translategemma_hf_dir` exported by onnxmt (fp32)."
)
gemma3_text_onnx_dir = _exported(
    "gemma3_text_hf_dir", "gemma3-text-onnx", "`gemma3_text_hf_dir` exported by onnxmt (fp32)."
)
translategemma_separate_onnx_dir = _exported(
    "translategemma_hf_dir",
    "translategemma-separate-onnx",
    "`translategemma_hf_dir` exported with `--separate-attention` (no GroupQueryAttention; fp32).",
    fused_attention=False,
)
