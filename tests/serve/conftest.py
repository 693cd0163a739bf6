"""Fixtures of the service's tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.node import JS_DIR
from tests.helpers.skips import skip


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """tests/helpers/js/node_modules with the npm `libretranslate` package (package.json pins it). Skips without npm,
    except in CI (CI=1), where a missing npm is a failure."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        skip("npm and node are needed for the npm LibreTranslate client test")
    if not (JS_DIR / "node_modules" / "libretranslate").is_dir():
        subprocess.run([npm, "install", "--no-audit", "--no-fund"], cwd=JS_DIR, check=True, timeout=600)
    return JS_DIR / "node_modules"
