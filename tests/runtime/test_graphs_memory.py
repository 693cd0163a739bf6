"""`release_memory`: clean pages of a model's mapped files leave the process, written ones stay."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest

from onnxmt.runtime.sessions import release_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="smaps and madvise are Linux's")

SIZE = 8 << 20


def _resident_kb(path: Path) -> int:
    """Rss of this process's mappings of `path`, from /proc/self/smaps."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def _mapped(path: Path) -> mmap.mmap:
    path.write_bytes(bytes(range(256)) * (SIZE // 256))
    with open(path, "r+b") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private and writable, as ONNX Runtime maps
    assert sum(mapping[i + 1] for i in range(0, SIZE, 4096)) == SIZE // 4096  # touch every page
    return mapping


def test_clean_mapped_pages_are_released_and_read_back_unchanged(tmp_path: Path) -> None:
    path = (tmp_path / "shared_weights.bin").resolve()
    mapping = _mapped(path)
    assert _resident_kb(path) >= SIZE // 1024 * 9 // 10
    assert release_memory(tmp_path) >= SIZE
    assert _resident_kb(path) < SIZE // 1024 // 10
    assert mapping[: 1 << 20] == path.read_bytes()[: 1 << 20]  # faulted back in from the file
    mapping.close()


def test_a_mapping_the_process_wrote_to_is_left_alone(tmp_path: Path) -> None:
    path = (tmp_path / "shared_weights.bin").resolve()
    mapping = _mapped(path)
    mapping[100] = 7  # a private copy of that page now differs from the file: dropping it would lose the write
    assert release_memory(tmp_path) == 0
    assert mapping[100] == 7 and mapping[101] == 101
    mapping.close()


def test_other_directories_are_not_touched(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    path = (tmp_path / "elsewhere.bin").resolve()
    mapping = _mapped(path)
    assert release_memory(tmp_path / "model") == 0
    assert _resident_kb(path) >= SIZE // 1024 * 9 // 10
    mapping.close()


def test_the_encoder_runs_without_an_arena_and_translates_the_same(tiny_onnx_dir: Path) -> None:
    """The encoder's session has no CPU memory arena (an arena keeps the largest batch's activations for good), the
    decoder's has one; without the arena the encoder's outputs are the same as with it."""
    import numpy as np

    from onnxmt.runtime.options import RuntimeOptions
    from onnxmt.runtime.sessions import load_session
    from onnxmt.runtime.translator import Translator

    translator = Translator(tiny_onnx_dir)
    graphs = translator.graphs
    assert graphs.encoder.get_session_options().enable_cpu_mem_arena is False
    assert graphs.decoder.get_session_options().enable_cpu_mem_arena is True
    with_arena = load_session(tiny_onnx_dir / translator.manifest.graphs["encoder"].file, RuntimeOptions())
    ids = np.array([translator.tokenizer.encode("Where is the doctor? The river is long.")], dtype=np.int64)
    feed = dict(zip(graphs.enc_in, (ids, np.ones_like(ids)), strict=True))
    for ours, theirs in zip(graphs.encoder.run(None, feed), with_arena.run(None, feed), strict=True):
        assert np.array_equal(ours, theirs)
