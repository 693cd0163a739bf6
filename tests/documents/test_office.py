"""onnxmt.documents.office under hostile uploads: zip bombs (bzip2, deflate, sizes that lie, many members) and XML
bombs (a million paragraphs, attributes, comments) refused fast and in bounded memory; a normal document still
round-trips.

The zips are written by hand (zip_of in tests/helpers/office.py), so that a member can declare any size and hold any
compressed stream; the bombs run in a child process (run_prepare), so that each test reads its own peak RSS, not one
left by another."""

from __future__ import annotations

import bz2
import io
import json
import resource
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest

from onnxmt.documents.limits import DocumentLimits, DocumentTooLarge
from tests.helpers.office import (
    BODY_CLOSE,
    BODY_OPEN,
    HEAD,
    MIB,
    Member,
    base_docx,
    base_members,
    deflated,
    deflated_zeros,
    many_paragraphs,
    png,
    stored,
    with_members,
)
from tests.helpers.skips import importorskip

docx = importorskip("docx")

from onnxmt.documents.office import paragraphs, prepare_docx  # noqa: E402

# The child's growth is its peak RSS past its RSS once the upload is read: what prepare_docx adds. Read from Linux's
# /proc (VmHWM, VmRSS): getrusage's ru_maxrss survives exec, so a child forked from a big pytest would inherit it.
CHILD = """
import json, sys, time
import docx
from onnxmt.documents.office import prepare_docx
def kb(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))
data = open(sys.argv[1], "rb").read()
before = kb("VmRSS:")
start = time.perf_counter()
try:
    prepare_docx(data)
    error = ""
except ValueError as e:
    error = str(e)
seconds = time.perf_counter() - start
print(json.dumps({"error": error, "seconds": seconds, "rss_mb": (kb("VmHWM:") - before) / 1024}))
"""
# What a test allows a refusal, loose for a busy machine: before these checks the bombs took 1 s to 76 s and 290 MB
# to 4 GB, refused they take under a second and a few MB.
REFUSAL_SECONDS = 5.0
REFUSAL_RSS_MB = 100


def cap_memory() -> None:
    # A bomb that gets through must fail in the child (MemoryError), not take the machine's memory.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run_prepare(tmp_path: Path, data: bytes) -> dict[str, Any]:
    (tmp_path / "upload.docx").write_bytes(data)
    command = [sys.executable, "-c", CHILD, str(tmp_path / "upload.docx")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, preexec_fn=cap_memory)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_refused(tmp_path: Path, data: bytes, match: str) -> None:
    outcome = run_prepare(tmp_path, data)
    assert match in outcome["error"], outcome
    assert outcome["seconds"] < REFUSAL_SECONDS, outcome
    assert outcome["rss_mb"] < REFUSAL_RSS_MB, outcome


def test_a_bzip2_member_is_refused_before_it_is_decompressed(tmp_path: Path) -> None:
    zeros = bz2.BZ2Compressor(9)
    raw = b"".join(zeros.compress(bytes(MIB)) for _ in range(256)) + zeros.flush()  # 256 MiB in ~200 bytes
    bomb = Member("word/document.xml", raw, 256 * MIB, 0, zipfile.ZIP_BZIP2)
    assert_refused(tmp_path, with_members(bomb), "compression method 12")


def test_deflated_zeros_are_refused_by_their_declared_ratio(tmp_path: Path) -> None:
    raw = deflated_zeros(HEAD, 2048)  # 2 GiB of zeros in a 2 MB upload
    bomb = Member("word/document.xml", raw, len(HEAD) + 2048 * MIB, 0)
    assert_refused(tmp_path, with_members(bomb), "(max_document_ratio)")


def test_a_member_that_unpacks_past_its_declared_size_is_refused(tmp_path: Path) -> None:
    # The directory declares only the real document.xml, its CRC right: zipfile alone would cut the stream there
    # and read a valid document, never the 2 GiB that follow.
    xml = base_members()["word/document.xml"]
    bomb = Member("word/document.xml", deflated_zeros(xml, 2048), len(xml), zlib.crc32(xml))
    assert_refused(tmp_path, with_members(bomb), "past the")


def test_a_million_and_a_half_empty_paragraphs_are_refused_fast(tmp_path: Path) -> None:
    # Stored, so that its ratio does not refuse it first: the element count must.
    bomb = stored("word/document.xml", many_paragraphs(1_500_000))
    assert_refused(tmp_path, with_members(bomb), "(max_document_xml_elements)")


def test_a_main_part_not_named_xml_is_refused(tmp_path: Path) -> None:
    # python-docx parses a part by its content type, whatever its name: a .bin main part would escape a count of
    # the .xml members.
    types = base_members()["[Content_Types].xml"].replace(b"/word/document.xml", b"/word/document.bin")
    package_rels = base_members()["_rels/.rels"].replace(b"word/document.xml", b"word/document.bin")
    renamed = {"word/document.xml": "word/document.bin", "word/_rels/document.xml.rels": "word/_rels/document.bin.rels"}
    bomb = stored("word/document.bin", many_paragraphs(1_500_000))
    data = with_members(
        bomb, deflated("[Content_Types].xml", types), deflated("_rels/.rels", package_rels), renamed=renamed
    )
    assert_refused(tmp_path, data, "word/document.bin")


@pytest.mark.parametrize(
    "nodes",
    [
        b"<w:p " + b" ".join(b"a%d=''" % i for i in range(20_000)) + b"/>",  # attributes cost more than elements
        b"<w:p>" + b"<!---->" * 20_000 + b"</w:p>",
    ],
    ids=["attributes", "comments"],
)
def test_attributes_and_comments_count_as_xml_elements(tmp_path: Path, nodes: bytes) -> None:
    bomb = stored("word/document.xml", HEAD + BODY_OPEN + nodes * 60 + BODY_CLOSE)
    assert_refused(tmp_path, with_members(bomb), "(max_document_xml_elements)")


def test_too_many_members_are_refused() -> None:
    empty = [deflated(f"customXml/item{i}.bin", b"") for i in range(10_001 - len(base_members()))]
    with pytest.raises(ValueError, match="10001 members"):
        prepare_docx(with_members(*empty))


def test_small_members_together_past_the_unpacked_limit_are_refused() -> None:
    # Each under the 1 MiB the ratio is checked from, together 100 MB of zeros.
    zeros = deflated("zeros", bytes(MIB - 1))
    members = [Member(f"word/media/z{i}.bin", zeros.raw, zeros.size, zeros.crc) for i in range(100)]
    with pytest.raises(DocumentTooLarge, match=r"\(max_document_unpacked_mb\)"):
        prepare_docx(with_members(*members))


def test_the_limits_are_the_callers() -> None:
    with pytest.raises(DocumentTooLarge, match=r"\(max_document_texts\)"):
        prepare_docx(base_docx(), limits=DocumentLimits(max_texts=2))
    with pytest.raises(DocumentTooLarge, match=r"\(max_document_xml_elements\)"):
        prepare_docx(base_docx(), limits=DocumentLimits(max_xml_elements=100))
    with pytest.raises(DocumentTooLarge, match=r"\(max_document_unpacked_mb\)"):
        prepare_docx(base_docx(), limits=DocumentLimits(max_unpacked_bytes=1000))


def test_damaged_zips_are_value_errors() -> None:
    xml = base_members()["word/document.xml"]
    short = Member("word/document.xml", deflated("x", xml).raw, len(xml) + 1, zlib.crc32(xml))
    wrong_crc = Member("word/document.xml", deflated("x", xml).raw, len(xml), 0)
    for data, match in [
        (b"not a zip", "not a .docx"),
        (with_members(short), "ends before"),
        (with_members(wrong_crc), "CRC"),
    ]:
        with pytest.raises(ValueError, match=match):
            prepare_docx(data)


def structure(data: bytes) -> list[tuple[str, list[tuple[str, bool | None, bool | None]]]]:
    document = docx.Document(io.BytesIO(data))
    return [(p.style.name, [(r.text, r.bold, r.italic) for r in p.runs]) for p in paragraphs(document)]


def test_a_normal_document_round_trips() -> None:
    data = base_docx()
    texts, rebuild = prepare_docx(data)
    assert texts == ["A title for the document", "This is bold and this is italic", "A cell"]
    out = rebuild(texts)
    assert structure(out) == structure(data)
    with zipfile.ZipFile(io.BytesIO(out)) as package:
        assert png() in [package.read(name) for name in package.namelist() if name.startswith("word/media/")]
