"""Where a command's peak resident memory is set: RSS sampled together with the main thread's Python stack.

    python benchmarks/bench.py rss-trace [--interval 0.02] [--out FILE.json] -- export SOURCE OUT --force
    python benchmarks/bench.py rss-trace -- quantize MODEL_DIR OUT --force

The arguments after `--` are an `onnxmt` command line; it runs in this process, and a thread reads the RSS
(`/proc/self/statm`: file-backed pages included, as the kernel's peak counts them) every `--interval` seconds with
the main thread's stack. It prints:

- the kernel's peak (VmHWM) and the largest sampled RSS, with the stack at that sample (a peak that lasts less than
  the interval can fall between samples: VmHWM above the sampled peak says so);
- per step (the innermost onnxmt function on the stack): the largest RSS sampled in it and its seconds, the 20
  largest first, so the step that sets the peak is the table's first row (--out FILE.json keeps every step, in the
  order first seen).

Made to find which step of export, validate or quantize sets a peak that big_models.py reports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from worker import peak_rss_mb as hwm_mb  # VmHWM, as the offline benchmark's worker reads it

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


OWN = ""  # the onnxmt package's directory, set in main()


@dataclass
class Step:
    name: str
    peak_mb: float = 0.0
    samples: int = 0


@dataclass
class Trace:
    interval: float
    steps: dict[str, Step] = field(default_factory=dict)
    peak_mb: float = 0.0
    peak_at: float = 0.0
    peak_stack: list[str] = field(default_factory=list)

    def sample(self, frame, elapsed: float) -> None:  # type: ignore[no-untyped-def]
        rss = rss_mb()
        stack = traceback.extract_stack(frame)
        ours = [f for f in stack if f.filename.startswith(OWN)]
        where = f"{Path(ours[-1].filename).stem}.{ours[-1].name}" if ours else "(outside onnxmt)"
        step = self.steps.setdefault(where, Step(where))
        step.peak_mb, step.samples = max(step.peak_mb, rss), step.samples + 1
        if rss > self.peak_mb:
            self.peak_mb, self.peak_at = rss, elapsed
            self.peak_stack = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in stack[-12:]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="bench.py rss-trace", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--interval", type=float, default=0.02, help="seconds between samples (default 0.02)")
    p.add_argument("--out", type=Path, help="write the trace here as JSON")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then an onnxmt command line")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give an onnxmt command line after --")
    import onnxmt
    from onnxmt.cli import app

    global OWN
    OWN = str(Path(onnxmt.__file__).parent) + os.sep

    trace = Trace(args.interval)
    main_id = threading.get_ident()
    done = threading.Event()
    start = time.perf_counter()

    def sampler() -> None:
        while not done.wait(args.interval):
            frame = sys._current_frames().get(main_id)
            if frame is not None:
                trace.sample(frame, time.perf_counter() - start)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        # standalone_mode=False: click returns the exit code of typer.Exit instead of raising SystemExit.
        returned = app(command, standalone_mode=False)
        code = returned if isinstance(returned, int) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        done.set()
        thread.join()
    seconds = time.perf_counter() - start
    hwm = hwm_mb()
    print(f"\n{' '.join(command)}: exit {code}, {seconds:.1f} s")
    print(f"kernel peak (VmHWM) {hwm:,.0f} MB; largest sample {trace.peak_mb:,.0f} MB at {trace.peak_at:.1f} s:")
    for line in trace.peak_stack:
        print(f"    {line}")
    print("\n| step (innermost onnxmt function) | peak RSS sampled | seconds |")
    print("| --- | --- | --- |")
    for step in sorted(trace.steps.values(), key=lambda s: -s.peak_mb)[:20]:
        print(f"| {step.name} | {step.peak_mb:,.0f} MB | {step.samples * args.interval:.1f} |")
    if args.out:
        data = {
            "command": command,
            "exit": code,
            "seconds": seconds,
            "vm_hwm_mb": hwm,
            "peak_sampled_mb": trace.peak_mb,
            "peak_at_s": trace.peak_at,
            "peak_stack": trace.peak_stack,
            "steps": [s.__dict__ for s in trace.steps.values()],
        }
        args.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return code
