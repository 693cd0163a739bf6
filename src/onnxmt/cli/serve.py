"""`onnxmt serve`: every flag defaults from its ONNXMT_* variable."""

from __future__ import annotations

from typing import Annotated

import typer

from ..manifest import ModelDirError
from ..runtime.options import DecodeOptions, RuntimeOptions
from ..scale.rayserve import RayServeOptions
from ..serve.options import ServeOptions
from .common import err, fail
from .flags import flags, with_options


@with_options(
    env=True,
    options=flags(ServeOptions),
    decoding=flags(DecodeOptions, "beams", "max_new_tokens"),
    runtime=flags(RuntimeOptions, "threads", "encoder_threads", "variant"),
    scaling=flags(RayServeOptions, "replicas", "min_replicas", "max_replicas", "cpus_per_replica"),
)
def serve(
    models: Annotated[
        list[str] | None,
        typer.Argument(
            envvar="ONNXMT_MODEL",
            help="Exported model directories, directories of them, or hub ids (exported on first use); requests "
            "go to the model for their (source, target) pair.",
            metavar="MODEL_DIR...",
            show_default=False,
        ),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            envvar="ONNXMT_RAY",
            help="Serve on Ray Serve (needs onnxmt\\[ray]): replicas of this service behind Ray's proxy, which "
            "listens on --host and --port.",
        ),
    ] = False,
    address: Annotated[
        str | None,
        typer.Option(
            envvar="ONNXMT_RAY_ADDRESS", help='With --ray: a Ray cluster ("auto", "ray://head:10001"; default: local).'
        ),
    ] = None,
    *,
    options: ServeOptions,
    decoding: DecodeOptions,
    runtime: RuntimeOptions,
    scaling: RayServeOptions,
) -> None:
    """Serve a LibreTranslate-compatible HTTP API (needs onnxmt\\[serve]) for one model or several; every flag
    defaults from ONNXMT_*. Several models load on first use. --beams and --max-new-tokens are the defaults of
    requests that name none. With --ray, as replicas on Ray Serve."""
    from ..models import resolve_model_dirs

    try:
        from ..serve.server import ServeError, run
    except ImportError as e:
        fail(f"serve needs FastAPI and uvicorn: pip install 'onnxmt[serve]' ({e})")
    try:
        directories = resolve_model_dirs(models or [], progress=lambda msg: err.print(msg))
        if ray:
            from ..scale import rayserve

            rayserve.run(directories, options, runtime, decoding, scaling, address=address)
        else:
            run(directories, options, runtime, decoding)
    except (ModelDirError, ValueError, ImportError, OSError, ServeError) as e:
        fail(str(e))
