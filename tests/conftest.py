"""Shared fixtures: tiny random MarianMT models built offline, and their onnxmt exports.

Building needs the export extra (torch, transformers); tests of the run side that need only an exported directory
still get it from here, built once per session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from onnxmt.export.random_model import RandomMarianSpec

TINY = RandomMarianSpec(eos_bias=3.0)
TINY_MULTI = RandomMarianSpec(target_languages=("cmn_Hans", "yue_Hant"), eos_bias=3.0, seed=1)
# A tiny model's tied LM head (~45 kB) is far below the size real heads are cut into chunks at (48 MiB, see
# export/weights.py): cut it anyway (12 chunks in fp32, 3 in int8), so that every test runs the chunked head.
TINY_HEAD_CHUNK_BYTES = 4 << 10


@pytest.fixture(scope="session", autouse=True)
def _chunked_heads() -> Iterator[None]:
    from onnxmt.export import weights

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(weights, "HEAD_CHUNK_BYTES", TINY_HEAD_CHUNK_BYTES)
        yield


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random MarianMT directory (single target language), as transformers saves it."""
    from onnxmt.export.random_model import build_random_marian

    return build_random_marian(tmp_path_factory.mktemp("tiny-hf"), TINY)


@pytest.fixture(scope="session")
def tiny_multi_hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random multi-target MarianMT directory (`>>cmn_Hans<<`, `>>yue_Hant<<` tokens in the vocab)."""
    from onnxmt.export.random_model import build_random_marian

    return build_random_marian(tmp_path_factory.mktemp("tiny-multi-hf"), TINY_MULTI)


@pytest.fixture(scope="session")
def tiny_onnx_dir(tiny_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_hf_dir` exported by onnxmt (fp32). Treat as read-only: copy it before changing anything."""
    from onnxmt.export.exporter import export

    out = tmp_path_factory.mktemp("tiny-onnx") / "model"
    export(str(tiny_hf_dir), out, progress=lambda _: None)
    return out


@pytest.fixture(scope="session")
def tiny_buffered_onnx_dir(tiny_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_hf_dir` exported with `--cache-buffer` (the decoder reads a self-attention cache buffer and returns the
    new token's key and value). Read-only."""
    from onnxmt.export.exporter import ExportOptions, export

    out = tmp_path_factory.mktemp("tiny-buffered-onnx") / "model"
    export(str(tiny_hf_dir), out, ExportOptions(buffered_cache=True), progress=lambda _: None)
    return out


@pytest.fixture(scope="session")
def tiny_multi_onnx_dir(tiny_multi_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_multi_hf_dir` exported by onnxmt (no default target language). Read-only."""
    from onnxmt.export.exporter import export

    out = tmp_path_factory.mktemp("tiny-multi-onnx") / "model"
    export(str(tiny_multi_hf_dir), out, progress=lambda _: None)
    return out


# Optimum exports of `tiny_hf_dir`. Optimum's exporter needs transformers < 4.58, so they are made in a venv of their
# own (tests/optimum_env.py), created on first use and reused across runs.


@pytest.fixture(scope="session")
def optimum_python() -> Path:
    """The Optimum venv's python, created on first use from PyPI. Skips when it cannot be created; in CI, which
    creates it before the tests (.ci/run), fails when it is not there: the CI test run installs nothing."""
    from optimum_env import OptimumEnvError, ensure_venv, venv_path
    from skips import IN_CI, skip

    try:
        return ensure_venv(create=not IN_CI)
    except (OptimumEnvError, OSError) as e:
        skip(f"no Optimum venv at {venv_path()} (`python tests/optimum_env.py venv` creates it; it needs PyPI): {e}")


@pytest.fixture(scope="session")
def tiny_optimum_dir(tiny_hf_dir: Path, optimum_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_hf_dir` exported by Optimum: encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx."""
    from optimum_env import export

    return export(tiny_hf_dir, tmp_path_factory.mktemp("tiny-optimum") / "model", python=optimum_python)


@pytest.fixture(scope="session")
def tiny_optimum_merged_dir(tiny_hf_dir: Path, optimum_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Optimum's default export of `tiny_hf_dir`: the three files above plus decoder_model_merged.onnx."""
    from optimum_env import export

    out = tmp_path_factory.mktemp("tiny-optimum-merged") / "model"
    return export(tiny_hf_dir, out, merged=True, python=optimum_python)
