"""A mutation probe: small, meaningful changes to the code (mutants), one at a time, each against the test files that
should notice it; a mutant no test kills is a rule the suite does not hold.

    python benchmarks/bench.py mutation                 # every mutant (~20 min on 2 cores), then a table
    python benchmarks/bench.py mutation --list          # the mutants, without running them
    python benchmarks/bench.py mutation --only S1 L4    # some of them
    python benchmarks/bench.py mutation --all-killers   # every failing test of each mutant, not only the first

The mutants cover what the parity tests against transformers do not: admission and scheduling (runtime/scheduler.py,
serve/inflight.py), the service's limits, document splitting and joining (documents/), and quantization
(export/quantize.py). Each is a textual replacement that must match exactly once in the current code (else the probe
stops: the code moved, the mutant needs updating). The work is done in a copy of src/, tests/ and pyproject.toml in
a temporary folder, so the working tree is never changed, and the tests run there with its src/ first on the path
(as CI runs them, with CI set: a test that would skip fails). A mutant is killed when a test fails or the run times
out; it survives when every test passes. First, every test file named is run unmutated: all must pass, or the probe
has nothing to say. The exit status is 1 when a mutant survives.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEDULER, INFLIGHT = "src/onnxmt/runtime/scheduler.py", "src/onnxmt/serve/inflight.py"
ADMISSION = ["tests/serve/test_admission.py", "tests/runtime/test_scheduler.py"]
BOUNDARIES = ["tests/serve/test_boundaries.py"]
SEGMENT = ["tests/documents/test_segment.py", "tests/documents/test_source_lang.py"]
QUANTIZE = ["tests/export/test_quantize.py"]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    what: str
    tests: tuple[str, ...]


def _m(name: str, path: str, old: str, new: str, what: str, tests: list[str]) -> Mutant:
    return Mutant(name, path, old, new, what, tuple(tests))


MUTANTS = [
    # --- scheduling and admission ---
    _m("S1", SCHEDULER, "return budget is None or cost + request.costs[text] <= budget", "return True",
       "the fit test ignores the batch cost budget (max_batch_cost)", ADMISSION),
    _m("S2", SCHEDULER, "if texts + 1 > places:", "if texts > places:",
       "one text more than max_batch_size fits", ADMISSION),
    _m("S3", SCHEDULER, "break  # it has waited long enough", "pass  # it has waited long enough",
       "later requests pass a waiting one however long it waited (no age bound)", ADMISSION),
    _m("S4", SCHEDULER, "key=lambda r: (count[id(r)], r.arrived))", "key=lambda r: (count[id(r)], -r.arrived))",
       "the newest waiting request is admitted first", ADMISSION),
    _m("S5", INFLIGHT, "width = self.scheduler.next_width(widths)", "width = widths[0]",
       "the inference thread steps only one beam width's batch (the first) while it has rows", ADMISSION),
    _m("S6", SCHEDULER, "return min(widths, key=lambda w: (self._charged[w], w))", "return min(widths)",
       "the scheduler always picks the narrowest width to step", ADMISSION),
    _m("S7", SCHEDULER, "seconds / max(requests, 1)", "seconds",
       "a width's step time is charged whole, not shared by its requests", ADMISSION[::-1]),
    _m("S8", SCHEDULER, "return any(n >= 2 and n * active > texts for n in count.values())", "return False",
       "the reserved places are never used", ADMISSION[::-1]),
    _m("S9", "src/onnxmt/serve/loading.py", "o.max_batch_size, cost_limits(entry.manifest, o).batch,",
       "o.max_batch_size, o.max_batch_cost or None,", "the running batch ignores --max-cache-mb's cap", ADMISSION),
    # --- the service's limits ---
    _m("L1", "src/onnxmt/serve/guards.py", "or int(length) > self.limit)", "or int(length) >= self.limit)",
       "a body of exactly --max-body-bytes (Content-Length) is refused", BOUNDARIES),
    _m("L2", "src/onnxmt/serve/guards.py", "if received > self.limit:", "if received >= self.limit:",
       "a chunked body of exactly --max-body-bytes is refused", BOUNDARIES),
    _m("L3", "src/onnxmt/serve/protocol.py", "if len(texts) > limits.max_texts:", "if len(texts) >= limits.max_texts:",
       "a request of exactly --max-texts texts is refused", BOUNDARIES),
    _m("L4", "src/onnxmt/serve/protocol.py", "if len(text) > limits.max_chars:", "if len(text) > limits.max_chars + 1:",
       "a text of --max-chars + 1 characters is accepted", BOUNDARIES),
    _m("L5", "src/onnxmt/serve/protocol.py", "if beams is not None and beams > limits.max_beams:",
       "if beams is not None and beams >= limits.max_beams:", "beams = --max-beams is refused", BOUNDARIES),
    _m("L6", "src/onnxmt/serve/costs.py", "if limit and cost > limit:", "if limit and cost > limit + 1:",
       "a request one token x beam over --max-request-cost is accepted", BOUNDARIES),
    _m("L7", "src/onnxmt/serve/documents.py", "    if total > limit:", "    if total >= limit:",
       "a document costing exactly --max-document-cost is refused", BOUNDARIES),
    _m("L8", "src/onnxmt/documents/limits.py", "if len(sentences) > self.max_sentences:",
       "if len(sentences) > self.max_sentences + 1:", "one sentence over --max-document-sentences is accepted",
       BOUNDARIES),
    _m("L9", "src/onnxmt/documents/office.py", "self.count += 1 + len(attrib)\n        if self.count > self.limit:",
       "self.count += 1\n        if self.count > self.limit:", "a .docx's attributes are not counted as XML nodes",
       BOUNDARIES),
    _m("L10", "src/onnxmt/serve/limits.py", "requests >= limits.req_limit", "requests > limits.req_limit",
       "one request over --req-limit per window is let through", BOUNDARIES),
    _m("L11", "src/onnxmt/serve/limits.py", "used + chars > limits.daily_char_limit",
       "used + chars >= limits.daily_char_limit", "a request that spends exactly the day's characters is refused",
       BOUNDARIES),
    _m("L12", "src/onnxmt/serve/limits.py", "own(row.req_limit, o.req_limit)", "o.req_limit",
       "a key's own request limit (onnxmt keys add --req-limit) is ignored", BOUNDARIES),
    _m("L13", "src/onnxmt/serve/batcher.py", "if self.depth >= self.max_queue:", "if self.depth > self.max_queue:",
       "--max-queue + 1 requests may wait", BOUNDARIES),
    _m("L14", "src/onnxmt/serve/downloads.py", "self.stored_bytes + len(data) > self.max_bytes",
       "self.stored_bytes + len(data) >= self.max_bytes", "translated files filling --max-stored-mb exactly evict one",
       BOUNDARIES),
    _m("L15", "src/onnxmt/serve/cache.py", "(self.max_bytes and self.bytes > self.max_bytes)",
       "(self.max_bytes and self.bytes >= self.max_bytes)", "a cache filled to exactly --cache-mb drops an entry",
       BOUNDARIES),
    # --- documents: splitting and joining ---
    _m("D1", "src/onnxmt/documents/segment.py", "segment(lang, body)", 'segment("en", body)',
       "sentences are always split with English rules", SEGMENT),
    _m("D2", "src/onnxmt/documents/translate.py", "segmenter_lang(translator, source_lang),",
       "segmenter_lang(translator),", "a request's source language does not reach the splitter", SEGMENT),
    _m("D3", "src/onnxmt/documents/translate.py", "for piece in split_sentences(body, lang):",
       "for piece in split_sentences(body):", "a plain-text line too long for the model is cut with English rules",
       SEGMENT),
    _m("D4", "src/onnxmt/documents/segment.py", "(is_cjk(previous[-1]) and is_cjk(text[0]))",
       "is_cjk(previous[-1])", "a sentence after a Chinese one is joined without a space, whatever its script",
       SEGMENT),
    _m("D5", "src/onnxmt/documents/segment.py", "(is_cjk(previous[-1]) and is_cjk(text[0]))", "is_cjk(text[0])",
       "a Chinese sentence after a Latin one is joined without a space", SEGMENT),
    _m("D6", "src/onnxmt/documents/segment.py", 'if previous is None or "\\n" in space or', "if previous is None or",
       "line breaks between sentences are not kept", SEGMENT),
    # --- quantization ---
    _m("Q1", "src/onnxmt/export/quantize.py", "per_channel=per_channel,", "per_channel=False,",
       "MatMul weights quantized per tensor while the manifest says per channel", QUANTIZE),
    _m("Q2", "src/onnxmt/export/quantize.py", "peak = peaks if per_channel else peaks.max()", "peak = peaks.max()",
       "the vocabulary tables get one scale instead of one per row", QUANTIZE),
    _m("Q3", "src/onnxmt/export/quantize.py", "and n.name not in skipped\n", "\n",
       "excluded MatMuls are quantized anyway", QUANTIZE),
    _m("Q4", "src/onnxmt/export/quantize.py", "np.clip(np.rint(block / per_row), -127, 127)",
       "np.clip(np.floor(block / per_row), -127, 127)", "the vocabulary tables round down instead of to nearest",
       QUANTIZE),
    _m("Q5", "src/onnxmt/export/quantize.py", "    if LM_HEAD in excluded:", "    if False:",
       "--exclude lm_head keeps nothing in float", QUANTIZE),
]  # fmt: skip


@dataclass
class Outcome:
    mutant: Mutant
    killed: bool
    killers: list[str]
    seconds: float
    note: str = ""


def _copy_tree(into: Path) -> Path:
    """src/, tests/ and pyproject.toml of the repository, copied into `into` (caches and built files left out)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules", ".cache", "*.egg-info")
    for name in ("src", "tests"):
        shutil.copytree(ROOT / name, into / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", into / "pyproject.toml")
    return into


def _pytest(tree: Path, tests: tuple[str, ...], first_only: bool, timeout: float) -> tuple[int | None, str]:
    """(pytest's exit status, or None on timeout; its output) for `tests` in `tree`."""
    command = [sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", "-rf", "--timeout", "300"]
    command += ["-o", "addopts="]  # no duration report
    if first_only:
        command.append("-x")
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "CI": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        output = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        return None, output
    return done.returncode, done.stdout + done.stderr


def _failed(output: str) -> list[str]:
    return re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", output, flags=re.M)


def _apply(tree: Path, mutant: Mutant) -> str:
    """Write `mutant` into `tree`; returns the file's original text."""
    path = tree / mutant.path
    original = path.read_text(encoding="utf-8")
    count = original.count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.name}: {mutant.old!r} occurs {count} times in {mutant.path}; update the mutant")
    path.write_text(original.replace(mutant.old, mutant.new), encoding="utf-8")
    return original


def run(mutants: list[Mutant], first_only: bool, timeout: float, baseline: bool) -> list[Outcome]:
    with tempfile.TemporaryDirectory(prefix="onnxmt-mutants-") as folder:
        tree = _copy_tree(Path(folder))
        for mutant in mutants:  # every mutant applies to the code as it is, before anything runs
            (tree / mutant.path).write_text(_apply(tree, mutant), encoding="utf-8")
        if baseline:
            files = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            print(f"baseline: {' '.join(files)}", flush=True)
            status, output = _pytest(tree, files, first_only=False, timeout=4 * timeout)
            if status != 0:
                print(output[-6000:])
                raise SystemExit("the unmutated tests do not pass: fix them before probing")
        outcomes = []
        for mutant in mutants:
            original = _apply(tree, mutant)
            started = time.monotonic()
            try:
                status, output = _pytest(tree, mutant.tests, first_only, timeout)
            finally:
                (tree / mutant.path).write_text(original, encoding="utf-8")
            seconds = time.monotonic() - started
            killers = _failed(output)
            if status is None:
                outcome = Outcome(mutant, True, killers, seconds, "timed out")
            elif status == 0:
                outcome = Outcome(mutant, False, [], seconds)
            elif status == 1 and killers:
                outcome = Outcome(mutant, True, killers, seconds)
            else:  # collection error, internal error: the mutant broke the code, not a rule
                outcome = Outcome(mutant, True, killers, seconds, f"pytest exit {status}")
            print(f"{mutant.name:4} {'killed' if outcome.killed else 'SURVIVED':8} {seconds:6.0f} s  "
                  f"{(killers or [outcome.note])[0]}", flush=True)  # fmt: skip
            outcomes.append(outcome)
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    lines = ["| mutant | file | change | result | killed by |", "| --- | --- | --- | --- | --- |"]
    for o in outcomes:
        m = o.mutant
        result = ("killed" + (f" ({o.note})" if o.note else "")) if o.killed else "**survived**"
        killers = "<br>".join(f"`{k}`" for k in o.killers) or "—"
        lines.append(f"| {m.name} | `{m.path.removeprefix('src/onnxmt/')}` | {m.what} | {result} | {killers} |")
    killed = sum(o.killed for o in outcomes)
    lines.append(f"\n{killed} of {len(outcomes)} mutants killed.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.py mutation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants (S1, L4, ...)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--all-killers", action="store_true", help="run every test of a mutant, not up to the first")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a mutant's run may take (then: killed)")
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    args = parser.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list or not mutants:
        for m in MUTANTS:
            print(f"{m.name:4} {m.path}: {m.what}\n     {m.old!r} -> {m.new!r}\n     tests: {' '.join(m.tests)}")
        return
    outcomes = run(mutants, not args.all_killers, args.timeout, not args.no_baseline)
    print()
    print(table(outcomes))
    if args.json:
        rows = [
            {"name": o.mutant.name, "path": o.mutant.path, "what": o.mutant.what, "killed": o.killed,
             "killers": o.killers, "seconds": round(o.seconds, 1), "note": o.note}
            for o in outcomes
        ]  # fmt: skip
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    sys.exit(0 if all(o.killed for o in outcomes) else 1)
