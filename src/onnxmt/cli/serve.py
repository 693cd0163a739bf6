"""`onnxmt serve`: every flag defaults from its ONNXMT_* variable."""

from __future__ import annotations

from typing import Annotated

import typer

from ..extras import missing_extra
from ..manifest import ModelDirError
from ..runtime.options import DecodeOptions, RuntimeOptions
from ..scale.rayserve import RayServeOptions
from ..serve.options import ServeOptions
from .common import err, fail
from .flags import flags, with_options

SERVER, MODELS, RAY = "Server", "Models and decoding", "Ray Serve replicas (--ray)"
# `--help` at 80 columns: each panel is a table of its own, as wide as its own flags. A field no panel names
# shows under "Service".
PANELS = {
    SERVER: ("host", "port", "public_url", "forwarded_allow_ips"),
    "Logging": ("log_level", "access_log"),
    "Access": ("api_keys", "protect_all", "cors_origins"),
    "Limits per key": ("req_limit", "char_limit", "daily_char_limit", "limit_window", "key_db"),
    "Connections": ("request_timeout", "keep_alive_timeout", "max_connections"),
    "Requests and batching": (
        "max_batch_size",
        "batch_window_ms",
        "max_queue",
        "timeout",
        "max_chars",
        "max_texts",
        "max_body_bytes",
        "max_beams",
        "max_request_cost",
        "max_batch_cost",
        "reserved_texts",
        "max_skip_ms",
        "max_cache_mb",
    ),
    MODELS: ("max_loaded_models", "max_loaded_mb", "load_retry_seconds", "pivot", "fallback_max_new_tokens"),
    "Texts and prompts": ("text_unit", "max_glossary_terms", "max_glossary_chars", "max_context_chars"),
    "Translation cache": ("cache_size", "cache_mb"),
    "Documents (/translate_file)": (
        "max_document_cost",
        "max_document_sentences",
        "max_document_texts",
        "max_document_unpacked_mb",
        "max_document_ratio",
        "max_document_xml_elements",
        "document_workers",
        "document_worker_mb",
        "max_document_queue",
        "max_stored_mb",
        "keep_files_seconds",
    ),
}


@with_options(
    env=True,
    options=flags(ServeOptions, panel="Service", panels=PANELS),
    decoding=flags(DecodeOptions, "beams", "max_new_tokens", panel=MODELS),
    runtime=flags(RuntimeOptions, "threads", "encoder_threads", "variant", panel=MODELS),
    scaling=flags(RayServeOptions, "replicas", "min_replicas", "max_replicas", "cpus_per_replica", panel=RAY),
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
            envvar="ONNXMT_RAY_ADDRESS",
            help='With --ray: a Ray cluster ("auto", "ray://head:10001"; default: local).',
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
        from ..serve.app import create_app
        from ..serve.server import ServeError, run
    except ImportError as e:
        fail(str(missing_extra("onnxmt serve", "serve", e)))
    try:
        directories = resolve_model_dirs(models or [], progress=lambda msg: err.print(msg))
        if ray:
            from ..scale import rayserve

            rayserve.run(directories, options, runtime, decoding, scaling, address=address)
        else:
            run(create_app(directories, options, runtime, decoding))
    except (ModelDirError, ValueError, ImportError, OSError, ServeError) as e:
        fail(str(e))
