"""What the fairseq families (M2M100, NLLB-200, mBART-50) share: one sentencepiece model for source and target,
trained on the generated corpus and padded to the real vocabulary's size when the spec names one, and fairseq's
dictionary ids (`<s> <pad> </s> <unk>`) in the model's config."""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .builder import ModelSpec, generate_corpus, train_spm

EOS = 2  # fairseq's dictionary: <s> <pad> </s> <unk>
# fairseq's transformer-large sizes, which facebook/nllb-200-distilled-600M and mbart-large-50 both have; a benchmark
# model of either adds the real vocabulary's size (`pieces` trained, the rest padded).
TRANSFORMER_LARGE: dict[str, Any] = {
    "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12, "attention_heads": 16, "ffn_dim": 4096,
    "max_position_embeddings": 1024, "pieces": 8000, "init_std": 0.02,
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class FairseqSpec(ModelSpec):
    """A fairseq family's random model: its tokenizer files from one sentencepiece model (`write_tokenizer_files`)
    and its config's arguments (`fairseq_arguments`)."""

    pieces: int = 400  # trained pieces of the sentencepiece model
    spm_type: ClassVar[str] = "unigram"

    def write_tokenizer(self, out: Path, corpus: list[str] | None) -> int:
        if corpus is None:
            english, chinese = generate_corpus(self.seed)
            corpus = english + chinese
        spm_model = train_spm(corpus, self.pieces, model_type=self.spm_type)
        vocab_size = self.write_tokenizer_files(out, spm_model)
        if self.vocab_size is not None and self.vocab_size != vocab_size:
            # Each added piece adds one token whatever the tokenizer: pad by the difference and write the files again.
            spm_model = pad_spm(spm_model, spm_size(spm_model) + self.vocab_size - vocab_size)
            vocab_size = self.write_tokenizer_files(out, spm_model)
        return vocab_size

    @abstractmethod
    def write_tokenizer_files(self, out: Path, spm_model: bytes) -> int:
        """The family's tokenizer files around `spm_model`; the model's vocab size."""

    def fairseq_arguments(self, vocab_size: int) -> dict[str, Any]:
        """The config arguments of fairseq's translation models: the sizes, ReLU, scaled embeddings, the
        dictionary's ids (decoding starts at eos), no layer drop."""
        return {
            "vocab_size": vocab_size,
            **self.config_arguments(),
            "activation_function": "relu",
            "scale_embedding": True,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": EOS,
            "decoder_start_token_id": EOS,
            "encoder_layerdrop": 0.0,
            "decoder_layerdrop": 0.0,
        }


def pad_spm(spm_model: bytes, pieces: int) -> bytes:
    """`spm_model` with unreachable pieces appended (two private-use characters each, neither half a piece, lowest
    scores) up to `pieces` in all: a real vocabulary's size and layout without training on a real corpus."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated protobuf code
    proto.ParseFromString(spm_model)
    missing = pieces - len(proto.pieces)
    if missing < 0:
        raise ValueError(f"the sentencepiece model has {len(proto.pieces)} pieces, more than {pieces}")
    low = min(p.score for p in proto.pieces)
    for i in range(missing):
        piece = proto.pieces.add()
        piece.piece = chr(0xF0000 + i // 512) + chr(0x100000 + i % 512)
        piece.score = low - 1 - i
        piece.type = 1  # NORMAL
    return proto.SerializeToString()


def spm_size(spm_model: bytes) -> int:
    import sentencepiece as spm

    return int(spm.SentencePieceProcessor(model_proto=spm_model).get_piece_size())
