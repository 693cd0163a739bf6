"""Graph tensor names and their roles, for onnxmt's own layout and for Optimum's.

Roles are what the runtime asks for ("past_key.3", "logits"); names are what a graph calls them. onnxmt's export
names tensors by role; Optimum names them `past_key_values.3.decoder.key` and so on. This is the one place that
knows both, so the runtime never matches names by substring.
"""

from __future__ import annotations

import re
from pathlib import Path

from .manifest import DECODER_FILE, ENCODER_FILE

_FIXED_ROLES = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "encoder_attention_mask": "encoder_attention_mask",
    "encoder_hidden_states": "encoder_hidden_states",
    "last_hidden_state": "encoder_hidden_states",
    "logits": "logits",
    "use_cache_branch": "use_cache_branch",
    "past_length": "past_length",
}
_ONNXMT_CACHE = re.compile(
    r"^(past_key|past_value|present_key|present_value|new_key|new_value|cross_key|cross_value)\.(\d+)$"
)
# Optimum: decoder-side cache is the self-attention cache, encoder-side is the cross-attention K/V.
_OPTIMUM_CACHE = re.compile(r"^(past_key_values|present)\.(\d+)\.(decoder|encoder)\.(key|value)$")

OPTIMUM_FILES = {
    "encoder": ("encoder_model.onnx",),
    "decoder": ("decoder_model.onnx",),
    "decoder_with_past": ("decoder_with_past_model.onnx",),
    "decoder_merged": ("decoder_model_merged.onnx",),
}


def role_of(name: str) -> str:
    """The runtime role of a graph tensor name; ValueError for a name neither layout uses."""
    if name in _FIXED_ROLES:
        return _FIXED_ROLES[name]
    if _ONNXMT_CACHE.match(name):
        return name
    match = _OPTIMUM_CACHE.match(name)
    if match:
        kind, layer, side, kv = match.groups()
        if side == "encoder":
            return f"cross_{kv}.{layer}"
        return f"{'past' if kind == 'past_key_values' else 'present'}_{kv}.{layer}"
    raise ValueError(f"unrecognised graph tensor name {name!r}")


def find_optimum_files(directory: Path) -> dict[str, str]:
    """Optimum-layout ONNX files in `directory` or its `onnx/` subfolder, by part; empty when there are none."""
    found: dict[str, str] = {}
    for sub in ("", "onnx"):
        base = directory / sub if sub else directory
        for part, names in OPTIMUM_FILES.items():
            for name in names:
                if (base / name).is_file() and part not in found:
                    found[part] = str(Path(sub) / name) if sub else name
    return found


def is_onnxmt_layout(directory: Path) -> bool:
    return (directory / ENCODER_FILE).is_file() and (directory / DECODER_FILE).is_file()
