"""`onnxmt tune`: intra-op threads and spinning, measured on this machine."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ..manifest import ModelDirError
from ..runtime.options import BatchLimits, RuntimeOptions
from .common import ModelOption, SourceLangOption, TargetLangOption, err, fail
from .flags import flags, with_options


@with_options(
    batching=flags(BatchLimits, "batch_size", helps={"batch_size": "Batch size of the throughput figure."}),
    runtime=flags(RuntimeOptions, "variant"),
)
def tune(
    model: ModelOption = None,
    max_threads: Annotated[int | None, typer.Option(help="Largest thread count to try (default: all cores).")] = None,
    tokens: Annotated[
        int, typer.Option(help="New tokens forced per sentence, so every setting does the same work.")
    ] = 30,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds over all settings; medians are reported.")] = 3,
    source_lang: SourceLangOption = None,
    target_lang: TargetLangOption = None,
    *,
    batching: BatchLimits,
    runtime: RuntimeOptions,
) -> None:
    """Measure intra-op threads and thread spinning on this machine; prints the fastest settings."""
    from ..models import resolve_model_dir
    from ..runtime.tune import candidates
    from ..runtime.tune import tune as run_tune

    if tokens < 1 or rounds < 1 or (max_threads is not None and max_threads < 1):
        fail("--tokens, --rounds and --max-threads must be at least 1")
    try:
        directory = resolve_model_dir(model, progress=lambda msg: err.print(msg))
        with err.status("measuring") as status:
            results = run_tune(
                directory,
                [replace(c, variant=runtime.variant) for c in candidates(max_threads)],
                tokens=tokens,
                batch_size=batching.batch_size,
                rounds=rounds,
                source_lang=source_lang,
                target_lang=target_lang,
                progress=lambda msg: status.update(msg),
            )
    except (ModelDirError, ValueError, ImportError, OSError) as e:
        fail(str(e))
    _show(f"{directory}: {tokens} tokens per sentence, medians of {rounds} rounds", batching.batch_size, results)


def _show(title: str, batch_size: int, results: list[Any]) -> None:
    """The measurements, then the fastest setting for latency and for throughput."""
    table = Table(title=title)
    for column in ("threads", "spinning", "batch-1 latency", f"tokens/s at batch {batch_size}"):
        table.add_column(column, justify="right")
    for r in results:
        spin = "on" if r.spinning else "off"
        table.add_row(str(r.threads), spin, f"{r.latency_ms:.0f} ms", f"{r.tokens_per_s:.0f}")
    Console().print(table)
    fastest = min(results, key=lambda r: r.latency_ms)
    busiest = max(results, key=lambda r: r.tokens_per_s)
    for what, r in (("lowest latency", fastest), ("highest throughput", busiest)):
        # The CLI and the service run with spinning off; turning it on is a library setting.
        where = f"--threads {r.threads}" if not r.spinning else "library only"
        Console().print(f"{what}: RuntimeOptions(threads={r.threads}, spinning={r.spinning})  [{where}]", markup=False)
