"""Opening a model directory: onnxmt's own (with `onnxmt.json`), or one exported by Optimum or Transformers.js.

For an Optimum directory the manifest is written in memory from its config files and its graphs' input and output
names, so the rest of the runtime sees one kind of directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..architectures import get_architecture, optimum_architectures
from ..layout import (
    VARIANT_METHODS,
    canonical_variant,
    diagnose,
    find_variants,
    is_complete,
    onnxmt_variant,
    role_of,
    select_variant,
)
from ..manifest import (
    CONFIG_FILES,
    MANIFEST_NAME,
    GraphSpec,
    Manifest,
    ModelDirError,
    TensorSpec,
    generation_defaults,
    read_manifest,
    verify_files,
)
from .dircheck import check_entries, check_graph, check_onnxmt_graphs, check_sizes
from .options import RuntimeOptions

Sessions = dict[str, Any]  # graph file name -> onnxruntime.InferenceSession

_ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
    "tensor(float16)": "float16",
}


def load_manifest(
    directory: str | Path,
    *,
    verify: bool = True,
    sessions: Sessions | None = None,
    options: RuntimeOptions | None = None,
) -> Manifest:
    """The manifest of an onnxmt directory (files checked), or one built for an Optimum directory.

    An Optimum manifest is read from the graphs themselves, through ONNX Runtime sessions opened with `options`;
    pass a `sessions` dict (file name -> session) to keep them for running instead of loading every graph twice.
    """
    directory = Path(directory)
    options = options or RuntimeOptions(threads=1)
    if not directory.is_dir():
        raise ModelDirError(f"model directory not found: {directory}")
    if (directory / MANIFEST_NAME).is_file():
        manifest = read_manifest(directory)
        verify_files(directory, manifest, check_hash=verify)
        _check_onnxmt_variant(directory, manifest, options.variant)
        check_onnxmt_graphs(directory, manifest)
        return manifest
    if find_variants(directory):
        check_entries(directory)
        return optimum_manifest(directory, {} if sessions is None else sessions, options)
    raise ModelDirError(diagnose(directory))


def check_model_dir(directory: str | Path, *, verify: bool = True, options: RuntimeOptions | None = None) -> None:
    """The checks `load_manifest` makes (runtime/dircheck.py; with `verify`, every file's sha256), without opening
    an Optimum directory's graphs in ONNX Runtime: what a service runs off its inference thread before a load."""
    directory = Path(directory)
    options = options or RuntimeOptions(threads=1)
    if not (directory / MANIFEST_NAME).is_file() and find_variants(directory):
        check_entries(directory)
        for name in select_variant(directory, options.variant)[1].values():
            check_graph(directory, name)
        return
    load_manifest(directory, verify=verify, options=options)


def _check_onnxmt_variant(directory: Path, manifest: Manifest, variant: str | None) -> None:
    """An onnxmt directory holds one variant: asking for another is an error that names it."""
    if variant is None:
        return
    present = onnxmt_variant(manifest.quantization)
    if canonical_variant(variant) != present:
        raise ModelDirError(
            f"{directory}: no {canonical_variant(variant)!r} variant; this onnxmt directory holds {present} only "
            "(make others with `onnxmt quantize`)"
        )


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelDirError(f"{path}: not valid JSON ({e})") from e


def optimum_manifest(directory: Path, sessions: Sessions, options: RuntimeOptions) -> Manifest:
    """The manifest of an Optimum or Transformers.js directory, for the variant `options` asks for (see
    layout.select_variant); its provenance records the variant chosen and the complete ones present."""
    variant, files = select_variant(directory, options.variant)
    complete = [v for v, parts in find_variants(directory).items() if is_complete(parts)]
    if "decoder_merged" in files:
        files = {p: f for p, f in files.items() if p in ("encoder", "decoder_merged")}
    else:
        files.pop("decoder_merged", None)
    for name in files.values():  # before ONNX Runtime opens them
        check_graph(directory, name)
    config = _json(directory / "config.json")
    if not config:
        raise ModelDirError(f"{directory / 'config.json'}: missing; an Optimum directory needs the model's config.json")
    # Optimum's graphs are read through their input and output names: only the families proven to match load.
    readable = optimum_architectures()
    if config.get("model_type") not in readable:
        raise ModelDirError(
            f"{directory}: model_type {config.get('model_type')!r} is not supported; supported: {', '.join(readable)}"
        )
    arch = get_architecture(config["model_type"]).for_source(directory)
    generation_config = _json(directory / "generation_config.json")
    facts = arch.facts(config)
    tokenizer_files = [n for n in (*arch.tokenizer_files, *arch.optional_tokenizer_files) if (directory / n).is_file()]
    manifest = Manifest(
        architecture=arch.name,
        layout="optimum-merged" if "decoder_merged" in files else "optimum",
        files={
            name: {"bytes": (directory / name).stat().st_size}
            for name in (*files.values(), *tokenizer_files, *CONFIG_FILES)
            if (directory / name).is_file()
        },
        graphs={part: _graph_spec(directory, part, name, sessions, options) for part, name in files.items()},
        model=facts,
        tokens=arch.tokens(directory, config, generation_config),
        generation=generation_defaults(generation_config, config),
        languages=arch.languages(directory, None),
        tokenizer=arch.tokenizer_section(directory, tokenizer_files, facts),
        provenance={"source_model": str(directory), "exporter": "optimum", "variant": variant, "variants": complete},
        quantization=None if variant == "fp32" else {"method": VARIANT_METHODS[variant], "variant": variant},
    )
    check_sizes(manifest, "config.json")
    return manifest


def _graph_spec(directory: Path, part: str, name: str, sessions: Sessions, options: RuntimeOptions) -> GraphSpec:
    """Input and output names of a graph, read through ONNX Runtime (the run side has no `onnx` package). The
    session opened is the one that runs the graph: the encoder's as an encoder (`load_session`)."""
    from .sessions import load_session

    if name not in sessions:
        sessions[name] = load_session(directory / name, options, encoder=part == "encoder")
    session = sessions[name]

    def spec(arg: Any) -> TensorSpec:
        shape = [d if isinstance(d, int) else str(d) for d in arg.shape]
        return TensorSpec(name=arg.name, role=role_of(arg.name), dtype=_ORT_DTYPES.get(arg.type, arg.type), shape=shape)

    return GraphSpec(
        file=name, inputs=[spec(a) for a in session.get_inputs()], outputs=[spec(a) for a in session.get_outputs()]
    )
