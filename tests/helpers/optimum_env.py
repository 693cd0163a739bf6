"""A separate virtualenv with Optimum's ONNX exporter, and exports of HF model directories made with it.

Optimum's exporter (optimum-onnx 0.1.0) needs transformers < 4.58 and fails to import with the 5.x our main
environment has, so the tests that load Optimum-layout directories build them in a venv of their own, created once
per machine and reused (a stamp file records what was installed; a different pin list rebuilds it).

    python tests/helpers/optimum_env.py venv                       # create the venv if needed, print its python
    python tests/helpers/optimum_env.py export HF_DIR OUT          # encoder + decoder + decoder_with_past
    python tests/helpers/optimum_env.py export HF_DIR OUT --merged # those three + decoder_model_merged (the default)

`quantize(EXPORT_DIR, OUT)` quantizes a three-file export with Optimum's ORTQuantizer (`*_quantized.onnx`).

The venv lives in $ONNXMT_OPTIMUM_VENV, else in $XDG_CACHE_HOME/onnxmt-test/optimum-venv (~/.cache by default);
it takes ~1.3 GB. Creating it is the one step of the test suite that downloads (from PyPI): the `optimum_python`
fixture does it on first use, and .ci/run does it as a step of its own before the tests, which under CI never
create it.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# torch is pinned exactly: any other spec pulls a multi-GB CUDA build on our machines.
REQUIREMENTS = (
    "torch==2.13.0",
    "transformers==4.57.6",
    "optimum==2.1.0",
    "optimum-onnx==0.1.0",
    "onnx",
    "onnxruntime",
    "sentencepiece",
)
STAMP = "onnxmt-requirements.txt"
# Files the runtime reads besides the graphs; Optimum saves them itself, this makes sure.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


class OptimumEnvError(RuntimeError):
    """The venv could not be created or the export failed; the message holds the command's output."""


def venv_path() -> Path:
    if os.environ.get("ONNXMT_OPTIMUM_VENV"):
        return Path(os.environ["ONNXMT_OPTIMUM_VENV"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "onnxmt-test" / "optimum-venv"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(command: list[str | Path], env: dict[str, str] | None = None) -> str:
    # Our own environment must not leak into the venv's interpreter (PYTHONPATH, VIRTUAL_ENV...).
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    result = subprocess.run(
        [str(c) for c in command],
        env={**clean, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if result.returncode != 0:
        raise OptimumEnvError(f"`{' '.join(map(str, command))}` failed ({result.returncode}):\n{result.stdout[-6000:]}")
    return result.stdout


def ensure_venv(venv: Path | None = None, *, create: bool = True, log: Callable[[str], object] = print) -> Path:
    """The venv's python, creating the venv first (from PyPI) when it is missing or was built from other
    requirements; with create=False such a venv is an OptimumEnvError instead."""
    venv = venv or venv_path()
    venv.parent.mkdir(parents=True, exist_ok=True)
    wanted = "\n".join(REQUIREMENTS) + "\n"
    # Concurrent test sessions on one machine share the venv: one builds, the others wait.
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = venv / STAMP
        if stamp.is_file() and stamp.read_text() == wanted and _python(venv).is_file():
            return _python(venv)
        if not create:
            raise OptimumEnvError(f"{venv} is missing or out of date (its {STAMP} is not REQUIREMENTS)")
        shutil.rmtree(venv, ignore_errors=True)
        start = time.monotonic()
        log(f"creating the Optimum venv {venv} from PyPI ({' '.join(REQUIREMENTS)})")
        try:
            _run([sys.executable, "-m", "venv", venv])
            _run([_python(venv), "-m", "pip", "install", "--no-input", "--progress-bar", "off", *REQUIREMENTS])
        except (OptimumEnvError, OSError):
            shutil.rmtree(venv, ignore_errors=True)
            raise
        stamp.write_text(wanted)  # last: a venv without its stamp is rebuilt
        log(f"created {venv} in {time.monotonic() - start:.0f} s")
    return _python(venv)


def export(model_dir: Path, out: Path, *, merged: bool = False, python: Path | None = None) -> Path:
    """Export `model_dir` with `optimum-cli export onnx` into `out` (which must not exist); returns `out`.

    merged=False writes encoder_model.onnx, decoder_model.onnx and decoder_with_past_model.onnx; merged=True is
    Optimum's default export, which adds decoder_model_merged.onnx beside those three.
    """
    python = python or ensure_venv()
    if out.exists():
        raise FileExistsError(f"{out} exists; export into a new directory")
    command: list[str | Path] = [python.parent / "optimum-cli", "export", "onnx", "--model", model_dir]
    command += ["--task", "text2text-generation-with-past", "--device", "cpu"]
    if not merged:
        # Optimum's post-processing is what merges the two decoders (and keeps them beside the merged one).
        command.append("--no-post-process")
    command.append(out)
    _run(command, env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    for name in MODEL_FILES:
        if (model_dir / name).is_file() and not (out / name).is_file():
            shutil.copy2(model_dir / name, out / name)
    return out


# Optimum's dynamic 8-bit recipe for AVX2 CPUs (uint8 weights, per tensor), run by its ORTQuantizer in the venv.
_QUANTIZE = """
import sys
from optimum.onnxruntime import ORTQuantizer
from optimum.onnxruntime.configuration import AutoQuantizationConfig

source, out, *names = sys.argv[1:]
config = AutoQuantizationConfig.avx2(is_static=False, per_channel=False)
for name in names:
    ORTQuantizer.from_pretrained(source, file_name=name).quantize(save_dir=out, quantization_config=config)
"""


def quantize(export_dir: Path, out: Path, *, python: Path | None = None) -> Path:
    """Quantize a three-file export (see `export`) with Optimum's ORTQuantizer into `out`: `*_quantized.onnx` files,
    Optimum's naming, beside the config and tokenizer files (Optimum copies all but generation_config.json)."""
    python = python or ensure_venv()
    names = ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx")
    _run([python, "-c", _QUANTIZE, export_dir, out, *names], env={"HF_HUB_OFFLINE": "1"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("venv", help="create the venv if needed and print its python")
    exporter = sub.add_parser("export", help="export a HF model directory with Optimum")
    exporter.add_argument("model_dir", type=Path)
    exporter.add_argument("out", type=Path)
    exporter.add_argument("--merged", action="store_true", help="Optimum's default: also decoder_model_merged.onnx")
    args = parser.parse_args()
    try:
        if args.command == "venv":
            print(ensure_venv(log=lambda m: print(m, file=sys.stderr)))
        else:
            print(export(args.model_dir, args.out, merged=args.merged))
    except OptimumEnvError as e:
        sys.exit(str(e))


if __name__ == "__main__":
    main()
