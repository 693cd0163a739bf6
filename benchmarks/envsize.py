"""How much disk an environment that translates needs: onnxmt's base install next to torch + transformers.

Two venvs made with `python -m venv` under the benchmark cache, each installed once (a stamp file records the
requirements) and measured every run: the size of site-packages and the number of distributions in it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAMP = "bench-requirements.txt"


def _transformers_pin() -> str:
    # The version the benchmark's transformers row runs, so both figures describe the same install.
    try:
        return f"transformers=={metadata.version('transformers')}"
    except metadata.PackageNotFoundError:
        return "transformers"


def environments() -> dict[str, list[str]]:
    """Name -> pip requirements. torch is pinned exactly: any other spec pulls a multi-GB CUDA build here."""
    return {
        "onnxmt (base install)": [str(REPO)],
        "torch + transformers": ["torch==2.13.0", _transformers_pin(), "sentencepiece"],
    }


def _run(command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")


def ensure_venv(venv: Path, requirements: list[str], log: Callable[[str], None]) -> Path:
    wanted = "\n".join(requirements) + "\n"
    if str(REPO) in requirements:
        # onnxmt's own dependencies decide the size: reinstall when they change.
        wanted += hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest() + "\n"
    stamp = venv / STAMP
    if stamp.is_file() and stamp.read_text() == wanted:
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    log(f"creating {venv.name}: pip install {' '.join(requirements)}")
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-input", "--progress-bar", "off", *requirements])
    stamp.write_text(wanted)
    return venv


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python*/site-packages"))


def tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def measure(cache: Path, log: Callable[[str], None] = print) -> dict[str, dict]:
    """Per environment: site-packages bytes (pip, which every venv has, included), distribution count, and the
    requirements installed."""
    results = {}
    for i, (name, requirements) in enumerate(environments().items()):
        venv = ensure_venv(cache / f"venv-{i}", requirements, log)
        packages = site_packages(venv)
        dists = [d.name for d in packages.glob("*.dist-info")]
        results[name] = {
            "site_packages_bytes": tree_size(packages),
            "distributions": len(dists),
            "requirements": requirements,
        }
    return results
