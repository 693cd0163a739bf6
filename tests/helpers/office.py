"""Word files and the zips they are, for the tests of documents in the library and in the service: a small document
with styles and runs (make_docx), and zips written by hand (zip_of), so that a member can declare any size and hold
any compressed stream (the zip and XML bombs of tests/documents/test_office.py and
tests/serve/test_documents_hostile.py). python-docx is imported where it is used: callers skip without it."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

LOCAL = struct.Struct("<4s5H3L2H")
CENTRAL = struct.Struct("<4s6H3L5H2L")
END = struct.Struct("<4s4H2LH")
DOS_DATE = 0x21  # 1980-01-01
MIB = 1 << 20
HEAD = b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
BODY_OPEN = b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>'
BODY_CLOSE = b"</w:body></w:document>"


@dataclass(frozen=True)
class Member:
    name: str
    raw: bytes  # as stored in the zip: compressed for deflate and bzip2
    size: int  # the uncompressed size the headers declare, true or not
    crc: int
    method: int = zipfile.ZIP_DEFLATED


def deflated(name: str, data: bytes) -> Member:
    pack = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return Member(name, pack.compress(data) + pack.flush(), len(data), zlib.crc32(data))


def stored(name: str, data: bytes) -> Member:
    return Member(name, data, len(data), zlib.crc32(data), zipfile.ZIP_STORED)


def deflated_zeros(prefix: bytes, mib: int) -> bytes:
    """A raw deflate stream of `prefix` then `mib` MiB of zeros, built in milliseconds: after a full flush the
    compressor starts afresh, so one MiB's compressed block repeated is a valid stream."""
    pack = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    head = pack.compress(prefix) + pack.flush(zlib.Z_FULL_FLUSH)
    block = pack.compress(bytes(MIB)) + pack.flush(zlib.Z_FULL_FLUSH)
    return head + block * mib + pack.flush()


def zip_of(members: list[Member]) -> bytes:
    local, central = bytearray(), bytearray()
    for m in members:
        name = m.name.encode()
        sizes = (m.crc, len(m.raw), m.size)
        entry = CENTRAL.pack(
            b"PK\x01\x02", 20, 20, 0, m.method, 0, DOS_DATE, *sizes, len(name), 0, 0, 0, 0, 0, len(local)
        )
        central += entry + name
        local += LOCAL.pack(b"PK\x03\x04", 20, 0, m.method, 0, DOS_DATE, *sizes, len(name), 0) + name + m.raw
    count = len(members)
    return bytes(local + central + END.pack(b"PK\x05\x06", 0, 0, count, count, len(central), len(local), 0))


def png() -> bytes:
    """A 1x1 grey PNG."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">2I5B", 1, 1, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b"")
    )


def base_docx() -> bytes:
    import docx

    document = docx.Document()
    document.add_heading("A title for the document", level=1)
    paragraph = document.add_paragraph("This is ")
    paragraph.add_run("bold").bold = True
    paragraph.add_run(" and this is ")
    paragraph.add_run("italic").italic = True
    document.add_picture(io.BytesIO(png()))
    document.add_table(rows=1, cols=2).cell(0, 1).text = "A cell"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def base_members() -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(base_docx())) as package:
        return {info.filename: package.read(info) for info in package.infolist()}


def with_members(*replaced: Member, renamed: dict[str, str] | None = None) -> bytes:
    """The base document with members replaced or added (by name), others renamed."""
    renamed = renamed or {}
    members = {
        renamed.get(name, name): deflated(renamed.get(name, name), data) for name, data in base_members().items()
    }
    members.update({m.name: m for m in replaced})
    return zip_of(list(members.values()))


def many_paragraphs(count: int) -> bytes:
    return HEAD + BODY_OPEN + b"<w:p/>" * count + BODY_CLOSE


def make_docx(path: Path) -> None:
    import docx

    document = docx.Document()
    document.add_heading("A title for the document", level=1)
    paragraph = document.add_paragraph("This is ", style="Normal")
    paragraph.add_run("bold").bold = True
    paragraph.add_run(" and this is ")
    paragraph.add_run("italic").italic = True
    paragraph.add_run(". Another sentence here.")
    document.add_paragraph("A list item", style="List Bullet")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "First cell"
    table.cell(0, 1).text = "Second cell"
    document.save(str(path))


def docx_structure(path: Path) -> list[tuple[str, list[tuple[bool | None, bool | None]]]]:
    import docx

    from onnxmt.documents.office import paragraphs

    document = docx.Document(str(path))
    return [(p.style.name, [(r.bold, r.italic) for r in p.runs]) for p in paragraphs(document)]
