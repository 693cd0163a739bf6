"""Every code block of README.md runs as written, against tiny random models, in a fresh directory of its own.

The README's names stand for tiny models: `Helsinki-NLP/opus-mt-en-zh` and `./opus-mt-en-zh` for a multi-target
MarianMT directory with opus-mt-en-zh's languages, `opus-mt-en-zh-onnx` for its export, `nllb-onnx` for a tiny
NLLB-200, and so on (WORLD). A block's directory holds all of them except what the block writes itself. What a
test cannot run as written is replaced, each for a stated reason (REWRITES): installing (tests/test_packaging.py
builds and installs the package), the test suite itself, a service that runs until stopped (started in the
background on a free port, stopped after the block).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.helpers.cli import SRC, run_cli

README = ROOT / "README.md"
HUB_ID = "Helsinki-NLP/opus-mt-en-zh"
ENGLISH = "Hello world\nHow are you?\nThe weather is nice today.\n"
CHINESE = "你好，世界\n你好吗？\n今天天气很好。\n"


def _blocks() -> list[tuple[str, str, str]]:
    """(id, language, code) of every ```bash and ```python block, the id from the section heading."""
    blocks, heading, count = [], "top", 0
    text = README.read_text(encoding="utf-8")
    for match in re.finditer(r"^## ([^\n]+)$|^```(bash|python)\n(.*?)^```$", text, re.M | re.S):
        if match.group(1):
            heading, count = match.group(1).strip(), 0
            continue
        count += 1
        ident = re.sub(r"\W+", "-", heading.lower()).strip("-") + (f"-{count}" if count > 1 else "")
        blocks.append((ident, match.group(2), match.group(3)))
    return blocks


BLOCKS = _blocks()


def _written(code: str) -> set[str]:
    """The names a block writes: export/quantize/translate-corpus outputs, -o/--output, `> file`, a built model."""
    names = set()
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True) if line.strip() else []
        for command in ("export", "quantize", "translate-corpus"):
            if command in words:
                positional = [w for w in words[words.index(command) + 1 :] if not w.startswith("-")]
                names.add(Path(positional[1]).name if len(positional) > 1 else "")
        for flag in ("-o", "--output"):
            if flag in words:
                names.add(Path(words[words.index(flag) + 1]).name)
        names.update(re.findall(r">\s*([\w.-]+)", line))
        names.update(re.findall(r"build_random_model\('([\w.-]+)'", line))
    return names - {""}


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_multi_hf_dir: Path,
    tiny_zh_en_onnx_dir: Path,
    tiny_nllb_onnx_dir: Path,
    tiny_mbart50_onnx_dir: Path,
    tiny_madlad_onnx_dir: Path,
    hy_mt_onnx_dir: Path,
    translategemma_onnx_dir: Path,
    qwen3_onnx_dir: Path,
) -> Path:
    """The files README blocks read: tiny models under the README's names (one per family), texts, a corpus."""
    world = tmp_path_factory.mktemp("readme-world")
    (world / "opus-mt-en-zh").symlink_to(tiny_multi_hf_dir)
    for name, directory in (
        ("opus-mt-zh-en-onnx", tiny_zh_en_onnx_dir),
        ("nllb-onnx", tiny_nllb_onnx_dir),
        ("mbart-onnx", tiny_mbart50_onnx_dir),
        ("madlad-onnx", tiny_madlad_onnx_dir),
        ("hy-mt-onnx", hy_mt_onnx_dir),
        ("translategemma-onnx", translategemma_onnx_dir),
        ("qwen3-onnx", qwen3_onnx_dir),
    ):
        (world / name).symlink_to(directory)
    done = run_cli("export", str(tiny_multi_hf_dir), str(world / "opus-mt-en-zh-onnx"), "--default-target", "cmn_Hans")
    assert done.returncode == 0, done.stderr
    done = run_cli("quantize", str(world / "opus-mt-en-zh-onnx"), str(world / "opus-mt-en-zh-int8"))
    assert done.returncode == 0, done.stderr
    for name, text in (("en.txt", ENGLISH), ("zh.txt", CHINESE), ("devtest.eng_Latn", ENGLISH)):
        (world / name).write_text(text, encoding="utf-8")
    (world / "devtest.zho_Hans").write_text(CHINESE, encoding="utf-8")
    lines = [f'{{"id": {i}, "text": "{line}"}}' for i, line in enumerate(ENGLISH.splitlines())]
    (world / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return world


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rewrite(line: str, ports: Iterator[int], first_port: list[int]) -> str:
    """REWRITES: what a test cannot run as written, and why."""
    line = line.replace(HUB_ID, "./opus-mt-en-zh")  # the tiny stand-in: nothing is downloaded
    # Installing is tests/test_packaging.py's (build, fresh venv); the suite does not run itself.
    line = re.sub(r"pip install (-e )?\"[^\"]*\"", "true", line)
    line = line.replace("python -m pytest", "true")
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # a line continued on the next (`\` at its end): not a serve line
        words = []
    if words[:2] == ["onnxmt", "serve"]:
        # Runs until stopped: in the background on a free port, until it answers, stopped after the block.
        port = next(ports)
        if "--port" in words:
            words[words.index("--port") + 1] = str(port)
        else:
            words += ["--port", str(port)]
        first_port.append(port)
        return f"{shlex.join(words)} >>serve.log 2>&1 & pids+=($!); ready {port}"
    if first_port:
        line = line.replace("localhost:5000", f"localhost:{first_port[0]}")
    return line


PRELUDE = """set -euo pipefail
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
ready() {
  for _ in $(seq 300); do curl -sf "localhost:$1/ready" >/dev/null && return 0; sleep 0.2; done
  cat serve.log; return 1
}
"""


def _environment(tmp_path: Path, world: Path) -> dict[str, str]:
    """`onnxmt` and `python` as a user's PATH has them (this onnxmt), no hub, caches in the test's directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "onnxmt").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m onnxmt "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "COLUMNS": "80",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf-home"),
        "ONNXMT_CACHE": str(tmp_path / "onnxmt-cache"),
        # The README's "first translation" of the default model: the tiny export stands in for the hub's.
        "ONNXMT_MODEL": str(world / "opus-mt-en-zh-onnx"),
    }


@pytest.mark.parametrize(
    ("ident", "language", "code"),
    [pytest.param(*block, id=block[0]) for block in BLOCKS],
)
def test_readme_block_runs_as_written(ident: str, language: str, code: str, world: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for entry in world.iterdir():
        if entry.name not in _written(code):
            (work / entry.name).symlink_to(entry.resolve())
    env = _environment(tmp_path, world)
    if language == "python":
        done = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True)
    else:
        ports = iter(_free_port() for _ in range(8))
        first_port: list[int] = []
        script = PRELUDE + "\n".join(_rewrite(line, ports, first_port) for line in code.splitlines()) + "\n"
        done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"{ident}:\n{code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )
    assert "Traceback" not in done.stderr, done.stderr
    if "curl" in code:
        assert "translatedText" in done.stdout, done.stdout


def test_every_block_is_collected() -> None:
    """The README has the blocks this test runs: the families, its setup, the tiny tour, the library, the
    service."""
    idents = [ident for ident, _, _ in BLOCKS]
    assert len(BLOCKS) >= 10
    for expected in ("top", "set-up", "without-the-hub", "use-it-as-a-library", "serve-over-http"):
        assert expected in idents, idents
