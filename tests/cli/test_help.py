"""`onnxmt --help` and every command's `--help` read whole on an 80-column terminal; `--version`; completion."""

from __future__ import annotations

import re

import pytest
import typer

from onnxmt import __version__
from onnxmt.cli import app
from tests.helpers.cli import run_cli

COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def _flag_names(command: str) -> list[str]:
    group = typer.main.get_command(app)
    params = group.commands[command].params  # type: ignore[attr-defined]
    return [name for p in params if p.param_type_name == "option" for name in (*p.opts, *p.secondary_opts)]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_and_names_every_flag_whole(command: str) -> None:
    done = run_cli(command, "--help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in done.stdout
    words = set(re.findall(r"(?<![\w-])--?[\w-]+", done.stdout))
    missing = [name for name in _flag_names(command) if name not in words]
    assert not missing, missing
    usage = next(line for line in lines if "Usage:" in line)
    assert usage.strip().startswith(f"Usage: onnxmt {command} [OPTIONS]")
    assert not re.search(r"[{}]", usage), usage
    assert not re.search(r"<(bool|str|int|float|path|list\[\w+\])>", done.stdout)


def test_serve_help_groups_its_flags_in_panels() -> None:
    done = run_cli("serve", "--help")
    panels = re.findall(r"╭─ (.+?) ─", done.stdout)
    for panel in ("Server", "Requests and batching", "Documents (/translate_file)", "Ray Serve replicas (--ray)"):
        assert panel in panels
    assert "Service" not in panels  # every ServeOptions field has its panel (a new one lands there)


def test_version_and_completion() -> None:
    for flag in ("--version", "-V"):
        done = run_cli(flag)
        assert done.returncode == 0 and done.stdout.strip() == f"onnxmt {__version__}", done
    root = run_cli("--help")
    assert "--install-completion" in root.stdout and "--show-completion" in root.stdout
    assert "Usage: onnxmt [OPTIONS] COMMAND" in root.stdout
