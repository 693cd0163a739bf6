"""What a result was measured on: CPU model and the instruction-set flags that decide int8 speed, load, versions.

CTranslate2's and ONNX Runtime's int8 kernels depend on AVX-512 / VNNI (and AMX): the same model can be faster or
slower in int8 than in float32 depending on them, so every result carries the flags.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

# Flags that change which kernels the engines pick.
SIMD_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
PACKAGES = ("onnxmt", "onnxruntime", "numpy", "sentencepiece", "torch", "transformers", "ctranslate2", "matplotlib")


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        if not line.strip():
            break  # first processor only
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def describe() -> dict:
    cpu = _cpuinfo()
    flags = set(cpu.get("flags", "").split())
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        lscpu = ""
    versions = {}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    mem_kb = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        ),
        0,
    )
    return {
        "cpu": cpu.get("model name", platform.processor()),
        "cores": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024**2, 1),
        "simd": [f for f in SIMD_FLAGS if f in flags],
        "cpu_flags": sorted(flags),
        "lscpu": lscpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": versions,
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "load_average": os.getloadavg(),
    }


def bandwidth(threads: int, megabytes: int = 512, repeats: int = 5) -> float:
    """Memory bandwidth in bytes/s, STREAM's copy kernel: `threads` threads each copying its own float64 array of
    `megabytes` (far past the caches) into another, counted as STREAM counts it (bytes read + bytes written), the
    best of `repeats` passes. numpy releases the GIL in the copy, so the threads run in parallel."""
    import threading

    import numpy as np

    n = megabytes * 2**20 // 8
    sources = [np.ones(n) for _ in range(threads)]
    targets = [np.zeros(n) for _ in range(threads)]
    best = 0.0
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)

        def copy(i: int, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            np.copyto(targets[i], sources[i])

        workers = [threading.Thread(target=copy, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        import time

        barrier.wait()
        start = time.perf_counter()
        for w in workers:
            w.join()
        best = max(best, 2 * 8 * n * threads / (time.perf_counter() - start))
    return best
