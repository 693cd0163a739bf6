"""Random models built offline for tests, benchmarks and trying onnxmt without weights: one builder
(`build_random_model`) and one spec per family, each with the real checkpoint's metadata and the random model's
sizes. A new family adds its `ModelSpec` subclass here.

    from onnxmt.testing import MarianSpec, build_random_model
    build_random_model("tiny-marian", MarianSpec(target_languages=("cmn_Hans", "yue_Hant")))
    build_decoder_only("tiny-hy-mt", DecoderOnlySpec(family="hy_mt"))   # decoder-only translators
"""

from __future__ import annotations

from .builder import ModelSpec, build_random_model, generate_corpus
from .decoder_only import DecoderOnlySpec, build_decoder_only
from .m2m100 import NLLB_200_1_3B, NLLB_200_3_3B, NLLB_200_DISTILLED_600M, M2M100Spec, NllbSpec
from .marian import OPUS_MT_EN_ZH, OPUS_MT_TC_BIG, MarianSpec, TcBigSpec
from .mbart import MBART_LARGE_50, MBart50Spec
from .t5 import FLAN_T5_BASE, MADLAD_400_3B, MT5Spec, T5Spec

__all__ = [
    "FLAN_T5_BASE",
    "MADLAD_400_3B",
    "MBART_LARGE_50",
    "NLLB_200_1_3B",
    "NLLB_200_3_3B",
    "NLLB_200_DISTILLED_600M",
    "OPUS_MT_EN_ZH",
    "OPUS_MT_TC_BIG",
    "DecoderOnlySpec",
    "M2M100Spec",
    "MBart50Spec",
    "MT5Spec",
    "MarianSpec",
    "ModelSpec",
    "NllbSpec",
    "T5Spec",
    "TcBigSpec",
    "build_decoder_only",
    "build_random_model",
    "generate_corpus",
]
