"""Skips that CI turns into failures.

Outside CI a test skips when something it needs is missing: a package of the dev install, the shared FLORES and
Tatoeba files (`../shared/data` beside the repo), Debian's Chromium, the Optimum venv. In CI (`CI` set, as the CI
service and .ci/run set it) .ci/run installs all of that, so its absence is a broken install, not a reason to skip:
the same calls fail instead, naming what is missing.

Test modules and fixtures import it as `from tests.helpers.skips import ...`.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

from tests.helpers import ROOT

IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
SHARED_DATA = ROOT.parent / "shared" / "data"


def skip(reason: str) -> NoReturn:
    """`pytest.skip(reason)`, or a failure in CI. Works at module level too."""
    if IN_CI:
        pytest.fail(f"{reason} [CI is set: .ci/run provides this, so it fails instead of skipping]", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def importorskip(name: str) -> ModuleType:
    """`pytest.importorskip(name)` for a package the dev install provides: in CI a missing one fails."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        skip(f"needs {name}, which pip install -e '.[export,serve,eval,bench,ray,dev]' installs ({e})")


def shared_data(relative: str) -> Path:
    """A file or folder under ../shared/data; skips (fails in CI) when it is not there."""
    path = SHARED_DATA / relative
    if not path.exists():
        skip(f"shared data not found at {path} (expected ../shared/data beside the repo)")
    return path
