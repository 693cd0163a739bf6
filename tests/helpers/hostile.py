"""The hostile documents of tests/serve/test_documents_hostile.py (zip and XML bombs, long unbroken text, blank-line
floods, many small cues, entity runs, unclosed markup) and the resident memory of a server's process tree. Building
them needs python-docx. And hostile model directories (sizes, external data, links out, corrupted weights) for
tests/runtime/test_dircheck.py and tests/serve/test_hostile_models.py."""

from __future__ import annotations

import bz2
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.office import HEAD, MIB, Member, deflated, deflated_zeros, many_paragraphs, with_members


def bzip2_zeros() -> bytes:
    zeros = bz2.BZ2Compressor(9)
    raw = b"".join(zeros.compress(bytes(MIB)) for _ in range(256)) + zeros.flush()  # 256 MiB in ~200 bytes
    return with_members(Member("word/document.xml", raw, 256 * MIB, 0, zipfile.ZIP_BZIP2))


def deflate_zeros() -> bytes:
    raw = deflated_zeros(HEAD, 1024)  # 1 GiB of zeros in a 1 MB upload
    return with_members(Member("word/document.xml", raw, len(HEAD) + 1024 * MIB, 0))


def lying_size() -> bytes:
    xml = HEAD + b"<w:document/>"
    return with_members(Member("word/document.xml", deflated_zeros(xml, 512), len(xml), 0))


def paragraph_flood() -> bytes:
    return with_members(deflated("word/document.xml", many_paragraphs(1_500_000)))


HOSTILE: dict[str, tuple[str, bytes]] = {
    "bzip2 zeros": ("a.docx", bzip2_zeros()),
    "deflated zeros": ("b.docx", deflate_zeros()),
    "a member past its declared size": ("c.docx", lying_size()),
    "1.5M empty paragraphs": ("d.docx", paragraph_flood()),
    "200k characters, no break": ("e.txt", b"a" * 200_000),
    "a 1 MB line of words": ("f.txt", b"word " * 200_000),
    "blank lines, then a sentence": ("g.txt", b"\n" * 1_000_000 + b"Hello there.\n"),
    "many small cues": ("h.srt", b"".join(b"%d\n00:00:01,000 --> 00:00:02,000\nHi.\n\n" % i for i in range(25_000))),
    "entity runs": ("i.html", b"<p>" + b"&a;" * 330_000 + b"</p>"),
    "an unclosed comment": ("j.html", b"<!--" + b"Hello there. " * 80_000),
    "an unclosed section": ("k.html", b"<![" + b"Hello there. " * 80_000),
    "backticks": ("l.md", b"`a` " * 250_000),
}


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and every process under it (the document workers)."""
    total = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) * 1024
        todo += [int(c) for c in children]
    return total


# Hostile model directories (tests/runtime/test_dircheck.py, tests/serve/test_hostile_models.py): each changes a copy
# of an exported directory in one way that runtime/dircheck.py must refuse, or that must fail only its load.


def edit_manifest(directory: Path, change: Callable[[dict[str, Any]], object]) -> None:
    """`change` applied to the directory's parsed onnxmt.json, written back."""
    path = directory / "onnxmt.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def with_sizes(directory: Path, **sizes: int) -> None:
    """The manifest's `model` sizes changed (num_heads=8, max_positions=-5, ...), the graphs left as they are."""
    edit_manifest(directory, lambda data: data["model"].update(sizes))


def with_external_data_at(directory: Path, graph: str, location: bytes) -> None:
    """`graph`'s external data named `location` instead of weights.bin (as long, so the protobuf stays valid), its
    sha256 and size updated in the manifest: a directory whose only fault is where that data lies."""
    from onnxmt.manifest import sha256_file

    assert len(location) == len(b"weights.bin")
    path = directory / graph
    path.write_bytes(path.read_bytes().replace(b"weights.bin", location))
    described = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    edit_manifest(directory, lambda data: data["files"][graph].update(described))


def corrupt_weights(directory: Path) -> None:
    """One byte of weights.bin changed, its size kept: the manifest reads, the sha256 check at load fails."""
    weights = bytearray((directory / "weights.bin").read_bytes())
    weights[100] ^= 0xFF
    (directory / "weights.bin").write_bytes(bytes(weights))


def link_outside(directory: Path, name: str, outside: Path, content: str) -> None:
    """`directory/name` replaced by a link to `outside`, a file holding `content` (which no error may show)."""
    outside.parent.mkdir(parents=True, exist_ok=True)
    outside.write_text(content, encoding="utf-8")
    (directory / name).unlink()
    (directory / name).symlink_to(outside)
