"""What a model directory can do at run time, decided once from its manifest (which describes its graphs): whether
it runs in flight, whether a row's logits are bit-exact whatever its batch, whether a text's translation is
independent of what it is batched with. The Translator, the service and `onnxmt inspect` read it alike."""

from __future__ import annotations

from dataclasses import dataclass

from ..manifest import Manifest


def activation_scales(manifest: Manifest) -> str | None:
    """ "per tensor" or "per row" for a dynamic int8 directory (older directories: per tensor), else None."""
    quantization = manifest.quantization or {}
    if quantization.get("method") != "dynamic int8":
        return None
    return str(quantization.get("activation_scales") or "per tensor")


@dataclass(frozen=True)
class Capabilities:
    """`in_flight`: the decoder takes one cache length per row (format 4), so rows of different lengths share its
    calls (the running batch and the scheduler); `rows_bit_exact`: a row's logits are the same bits in any batch
    (exports that record it); `activation_scales`: dynamic int8's ("per tensor", "per row"), None otherwise;
    `layout`: onnxmt's, Optimum's, Transformers.js'."""

    in_flight: bool
    rows_bit_exact: bool
    activation_scales: str | None
    layout: str

    @classmethod
    def of(cls, manifest: Manifest) -> Capabilities:
        decoder = manifest.graphs.get("decoder")
        return cls(
            in_flight=decoder is not None and decoder.per_row_positions(),
            rows_bit_exact=bool(manifest.model.get("rows_bit_exact", False)),
            activation_scales=activation_scales(manifest),
            layout=manifest.layout,
        )

    @property
    def inexact_rows(self) -> bool:
        """Whether a row's logits can move in the last bits with the running batch it is in: a model batched in
        flight whose export predates `rows_bit_exact` (docs/model-directory.md)."""
        return self.in_flight and not self.rows_bit_exact

    def batch_invariant(self, max_batch_size: int) -> bool | None:
        """Whether a text's translation is independent of what it is batched with; None: cannot tell (an Optimum
        directory's quantization is not recorded). `variant_batches` says why not."""
        if max_batch_size == 1:
            return True
        if self.inexact_rows:
            return False
        if self.activation_scales == "per row":
            return True
        if self.layout != "onnxmt":
            return None
        return self.activation_scales is None  # fp32, int4 (weight-only): yes; per-tensor int8: no

    @property
    def variant_batches(self) -> str:
        """Why a model's translations can depend on the requests it is batched with, and what to do about it."""
        if self.inexact_rows:
            return (
                "this export's decoder can give a text logits that differ in the last bits with the requests it runs "
                "beside (docs/serve.md); export the model again with this onnxmt for bit-exact in-flight batching"
            )
        return (
            "int8 with per-tensor activation scales: a text's translation can depend on the requests it is batched "
            "with (docs/serve.md); `onnxmt quantize --per-row-scales` makes it independent"
        )
