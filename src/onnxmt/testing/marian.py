"""Random MarianMT models with the metadata of the real Helsinki-NLP/opus-mt-en-zh.

Two unigram sentencepiece models trained on generated text, a shared Marian `vocab.json` laid out as opus-mt's, a
`MarianConfig`, and opus-mt-en-zh's metadata files (its `tokenizer_config.json` byte for byte, its generation config
with only the sizes changed, no `special_tokens_map.json`, no `tokenizer.json`), so that what is tested is what
users load: `MarianTokenizer.from_pretrained(path)` and `MarianMTModel.from_pretrained(path)` load the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .builder import ModelSpec, generate_corpus, spm_pieces, train_spm, write_json

SPECIAL_PIECES = ("</s>", "<unk>")

# The real opus-mt-en-zh metadata (hub snapshot 408d9bc4; tests/testing/test_marian.py compares these with the files
# under ../shared/data/opus-mt-en-zh/). Its tokenizer_config.json gives ISO 639-3 languages and no model_max_length.
OPUS_MT_EN_ZH_TOKENIZER_CONFIG = '{"target_lang": "zho", "source_lang": "eng"}'
# Helsinki-NLP/opus-mt-zh-en's, for zh→en models. Derived from en-zh's (the same writer, the languages swapped):
# the hub is unreachable here, so its own file could not be read.
OPUS_MT_ZH_EN_TOKENIZER_CONFIG = '{"target_lang": "eng", "source_lang": "zho"}'
# generation_config.json with the ids of opus-mt-en-zh (pad 65000); the random model's own pad id and length limit
# replace 65000 and 512. renormalize_logits and num_beams 4 make the default decoding a renormalised beam search.
OPUS_MT_EN_ZH_GENERATION_CONFIG = {
    "bad_words_ids": [[65000]],
    "bos_token_id": 0,
    "decoder_start_token_id": 65000,
    "eos_token_id": 0,
    "forced_eos_token_id": 0,
    "max_length": 512,
    "num_beams": 4,
    "pad_token_id": 65000,
    "renormalize_logits": True,
}
# Keys of the real config.json that MarianConfig does not write itself (generation keys kept there by older
# transformers; max_length is the position count there too).
OPUS_MT_EN_ZH_CONFIG_EXTRAS = {"bos_token_id": 0, "num_beams": 4, "static_position_embeddings": True}
# The 13 target-language tokens of opus-mt-en-zh's model card.
OPUS_MT_EN_ZH_TARGETS = (
    "cjy_Hans", "cjy_Hant", "cmn", "cmn_Hans", "cmn_Hant", "gan", "lzh", "lzh_Hans", "nan", "wuu", "yue", "yue_Hans",
    "yue_Hant",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class MarianSpec(ModelSpec):
    """A random MarianMT model: en→zh with opus-mt-en-zh's metadata, or zh→en (`reverse`) with opus-mt-zh-en's.
    `vocab_size` larger than the tokenizer's pieces pads vocab.json with dummy tokens. A `corpus` given to the
    builder trains the source tokenizer; the target tokenizer is always trained on generated sentences."""

    source_pieces: int = 180
    target_pieces: int = 180
    target_languages: tuple[str, ...] = ()  # e.g. ("cmn_Hans", "yue_Hant") for a multi-target model
    init_std: float = 0.3
    reverse: bool = False  # zh→en (opus-mt-zh-en's metadata): Chinese source pieces, English target pieces
    config_extras: ClassVar[dict[str, Any]] = OPUS_MT_EN_ZH_CONFIG_EXTRAS

    def write_tokenizer(self, out: Path, corpus: list[str] | None) -> int:
        english, chinese = generate_corpus(self.seed)
        source_lines, target_lines = (chinese, english) if self.reverse else (english, chinese)
        source_spm = train_spm(source_lines if corpus is None else corpus, self.source_pieces)
        target_spm = train_spm(target_lines, self.target_pieces)
        (out / "source.spm").write_bytes(source_spm)
        (out / "target.spm").write_bytes(target_spm)
        vocab = build_vocab(spm_pieces(source_spm), spm_pieces(target_spm), self.target_languages, self.vocab_size)
        write_json(out / "vocab.json", vocab)
        tokenizer_config = OPUS_MT_ZH_EN_TOKENIZER_CONFIG if self.reverse else OPUS_MT_EN_ZH_TOKENIZER_CONFIG
        (out / "tokenizer_config.json").write_text(tokenizer_config, encoding="utf-8")
        return len(vocab)

    def model(self, vocab_size: int) -> Any:
        from transformers import MarianConfig, MarianMTModel

        pad = _pad_id(vocab_size)
        config = MarianConfig(
            vocab_size=vocab_size,
            decoder_vocab_size=vocab_size,
            **self.config_arguments(),
            activation_function="swish",
            scale_embedding=True,
            share_encoder_decoder_embeddings=True,
            tie_word_embeddings=True,
            pad_token_id=pad,
            eos_token_id=0,
            bos_token_id=0,
            decoder_start_token_id=pad,
            forced_eos_token_id=0,
        )
        return MarianMTModel(config)

    def raise_eos(self, model: Any) -> None:
        model.final_logits_bias[0, 0] += self.eos_bias  # eos is id 0

    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        pad = _pad_id(vocab_size)
        ids = {"bad_words_ids": [[pad]], "decoder_start_token_id": pad, "pad_token_id": pad}
        return {**OPUS_MT_EN_ZH_GENERATION_CONFIG, **ids}


# Helsinki-NLP/opus-mt-tc-big-zle-en (hub), ids and sizes aside: its tokenizer_config.json byte for byte, the
# special_tokens_map.json its sibling repos publish, its generation config's keys. Every tc-big config seen has eos
# in the middle of the vocab (25565 of 61017 here, 43311 of 53017 in en-fr), pad = decoder start = bad word = the
# last id, relu, 1024 positions, float16 weights and one shared vocabulary.
TC_BIG_ZLE_EN_TOKENIZER_CONFIG = (
    '{"source_lang": "zle", "target_lang": "en", "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>", '
    '"model_max_length": 512, "sp_model_kwargs": {}, "separate_vocabs": false, "special_tokens_map_file": null, '
    '"name_or_path": "marian-models/opusTCv20210807+bt_transformer-big_2022-03-17/zle-en", '
    '"tokenizer_class": "MarianTokenizer"}'
)
TC_BIG_SPECIAL_TOKENS_MAP = '{"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}'
TC_BIG_EOS_AT = 25565 / 61017
TC_BIG_CONFIG_EXTRAS = {
    "bos_token_id": 0,
    "num_beams": 4,
    "normalize_embedding": False,
    "static_position_embeddings": True,
}


@dataclass(frozen=True, kw_only=True)
class TcBigSpec(MarianSpec):
    """A random opus-mt-tc-big model (zle→en's metadata): </s> in the middle of the vocab, forced eos, relu, weights
    saved in float16. `target_vocab_size`: the `share_encoder_decoder_embeddings: false` form transformers supports
    (vocab.json and target_vocab.json, two embeddings, a head of `decoder_vocab_size` rows: the target's pieces
    padded to that size, smaller than the source's vocab), which no published checkpoint is known to use; </s> is
    0 in both vocabularies and pad the target's last id, which the source's shares."""

    reverse: bool = True  # zle→en: the source side is the generated non-English text
    dtype: str = "float16"
    target_vocab_size: int | None = None
    config_extras: ClassVar[dict[str, Any]] = TC_BIG_CONFIG_EXTRAS

    def write_tokenizer(self, out: Path, corpus: list[str] | None) -> int:
        english, chinese = generate_corpus(self.seed)
        source_spm = train_spm(chinese if corpus is None else corpus, self.source_pieces)
        target_spm = train_spm(english, self.target_pieces)
        (out / "source.spm").write_bytes(source_spm)
        (out / "target.spm").write_bytes(target_spm)
        (out / "special_tokens_map.json").write_text(TC_BIG_SPECIAL_TOKENS_MAP, encoding="utf-8")
        config = TC_BIG_ZLE_EN_TOKENIZER_CONFIG
        if self.target_vocab_size is None:
            vocab = build_vocab(spm_pieces(source_spm), spm_pieces(target_spm), (), self.vocab_size, TC_BIG_EOS_AT)
            write_json(out / "vocab.json", vocab)
            (out / "tokenizer_config.json").write_text(config, encoding="utf-8")
            return len(vocab)
        target = build_vocab([], spm_pieces(target_spm), (), self.target_vocab_size)
        source = build_vocab(spm_pieces(source_spm), [], (), None)
        if len(source) <= len(target):
            raise ValueError(f"the source vocab ({len(source)}) must be larger than target_vocab_size {len(target)}")
        # The source's <pad> moved to the target's pad id, the source tokens after it following it.
        order = [t for t in source if t != "<pad>"]
        order.insert(len(target) - 1, "<pad>")
        write_json(out / "vocab.json", {t: i for i, t in enumerate(order)})
        write_json(out / "target_vocab.json", target)
        separate = config.replace('"separate_vocabs": false', '"separate_vocabs": true')
        (out / "tokenizer_config.json").write_text(separate, encoding="utf-8")
        return len(order)

    def _ids(self, vocab_size: int) -> tuple[int, int, int]:
        """The decoder's vocabulary size, pad and eos."""
        if self.target_vocab_size is not None:
            return self.target_vocab_size, self.target_vocab_size - 1, 0
        return vocab_size, vocab_size - 1, round(TC_BIG_EOS_AT * (vocab_size - 1))

    def model(self, vocab_size: int) -> Any:
        from transformers import MarianConfig, MarianMTModel

        target_size, pad, eos = self._ids(vocab_size)
        config = MarianConfig(
            vocab_size=vocab_size,
            decoder_vocab_size=target_size,
            **self.config_arguments(),
            activation_function="relu",
            scale_embedding=True,
            share_encoder_decoder_embeddings=self.target_vocab_size is None,
            tie_word_embeddings=True,
            pad_token_id=pad,
            eos_token_id=eos,
            bos_token_id=0,
            decoder_start_token_id=pad,
            forced_eos_token_id=eos,
        )
        return MarianMTModel(config)

    def raise_eos(self, model: Any) -> None:
        model.final_logits_bias[0, model.config.eos_token_id] += self.eos_bias

    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        _, pad, eos = self._ids(vocab_size)
        return {
            "bad_words_ids": [[pad]],
            "bos_token_id": 0,
            "decoder_start_token_id": pad,
            "eos_token_id": eos,
            "forced_eos_token_id": eos,
            "max_length": 512,
            "num_beams": 4,
            "pad_token_id": pad,
        }


# Helsinki-NLP/opus-mt-en-zh's architecture: the benchmark's model (random weights).
OPUS_MT_EN_ZH = MarianSpec(
    d_model=512, encoder_layers=6, decoder_layers=6, attention_heads=8, ffn_dim=2048, max_position_embeddings=512,
    vocab_size=65001, source_pieces=2000, target_pieces=2000, target_languages=OPUS_MT_EN_ZH_TARGETS, init_std=0.02,
)  # fmt: skip
# Helsinki-NLP/opus-mt-tc-big-zle-en's architecture (d_model 1024, 6+6, FFN 4096, 61,017 tokens): the benchmark's.
OPUS_MT_TC_BIG = TcBigSpec(
    d_model=1024, encoder_layers=6, decoder_layers=6, attention_heads=16, ffn_dim=4096, max_position_embeddings=1024,
    vocab_size=61017, source_pieces=2000, target_pieces=2000, init_std=0.02,
)  # fmt: skip


def _pad_id(vocab_size: int) -> int:
    return vocab_size - 1  # <pad> is the last token of opus-mt's vocab (65000 in opus-mt-en-zh)


def build_vocab(
    source_pieces: list[str],
    target_pieces: list[str],
    languages: tuple[str, ...],
    size: int | None,
    eos_at: float = 0.0,
) -> dict[str, int]:
    """A shared Marian vocab laid out like opus-mt's: </s>=0, <unk>=1, language tokens, pieces, <pad> last;
    `eos_at` > 0 moves </s> to that fraction of the vocab, as opus-mt-tc-big's (25565 of 61017 in zle-en)."""
    tokens = list(SPECIAL_PIECES) + [f">>{lang}<<" for lang in languages]
    seen = set(tokens)
    for piece in source_pieces + target_pieces:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
    if size is not None:
        if size - 1 < len(tokens):
            raise ValueError(f"vocab_size {size} is smaller than the {len(tokens) + 1} tokens the tokenizer needs")
        tokens += [f"<unused{i}>" for i in range(size - 1 - len(tokens))]
    tokens.append("<pad>")
    if eos_at > 0:
        tokens.remove("</s>")
        tokens.insert(round(eos_at * len(tokens)), "</s>")
    return {token: i for i, token in enumerate(tokens)}
