"""What the service says about itself: `/info` (its models, loaded or not, routing, cache, decoding defaults,
batching and limits), and the `/languages` and `/frontend/settings` listings, made once when the models open."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..documents.files import FORMATS
from ..runtime.capabilities import Capabilities
from ..runtime.options import DecodeOptions
from ..runtime.translator import Translator
from ..version import __version__
from .cache import TranslationCache
from .catalog import Catalog
from .costs import cost_limits
from .options import ServeOptions
from .pool import ModelEntry, ModelPool
from .protocol import Languages, frontend_settings

# /info lists the pairs up to this many; an NLLB-200 model alone answers 202 x 201 = 40,602 of them (464 KB of JSON
# in every /info), which /languages already lists per source.
INFO_MAX_PAIRS = 1000


def service_info(
    catalog: Catalog,
    pool: ModelPool,
    options: ServeOptions,
    decoding: DecodeOptions,
    cache: TranslationCache,
    *,
    keys_on: bool,
) -> dict[str, Any]:
    """The body of `/info`."""
    o = options
    answer: dict[str, Any] = {"version": __version__}
    if catalog.single:  # the shape /info has always had for one model
        entry = catalog.entries[0]
        answer["model"] = _model_info(entry)
        answer["languages"] = _languages_info(entry.languages)
    answer["models"] = [_entry_info(e, options) for e in catalog.entries]
    answer["routing"] = {
        "pivot": catalog.pivot,
        **_pairs_info(catalog.pairs()),
        "max_loaded_models": pool.max_models,
        "max_loaded_mb": o.max_loaded_mb,
    }
    answer["cache"] = {"size": cache.size, "entries": len(cache)}
    answer["decoding"] = {k: v for k, v in vars(decoding).items() if v is not None}
    answer["batching"] = {
        "max_batch_size": o.max_batch_size,
        "batch_window_ms": o.batch_window_ms,
        "max_queue": o.max_queue,
    }
    if catalog.single:
        entry = catalog.entries[0]
        answer["batching"]["batch_invariant"] = Capabilities.of(entry.manifest).batch_invariant(o.max_batch_size)
        # In flight: requests join the running decoder batch at every step; else static micro-batches.
        answer["batching"]["in_flight"] = (
            None if entry.translator is None else Capabilities.of(entry.manifest).in_flight
        )
    answer["limits"] = {
        "max_chars": o.max_chars,
        "max_texts": o.max_texts,
        "max_body_bytes": o.max_body_bytes,
        "max_beams": o.max_beams,
        "max_request_cost": o.max_request_cost,
        "max_batch_cost": o.max_batch_cost,
        "max_cache_mb": o.max_cache_mb,
        "timeout": o.timeout,
        "req_limit": o.req_limit,
        "limit_window": o.limit_window,
        "char_limit": o.char_limit,
        "daily_char_limit": o.daily_char_limit,
    }
    answer["api_keys"] = keys_on
    answer["protect_all"] = o.protect_all
    return answer


def listings(catalog: Catalog, options: ServeOptions) -> dict[str, bytes]:
    """The JSON of `/languages` ("languages") and `/frontend/settings` ("frontend"): they depend on the manifests
    alone, so they are made once (with NLLB beside Marian models it takes ~0.1 s)."""
    languages = catalog.libretranslate()
    frontend = frontend_settings(options, languages, catalog.frontend_defaults(), list(FORMATS))
    catalog.pairs()  # for /info and the errors that name pairs
    return {"languages": _json(languages), "frontend": _json(frontend)}


def encoder_threads(translator: Translator) -> int | None:
    """The ONNX Runtime threads of the model's encoder (`Loader.runtime_for`); None for a decoder-only model,
    which has none (its prompts are prefilled by the decoder)."""
    if translator.graphs.decoder_only:
        return None
    return int(translator.graphs.encoder.get_session_options().intra_op_num_threads)


def _entry_info(entry: ModelEntry, options: ServeOptions) -> dict[str, Any]:
    loaded = entry.translator
    return {
        "name": entry.name,
        "loaded": loaded is not None,
        "loads": entry.loads,
        "unloads": entry.unloads,
        "error": entry.error,
        "languages": _languages_info(entry.languages),
        "batch_invariant": Capabilities.of(entry.manifest).batch_invariant(options.max_batch_size),
        "in_flight": None if loaded is None else Capabilities.of(entry.manifest).in_flight,
        "encoder_threads": None if loaded is None else encoder_threads(loaded),
        "cost_limits": cost_limits(entry.manifest, options)._asdict(),
        **_model_info(entry),
    }


def _pairs_info(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """`pair_count`, and `pairs` ("en→zh", ...) when there are at most INFO_MAX_PAIRS of them."""
    if len(pairs) > INFO_MAX_PAIRS:
        return {"pair_count": len(pairs), "pairs_omitted": f"over {INFO_MAX_PAIRS}: GET /languages lists them"}
    return {"pair_count": len(pairs), "pairs": [f"{s}→{t}" for s, t in pairs]}


def _languages_info(languages: Languages) -> dict[str, Any]:
    return {
        "source": languages.source,
        "sources": languages.sources,
        "targets": languages.targets,
        "default": languages.target,
    }


def _model_info(entry: ModelEntry) -> dict[str, Any]:
    manifest = entry.manifest
    return {
        # Names, never the server's paths: a model exported from a local directory records its path.
        "directory": entry.directory.name,
        "architecture": manifest.architecture,
        "layout": manifest.layout,
        "source_model": _public_name(manifest.provenance.get("source_model")),
        "revision": manifest.provenance.get("revision"),
        "quantization": manifest.quantization,
        "variant": manifest.provenance.get("variant"),
        "bytes": sum(int(f.get("bytes") or 0) for f in manifest.files.values()),
        "model": manifest.model,
        "generation": manifest.generation,
    }


def _public_name(source: object) -> str | None:
    """A hub id as it is ("Helsinki-NLP/opus-mt-en-zh"); a local path only by its last part."""
    if not isinstance(source, str):
        return None
    if source.startswith(("/", ".", "~")) or "\\" in source or source.count("/") > 1 or Path(source).exists():
        return Path(source).name
    return source


def _json(content: object) -> bytes:
    """`content` as JSONResponse renders it."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
