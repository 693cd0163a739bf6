"""Word documents (.docx) with python-docx: every paragraph (body, tables, headers and footers) translated as one
text, its runs kept: the translation is cut at the run boundaries' relative places (inline.py), so each run keeps
its formatting (bold, italic, font, size, colour) and each paragraph its style.

python-docx reads every part whole and parses its XML whole, so an upload is unpacked here first (`_unpack`): the
zip's declared sizes are checked against the limits, every member is inflated in chunks and no further than it
declares, its XML nodes counted as they arrive, into a zip of stored members that python-docx then reads."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..extras import missing_extra
from .inline import cut, place
from .limits import DEFAULT_LIMITS, DocumentLimits, DocumentTooLarge

Translate = Callable[[Sequence[str]], list[str]]
# The control characters XML 1.0 has no place for (all but tab, line feed and carriage return): a model's output
# may hold one (a byte-level tokenizer can write any byte), and python-docx refuses to write it. Dropped.
NOT_XML = dict.fromkeys(c for c in range(32) if c not in (9, 10, 13))


def _docx() -> Any:
    try:
        import docx
    except ImportError as e:
        raise missing_extra("translating .docx files", "documents", e) from e
    return docx


def paragraphs(document: Any) -> Iterator[Any]:
    """Every paragraph of the document once: body, table cells (nested too; a merged cell is listed once per grid
    cell it spans), headers and footers."""
    # Keyed by id, holding the element: lxml keeps one proxy per node while it is referenced, so ids stay unique.
    seen: dict[int, Any] = {}
    containers = [document] + [
        part
        for section in document.sections
        for part in (section.header, section.footer)
        if not part.is_linked_to_previous
    ]
    for container in containers:
        for paragraph in _in(container):
            if id(paragraph._p) not in seen:
                seen[id(paragraph._p)] = paragraph._p
                yield paragraph


def _in(container: Any) -> Iterator[Any]:
    yield from container.paragraphs
    for table in container.tables:
        for row in table.rows:
            for cell in row.cells:
                yield from _in(cell)


def translate_docx(source: Path, target: Path, translate: Translate) -> None:
    texts, rebuild = prepare_docx(source.read_bytes())
    target.write_bytes(rebuild(translate(texts) if texts else []))


def prepare_docx(
    data: bytes, limits: DocumentLimits = DEFAULT_LIMITS
) -> tuple[list[str], Callable[[list[str]], bytes]]:
    """The paragraphs' texts of the .docx file `data`, and the function that writes the file again with their
    translations. ValueError when `data` is not a Word document, DocumentTooLarge when it is past `limits`."""
    docx = _docx()
    package = _unpack(data, limits)
    try:
        document = docx.Document(package)
    except Exception as e:  # python-docx raises what zipfile and lxml raise: BadZipFile, KeyError, XMLSyntaxError
        raise ValueError(f"not a .docx document ({type(e).__name__}: {e})") from e
    todo = [p for p in paragraphs(document) if any(c.isalpha() for c in p.text) and p.runs]
    limits.check_texts(len(todo))
    texts = ["".join(run.text for run in p.runs) for p in todo]

    def rebuild(translated: list[str]) -> bytes:
        for paragraph, text, translation in zip(todo, texts, translated, strict=True):
            runs = paragraph.runs
            marks, position = [], 0
            for run in runs[:-1]:
                position += len(run.text)
                marks.append(position)
            translation = translation.translate(NOT_XML)
            for run, part in zip(runs, cut(translation, place(marks, len(text), translation)), strict=True):
                run.text = part
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return texts, rebuild


# Word writes a few dozen members, a document of many images a few thousand.
MAX_MEMBERS = 10_000
# A member's ratio is checked from 1 MiB unpacked: a small part of repeated XML compresses past any ratio that would
# stop a bomb, and small parts together are bounded by max_unpacked_bytes.
RATIO_FROM = 1 << 20
CHUNK = 1 << 16
LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature; 22 bytes on, the lengths of the name and the extra field
# The members whose nodes are counted: python-docx parses [Content_Types].xml, the relationships (.rels) and the
# parts it has a class for by content type, which _check_content_types holds to .xml names.
XML_NAMES = (".xml", ".rels")


def _unpack(data: bytes, limits: DocumentLimits) -> io.BytesIO:
    """The .docx `data` copied into a zip of stored members that python-docx may read whole: what its directory
    declares checked against `limits` first, then each member inflated no further than it declares and its XML
    nodes counted. ValueError for what is not a zip of stored or deflated members and well-formed XML parts."""
    from lxml import etree

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as source:
            members = [info for info in source.infolist() if not info.is_dir()]
    except Exception as e:  # BadZipFile, and for some damaged directories EOFError or ValueError
        raise ValueError(f"not a .docx document ({type(e).__name__}: {e})") from e
    _check_declared(members, limits)
    try:
        return _copy(memoryview(data), members, limits)
    except (struct.error, zlib.error, etree.XMLSyntaxError, KeyError) as e:
        raise ValueError(f"not a .docx document ({type(e).__name__}: {e})") from e


def _check_declared(members: list[zipfile.ZipInfo], limits: DocumentLimits) -> None:
    if len(members) > MAX_MEMBERS:
        raise ValueError(f"the .docx has {len(members)} members; onnxmt reads at most {MAX_MEMBERS}")
    for info in members:
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            # bzip2 and lzma turn a few KB into GBs in one call of their decompressor; Word writes neither.
            raise ValueError(
                f"{info.filename!r} uses compression method {info.compress_type}; the members of a .docx are "
                "stored or deflated"
            )
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size >= RATIO_FROM and ratio > limits.max_ratio:
            raise DocumentTooLarge(
                f"{info.filename!r} expands {ratio:.0f} times; the limit is {limits.max_ratio:g} (max_document_ratio)"
            )
    unpacked = sum(info.file_size for info in members)
    if unpacked > limits.max_unpacked_bytes:
        raise DocumentTooLarge(
            f"the document unpacks to {unpacked} bytes; the limit is {limits.max_unpacked_bytes} "
            "(max_document_unpacked_mb)"
        )


def _copy(data: memoryview, members: list[zipfile.ZipInfo], limits: DocumentLimits) -> io.BytesIO:
    """Every member inflated into a zip of stored members, each no further than its declared size: all of them
    within max_unpacked_bytes, which the declared sizes were checked against."""
    nodes = _Nodes(limits.max_xml_elements)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for info in members:
            parser = nodes.parser() if info.filename.lower().endswith(XML_NAMES) else None
            entry = zipfile.ZipInfo(info.filename, info.date_time)
            entry.file_size = info.file_size
            with target.open(entry, "w") as copy:
                for chunk in _inflated(data, info):
                    copy.write(chunk)
                    if parser is not None:
                        parser.feed(chunk)
            if parser is not None:
                parser.close()
    with zipfile.ZipFile(out) as package:
        _check_content_types(package.read("[Content_Types].xml"))
    out.seek(0)
    return out


def _inflated(data: memoryview, info: zipfile.ZipInfo) -> Iterator[bytes]:
    """The member's bytes in chunks. ValueError for a member that unpacks past its declared size (the directory of a
    bomb lies: zipfile would inflate all of it in one call, then cut it), ends short of it or fails its CRC."""
    signature, name_length, extra_length = LOCAL_HEADER.unpack_from(data, info.header_offset)
    if signature != b"PK\x03\x04":
        raise ValueError(f"not a .docx document (no local header for {info.filename!r})")
    start = info.header_offset + LOCAL_HEADER.size + name_length + extra_length
    size = crc = 0
    for chunk in _chunks(data[start : start + info.compress_size], info.compress_type):
        size += len(chunk)
        if size > info.file_size:
            raise ValueError(
                f"not a .docx document ({info.filename!r} unpacks past the {info.file_size} bytes it declares)"
            )
        crc = zlib.crc32(chunk, crc)
        yield chunk
    if size < info.file_size:
        raise ValueError(f"not a .docx document ({info.filename!r} ends before the {info.file_size} bytes it declares)")
    if crc != info.CRC:
        raise ValueError(f"not a .docx document ({info.filename!r} fails its CRC check)")


def _chunks(raw: memoryview, method: int) -> Iterator[bytes]:
    """The member's stored or deflated bytes `raw`, unpacked CHUNK bytes at most at a time: input that would
    inflate further waits in the decompressor's unconsumed tail for the next call."""
    if method == zipfile.ZIP_STORED:
        for i in range(0, len(raw), CHUNK):
            yield bytes(raw[i : i + CHUNK])
        return
    inflate = zlib.decompressobj(-zlib.MAX_WBITS)
    for i in range(0, len(raw), CHUNK):
        pending: bytes | memoryview = raw[i : i + CHUNK]
        while pending and not inflate.eof:
            yield inflate.decompress(pending, CHUNK)
            pending = inflate.unconsumed_tail


def _check_content_types(xml: bytes) -> None:
    """python-docx parses a part by its content type, whatever its name: a part it parses must be named .xml, so
    that _copy has counted its nodes."""
    from docx.opc.part import PartFactory
    from lxml import etree

    root = etree.fromstring(xml, etree.XMLParser(resolve_entities=False, no_network=True))
    for item in root.iterchildren("{*}Default", "{*}Override"):
        override = etree.QName(item).localname == "Override"
        name = item.get("PartName", "") if override else "." + item.get("Extension", "")
        if item.get("ContentType") in PartFactory.part_type_for and not name.lower().endswith(".xml"):
            raise ValueError(
                f"not a .docx document ({name!r} holds {item.get('ContentType')}, which python-docx parses as XML, "
                "but is not named .xml)"
            )


class _Nodes:
    """An lxml parser target that builds no tree but counts, over all the XML parts, what python-docx's parser
    makes nodes of: elements, their attributes and namespace declarations (an attribute costs lxml more memory
    than an element), comments and processing instructions. DocumentTooLarge past max_xml_elements."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def parser(self) -> Any:
        from lxml import etree

        # python-docx parses with XMLParser(remove_blank_text=True, resolve_entities=False) (docx/oxml/parser.py,
        # docx/opc/oxml.py), with lxml's no_network=True and huge_tree=False: no entity expanded, nothing fetched,
        # libxml2's own bounds on depth, text size and entity amplification kept. This parser reads the same way.
        return etree.XMLParser(target=self, resolve_entities=False, no_network=True, huge_tree=False)

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        # The one call per element: counted inline, not through another call, as it dominates the count's time.
        self.count += 1 + len(attrib)
        if self.count > self.limit:
            self._refuse()

    def start_ns(self, prefix: str, uri: str) -> None:
        self._add()

    def comment(self, text: str) -> None:
        self._add()

    def pi(self, target: str, data: str | None = None) -> None:
        self._add()

    def close(self) -> None:  # lxml calls it at the end of each part, and fails where it is missing
        return None

    def _add(self) -> None:
        self.count += 1
        if self.count > self.limit:
            self._refuse()

    def _refuse(self) -> None:
        raise DocumentTooLarge(
            f"the document's XML has more than {self.limit} elements (attributes and comments counted with "
            f"them); the limit is {self.limit} (max_document_xml_elements)"
        )
