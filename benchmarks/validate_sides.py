"""`onnxmt validate` cut in its two sides, each in a process of its own, so that their peaks can be measured apart:
the target "validate's peak <= 1.1x the larger side" needs the sides' own peaks, not the weight bytes.

    python benchmarks/bench.py validate-sides reference STATE -- VALIDATE_ARGS...   # PyTorch's side, saved to STATE
    python benchmarks/bench.py validate-sides onnx STATE -- VALIDATE_ARGS...        # ONNX Runtime's side, from STATE

VALIDATE_ARGS are `onnxmt validate`'s own (the model directory, --reference, --input, ...). `reference` runs
validate until its reference side returns (transformers' outputs and teacher-forced logits), saves that side's
result in STATE and stops: the process holds what validate holds during that side. `onnx` runs validate with the
reference side read back from STATE instead of computed: no torch model is loaded, and the process holds what
validate holds from the reference's release to its report. big_models.py runs both and divides validate's peak by
the larger one.
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import sys
from pathlib import Path

from onnxmt.cli import app
from onnxmt.export import validate as validate_module


class _Saved(Exception):
    """The reference side is saved: stop before the ONNX side."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="bench.py validate-sides", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("side", choices=("reference", "onnx"))
    p.add_argument("state", type=Path, help="a directory for the reference side's outputs and logits")
    p.add_argument("validate_args", nargs=argparse.REMAINDER, help="-- then `onnxmt validate`'s arguments")
    args = p.parse_args(argv)
    validate_args = args.validate_args[1:] if args.validate_args[:1] == ["--"] else args.validate_args
    state: Path = args.state
    real = validate_module._reference_side

    def reference_side(*positional, **named):  # type: ignore[no-untyped-def]
        run = real(*positional, **named)
        shutil.rmtree(state, ignore_errors=True)
        shutil.copytree(run.scratch, state)
        (state / "run.pickle").write_bytes(pickle.dumps((run.searches, run.outputs, run.ids)))
        raise _Saved

    def saved_side(*positional, **named):  # type: ignore[no-untyped-def]
        searches, outputs, ids = pickle.loads((state / "run.pickle").read_bytes())
        return validate_module._ReferenceRun(searches, outputs, ids, state)

    validate_module._reference_side = reference_side if args.side == "reference" else saved_side
    try:
        # standalone_mode=False: click returns the exit code of typer.Exit instead of raising SystemExit.
        returned = app(["validate", *validate_args], standalone_mode=False)
    except _Saved:
        return 0
    if isinstance(returned, int) and returned != 0:
        return returned
    if args.side == "reference":
        raise SystemExit("validate ended before its reference side returned")
    if "torch" in sys.modules:
        raise SystemExit("the ONNX side imported torch: its peak would not be the ONNX side's alone")
    return 0
