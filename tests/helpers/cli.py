"""The `onnxmt` command as a user runs it: a subprocess on an 80-column terminal, with the onnxmt under test.

`blocked` modules fail to import in the child (`sys.modules[name] = None`), as they would in an install without
the extra that brings them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnxmt

SRC = Path(onnxmt.__file__).resolve().parents[1]
_PRELUDE = "import sys\nfor name in {blocked!r}: sys.modules[name] = None\nfrom onnxmt.cli import main\nmain()\n"


def run_cli(
    *args: str,
    input: str | bytes | None = None,
    env: dict[str, str] | None = None,
    blocked: tuple[str, ...] = (),
    cwd: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`onnxmt ARGS` with stdout and stderr as text (undecodable bytes replaced), COLUMNS=80."""
    environment = {**os.environ, "COLUMNS": "80", "LINES": "24", "TERM": "dumb", "NO_COLOR": "1", **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [environment.get("PYTHONPATH")])])
    code = _PRELUDE.format(blocked=blocked)
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        input=input.encode() if isinstance(input, str) else input,
        capture_output=True,
        env=environment,
        cwd=cwd,
        timeout=timeout,
    )
    return subprocess.CompletedProcess(
        done.args,
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error message of a run that failed as a user error: exit code 2, one `Error:` line, no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("Error: "), done.stderr
    return lines[-1].removeprefix("Error: ")
