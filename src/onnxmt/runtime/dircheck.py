"""A model directory is input: what is checked when one is opened, before ONNX Runtime reads any of it.

- **Every file stays inside the directory.** onnxmt's manifest names its files (manifest.py checks each); an
  Optimum or Transformers.js directory has no manifest, so every entry at its top and in its `onnx/` folder must
  resolve inside it (a `config.json` linked to a file elsewhere would be read, and could be shown in an error).
  A snapshot of the Hugging Face hub's cache, whose files link to `../../blobs/`, may resolve into its model's
  folder in the cache (manifest.model_root).
- **A graph's external data stays inside too**, and within its file: ONNX Runtime would open whatever path a
  tensor names (absolute, `..`) and answer with its own text.
- **The manifest's sizes are sane and agree with the graphs**: every size within a bound (`MODEL_BOUNDS`), the
  attention caches' heads and head size, the layers, the vocabulary and the hidden size those of the graphs'
  inputs and outputs, and, for onnxmt's directories, the manifest's tensor names and fixed dims those of the
  graph files themselves. A wrong size would otherwise load, and fail every request (or allocate without end).

Each failure is one ModelDirError line that names the file and the field, never a file's content. The graphs are
read with graphinfo (the protobuf walked in a memory map, weights skipped): a few ms for the tiny test models,
~50 ms for a 90 MB decoder.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from ..manifest import MANIFEST_NAME, Manifest, ModelDirError, model_root
from .graphinfo import GraphContents, read_graph

# The manifest's sizes: (least, most). Well above any translation model's (NLLB-200-3.3B: 24 layers, 32 heads of
# 128, d_model 2048, 256,206 tokens, 1,024 positions; Gemma 3: 262,208 tokens, 131,072 positions), far below what
# makes an allocation fail: 2^20 heads of 2^20 would be a 4 TiB cache row.
MODEL_BOUNDS = {
    "num_layers": (1, 1024),
    "encoder_layers": (0, 1024),
    "num_heads": (1, 1024),
    "num_kv_heads": (1, 1024),
    "head_dim": (1, 4096),
    "d_model": (1, 65536),
    "vocab_size": (1, 1 << 24),
    "max_positions": (1, 1 << 21),
}
# Attention cache tensors by role (layout.role_of): (rows, heads, positions, head_dim).
_CACHE_ROLE = re.compile(r"^(past|present|new|cross)_(key|value)\.(\d+)$")


def check_entries(directory: Path) -> None:
    """Every entry at the top of an Optimum/Transformers.js directory and in its `onnx/` folder resolves inside it."""
    root = model_root(directory)
    folders = [directory]
    onnx = directory / "onnx"
    if onnx.exists() or onnx.is_symlink():
        _inside(onnx, root, directory)
        folders.append(onnx)
    for folder in folders:
        for entry in sorted(folder.iterdir()):
            _inside(entry, root, directory)


def _inside(path: Path, root: Path, directory: Path) -> None:
    if not path.resolve().is_relative_to(root):
        shown = path.relative_to(directory)
        raise ModelDirError(f"{directory.name}/{shown}: resolves outside the model directory (a symlink?); refused")


def check_graph(directory: Path, name: str) -> GraphContents:
    """The graph file `name`, read (graphinfo), with its external data checked: a relative path that resolves
    inside the directory, to a file holding the bytes the tensor says (offset + length)."""
    path = directory / name
    try:
        contents = read_graph(path)
    except (ValueError, IndexError, TypeError) as e:  # not a protobuf, one cut short, or one with bytes flipped
        raise ModelDirError(f"{name}: not a readable ONNX graph ({e.__class__.__name__})") from e
    root = model_root(directory)
    for external in contents.external:
        location = external.get("location", "")
        pure = PurePosixPath(location)
        target = path.parent / location
        outside = not location or pure.is_absolute() or ".." in pure.parts or "\\" in location or ":" in location
        if outside or not target.resolve().is_relative_to(root):
            raise ModelDirError(f"{name}: a tensor's external data is outside the model directory; refused")
        if not target.is_file():
            raise ModelDirError(f"{name}: a tensor's external data file {pure.name!r:.80} is missing")
        offset, length = _number(external.get("offset")), _number(external.get("length"))
        if offset is None or length is None or offset + length > target.stat().st_size:
            raise ModelDirError(f"{name}: a tensor's external data lies past the end of {pure.name!r:.80}")
    return contents


def _number(text: str | None) -> int | None:
    """An external data offset or length (absent: 0); None when it is not a non-negative integer."""
    if text is None or text == "":
        return 0
    return int(text) if text.isascii() and text.isdigit() else None


def check_onnxmt_graphs(directory: Path, manifest: Manifest) -> None:
    """An onnxmt directory's graph files against its manifest: each tensor the manifest names is the graph's, with
    the same fixed dims; every input the graph needs is named; then the sizes (check_sizes)."""
    for part, spec in manifest.graphs.items():
        found = check_graph(directory, spec.file)
        for side, listed, actual in (("input", spec.inputs, found.inputs), ("output", spec.outputs, found.outputs)):
            for tensor in listed:
                if tensor.name not in actual:
                    raise ModelDirError(
                        f"{MANIFEST_NAME}: graphs.{part} names {side} {tensor.name!r:.80}, which {spec.file} does "
                        "not have; refused"
                    )
                dims = actual[tensor.name]
                if not _same_dims(tensor.shape, dims):
                    raise ModelDirError(
                        f"{MANIFEST_NAME}: graphs.{part} {side} {tensor.name!r:.80} is {_shape(tensor.shape)} in the "
                        f"manifest, {_shape(dims)} in {spec.file}; refused"
                    )
        named = {t.name for t in spec.inputs}
        needed = [n for n in found.inputs if n not in named and n not in found.initializer_types]
        if needed:
            raise ModelDirError(f"{MANIFEST_NAME}: graphs.{part} does not name {spec.file}'s input(s) {needed[:3]}")
    check_sizes(manifest, MANIFEST_NAME)


def _same_dims(listed: list[int | str], actual: list[int | str]) -> bool:
    if len(listed) != len(actual):
        return False
    return all(not (isinstance(a, int) and isinstance(b, int)) or a == b for a, b in zip(listed, actual, strict=True))


def _shape(dims: list[int | str]) -> str:
    return "(" + ", ".join(str(d)[:20] for d in dims[:8]) + ")"


def check_sizes(manifest: Manifest, where: str) -> None:
    """The manifest's sizes within MODEL_BOUNDS, and those of its graphs' tensors: heads and head size of every
    attention cache, decoder layers, vocabulary (logits), hidden size (the encoder's output). `where`: the file the
    sizes were read from (onnxmt.json, or an Optimum directory's config.json)."""
    model = manifest.model
    for key, (least, most) in MODEL_BOUNDS.items():
        value = model.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
            raise ModelDirError(f"{where}: model.{key} = {str(value)[:20]} is outside [{least}, {most}]; refused")
    layers: set[int] = set()
    for part, graph in manifest.graphs.items():
        for tensor in (*graph.inputs, *graph.outputs):
            match = _CACHE_ROLE.match(tensor.role)
            if match is not None and match.group(1) != "cross":
                layers.add(int(match.group(3)))
            for key, dim in _sizes_of(tensor.role, part, tensor.shape, "num_kv_heads" in model).items():
                if isinstance(dim, int) and key in model and dim != model[key]:
                    raise ModelDirError(
                        f"{where}: model.{key} = {model[key]} does not match {graph.file}'s {tensor.name[:80]} "
                        f"{_shape(tensor.shape)}; refused"
                    )
    if layers and layers != set(range(model["num_layers"])):
        raise ModelDirError(
            f"{where}: model.num_layers = {model['num_layers']} but the decoder's graphs hold caches for "
            f"{len(layers)} layers; refused"
        )


def _sizes_of(role: str, part: str, shape: list[int | str], grouped: bool = False) -> dict[str, int | str]:
    """The manifest sizes a tensor's dims give: an attention cache's heads (its key/value heads where the model
    groups its queries, `grouped`: decoder-only models) and head size, the logits' vocabulary, the encoder output's
    hidden size."""
    if _CACHE_ROLE.match(role) and len(shape) == 4:
        return {"num_kv_heads" if grouped else "num_heads": shape[1], "head_dim": shape[3]}
    if role == "logits" and shape:
        return {"vocab_size": shape[-1]}
    if role == "encoder_hidden_states" and part == "encoder" and shape:
        return {"d_model": shape[-1]}
    return {}
