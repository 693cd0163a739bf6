"""ONNX Runtime sessions as onnxmt opens them: threads, memory settings, and the memory given back after loading
and when idle."""

from __future__ import annotations

import ctypes
import os
import re
import sys
from pathlib import Path

from ..manifest import ModelDirError
from .options import RuntimeOptions


def session_options(options: RuntimeOptions, encoder: bool = False):
    """`encoder`: the options of an encoder's session (see `load_session`)."""
    import onnxruntime as ort

    threads = (options.encoder_threads if encoder else None) or options.threads or os.cpu_count() or 1
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = not encoder
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if options.spinning else "0")
    return so


def load_session(path: Path, options: RuntimeOptions, encoder: bool = False):
    """An ONNX Runtime session of the graph file `path`. `encoder=True` for an encoder: on
    `options.encoder_threads` threads when set, and without ONNX Runtime's CPU memory arena. An arena keeps the
    largest activations a session ever allocated, and an encoder's (the whole source batch at once, run once per
    batch) are the largest of a translation. Without it they are freed after each call: NLLB-200-3.3B int8, beam 4
    over 8 sentences of up to 183 tokens, peaks 4,758 -> 4,256 MB; the decoder, run at every step with small
    activations, keeps its arena (off, it saved nothing there)."""
    import onnxruntime as ort

    if not path.is_file():
        raise ModelDirError(f"{path}: graph file is missing")
    try:
        so = session_options(options, encoder)
        return ort.InferenceSession(str(path), sess_options=so, providers=list(options.providers))
    except Exception as e:  # ORT raises its own exception types for truncated or invalid protobufs
        raise ModelDirError(f"{path}: ONNX Runtime cannot load this graph ({e.__class__.__name__}: {e})") from e


def release_memory(directory: Path, trim: bool = True) -> int:
    """Give back the memory the process holds and does not need now; returns the bytes unmapped. Called after a
    graph is loaded, and by the service once it has no work (serve/batcher.py's `on_idle`).

    - Pages of the directory's memory-mapped weight files: what loading read once (in exports made before the LM
      head was stored in chunks, ONNX Runtime reads all of the mapped embedding to prepack the whole head from it),
      and what requests read and will read again only when they run (an int4 MatMulNBits reads its scales from the
      mapping at every call on x86: they are not prepacked; the embedding's rows a lookup gathered, and the pages
      around them the kernel mapped with each). Where a mapping holds no page the process wrote (no `Anonymous`
      copy-on-write page in smaps), `madvise(MADV_DONTNEED)` drops its pages from the process: a later read faults
      the same bytes back in from the page cache, so nothing is lost, only what is not used stops counting.
    - `malloc_trim(0)` (with `trim`): free heap memory goes back to the system, in every malloc arena. At load, the
      heap that held graph protobufs and transient copies (worth it once, after the last graph: between two loads
      the next one reuses that heap); after requests, what their cache buffers and temporaries let go, which glibc
      otherwise keeps in the arena of the thread that freed it, fragmented (it is not at the arena's top).

    Linux with glibc only; elsewhere (or if /proc is not readable) it does nothing.
    """
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None)
        smaps = Path("/proc/self/smaps").read_text()
    except OSError:
        return 0
    released = 0
    root = str(directory.resolve()) + os.sep
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", smaps):
        head, *lines = block.splitlines()
        fields = head.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith(root):
            continue
        counts = dict(line.split(":", 1) for line in lines if ":" in line)
        if counts.get("Anonymous", "").strip() != "0 kB":
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED) == 0:
            released += end - start
    if trim and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
    return released


_MADV_DONTNEED = 4
