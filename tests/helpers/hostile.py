"""The hostile documents of tests/serve/test_documents_hostile.py (zip and XML bombs, long unbroken text, blank-line
floods, many small cues, entity runs, unclosed markup), which benchmarks/hostile_documents.py sends one by one too,
and the resident memory of a server's process tree. Building them needs python-docx."""

from __future__ import annotations

import bz2
import zipfile
from pathlib import Path

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
