"""`python -m build` makes an sdist and a wheel that install in a fresh venv and run, with the metadata an index
would show (license, classifiers, py.typed), and install hints that name how this onnxmt was installed.

The build runs without isolation (setuptools from this environment) and the fresh venv borrows this environment's
packages for onnxmt's dependencies, so nothing is downloaded; .ci/run builds the same way with isolation and
installs the wheel with its dependencies from the index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from onnxmt.extras import install_command
from tests.helpers import ROOT
from tests.helpers.skips import importorskip

FILES = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from a copy of the checkout (the build writes egg-info beside the sources)."""
    importorskip("build")
    tree, out = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("dist")
    for name in FILES:
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_sdist_and_wheel_carry_the_package_and_its_metadata(dist: Path) -> None:
    (sdist,) = dist.glob("onnxmt-*.tar.gz")
    (wheel,) = dist.glob("onnxmt-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for packaged in ("onnxmt/py.typed", "onnxmt/serve/static/index.html", "onnxmt/runtime/ops/topk.onnx"):
        assert packaged in names
    assert any(name.endswith("licenses/LICENSE") for name in names)
    assert not any(name.startswith("tests/") for name in names)
    metadata_name = next(name for name in names if name.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(zipfile.ZipFile(wheel).read(metadata_name).decode())
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Documentation", "Issues", "Source"}
    assert all(url.startswith(urls["Homepage"]) for url in urls.values()), urls  # all in the one repository
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"export", "serve", "documents", "eval", "bench", "ray", "dev"} <= extras
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert {"LICENSE", "README.md", "pyproject.toml", "src/onnxmt/py.typed", "src/onnxmt/serve/static/index.html"} <= (
        members
    )


def test_wheel_installs_in_a_fresh_venv_and_translates(dist: Path, tiny_onnx_dir: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("onnxmt-*-py3-none-any.whl")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    purelib = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True, env=env
        ).strip()
    )
    # onnxmt's dependencies from this environment, after the venv's own site-packages (a path line in a .pth adds
    # the directory, not the .pth files in it, so this environment's own onnxmt, editable or not, stays out).
    (purelib / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)]
    done = subprocess.run(install, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    onnxmt = venv / "bin" / "onnxmt"
    where = subprocess.run(
        [str(python), "-c", "import onnxmt; print(onnxmt.__file__)"], capture_output=True, text=True, env=env
    )
    assert where.stdout.startswith(str(purelib)), where
    version = subprocess.run([str(onnxmt), "--version"], capture_output=True, text=True, env=env)
    assert version.returncode == 0 and version.stdout.startswith("onnxmt 0."), version
    translated = subprocess.run(
        [str(onnxmt), "translate", "-m", str(tiny_onnx_dir), "--max-new-tokens", "4", "Hello world"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert translated.returncode == 0 and translated.stdout.strip(), translated.stderr
    hint = subprocess.run(
        [str(python), "-c", "from onnxmt.extras import install_command; print(install_command('serve'))"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert hint.stdout.strip() == f"pip install '{wheel}[serve]'"


def test_install_hint_names_this_checkout_quoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From a checkout (editable or run from src/): the checkout's path, quoted for zsh, never the bare name of a
    package no index has."""
    monkeypatch.chdir(tmp_path)
    command = install_command("documents")
    assert command.startswith("pip install ")
    assert "'" in command and command.endswith("[documents]'")
    assert str(ROOT) in command
    monkeypatch.chdir(ROOT)
    assert install_command("documents") in ("pip install -e '.[documents]'", "pip install '.[documents]'")
