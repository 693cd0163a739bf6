"""Random T5-family models built offline: t5-small's layout (relu, tied head scaled by d_model^-0.5, pad 0 / eos 1
/ unk 2, 100 `<extra_id_*>` tokens, the `translate English to German: ` task prefixes of its config) and MADLAD-400's
(gated-gelu, untied head, `<unk>` 0 / `<pad>` 1 / `</s>` 2, decoder start 0, a `<2xx>` token per language in the
vocabulary, a generation config with ids only); and mT5's (`MT5Spec`: MT5ForConditionalGeneration, gated-gelu, a
head of its own, pad 0 / eos 1 / unk 2, no extra ids, only `spiece.model` for a tokenizer).

The tokenizers are a unigram sentencepiece model trained on generated text, turned into `tokenizer.json` by
transformers' own `T5Tokenizer` (t5) or written with the `tokenizers` library as MADLAD's file is laid out, or
written as the sentencepiece model itself (mT5), so that `AutoTokenizer.from_pretrained(path)` loads what users load.
"""

from __future__ import annotations

import io
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .builder import ModelSpec, generate_corpus, train_spm, write_json

# t5-small's task_specific_params (translation entries), from its config.json.
_TASK = {"early_stopping": True, "max_length": 300, "num_beams": 4}
T5_TRANSLATION_TASKS = {
    "translation_en_to_de": {**_TASK, "prefix": "translate English to German: "},
    "translation_en_to_fr": {**_TASK, "prefix": "translate English to French: "},
    "translation_en_to_ro": {**_TASK, "prefix": "translate English to Romanian: "},
}
T5_GENERATION_CONFIG = {"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}
MADLAD_GENERATION_CONFIG = {"decoder_start_token_id": 0, "eos_token_id": 2, "pad_token_id": 1}
MADLAD_LANGUAGES = ("en", "zh", "de", "fr", "es", "ja", "zh_Latn", "yue")
# google/madlad400-3b-mt's tokenizer_config.json and special_tokens_map.json as the hub has them.
_SPECIAL = '"lstrip": false,\n      "normalized": false,\n      "rstrip": false,\n      "single_word": false'
MADLAD_TOKENIZER_CONFIG = (
    '{\n  "added_tokens_decoder": {\n'
    + ",\n".join(
        f'    "{i}": {{\n      "content": "{t}",\n      {_SPECIAL},\n      "special": true\n    }}'
        for i, t in enumerate(("<unk>", "<s>", "</s>"))
    )
    + '\n  },\n  "additional_special_tokens": [],\n  "clean_up_tokenization_spaces": true,\n  "eos_token": "</s>",\n'
    '  "extra_ids": 0,\n  "legacy": false,\n  "model_max_length": 1000000000000000019884624838656,\n'
    '  "pad_token": "<s>",\n  "sp_model_kwargs": {},\n  "tokenizer_class": "T5Tokenizer",\n  "unk_token": "<unk>"\n}\n'
)
MADLAD_SPECIAL_TOKENS_MAP = (
    "{\n"
    + ",\n".join(
        f'  "{role}": {{\n    "content": "{t}",\n    {_SPECIAL.replace("      ", "    ")}\n  }}'
        for role, t in (("eos_token", "</s>"), ("pad_token", "<s>"), ("unk_token", "<unk>"))
    )
    + "\n}\n"
)


@dataclass(frozen=True, kw_only=True)
class T5Spec(ModelSpec):
    """A random t5-small-like model; `madlad` gives MADLAD-400's layout instead. The defaults are tiny."""

    d_kv: int = 8
    pieces: int = 400
    madlad: bool = False
    gated: bool = False  # gated-gelu FFN (v1.1, flan-T5, mT5; MADLAD always)
    tied: bool = True  # the head tied to the embedding and the output scaled (t5; never MADLAD)
    max_position_embeddings: int = 256  # T5 has no position table: only the configs' length limit (n_positions)
    config_extras: ClassVar[dict[str, Any]] = {}

    def _sentencepiece(self, corpus: list[str]) -> list[tuple[str, float]]:
        """(piece, score) of a unigram model trained on `corpus`, the `<2xx>` tokens among its pieces for MADLAD,
        its unknown and control pieces left out."""
        import sentencepiece as spm

        model = io.BytesIO()
        symbols = [f"<2{code}>" for code in MADLAD_LANGUAGES] if self.madlad else []
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(corpus), model_writer=model, vocab_size=self.pieces, model_type="unigram",
            character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, user_defined_symbols=symbols,
        )  # fmt: skip
        sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
        return [
            (sp.id_to_piece(i), 0.0 if sp.is_unused(i) or sp.id_to_piece(i) in symbols else sp.get_score(i))
            for i in range(sp.get_piece_size())
            if not sp.is_control(i) and not sp.is_unknown(i)
        ]

    def _training_corpus(self, corpus: list[str] | None) -> list[str]:
        if corpus is None:
            english, chinese = generate_corpus(self.seed)
            corpus = english + chinese
        # Every printable ASCII character a piece: transformers 5's T5Tokenizer maps characters outside the vocab to
        # id 2 whatever tokenizer.json's unk_id (MADLAD's <unk> is 0), which tests would otherwise meet in English.
        return [*corpus, *([string.printable.strip()] * 20)]

    def write_tokenizer(self, out: Path, corpus: list[str] | None) -> int:
        pieces = self._sentencepiece(self._training_corpus(corpus))
        if self.vocab_size is not None:  # pieces no text produces, up to the real vocabulary's size
            specials = 3 + (0 if self.madlad else 100)
            missing = self.vocab_size - specials - len(pieces)
            if missing < 0:
                raise ValueError(f"vocab_size {self.vocab_size} is smaller than the {specials + len(pieces)} tokens")
            low = min(score for _, score in pieces)
            pieces += [(chr(0xF0000 + i // 512) + chr(0x100000 + i % 512), low - 1 - i) for i in range(missing)]
        if self.madlad:
            return _madlad_tokenizer(out, pieces)
        from transformers import T5Tokenizer

        vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *pieces]
        tokenizer = T5Tokenizer(vocab=vocab, extra_ids=100)
        tokenizer.save_pretrained(str(out))
        return len(tokenizer)

    def model(self, vocab_size: int) -> Any:
        import torch
        from transformers import T5Config, T5ForConditionalGeneration

        # Keys T5Config takes through its PretrainedConfig kwargs (not in its own signature).
        extra: dict[str, Any] = {
            "tie_word_embeddings": self.tied and not self.madlad,
            "n_positions": self.max_position_embeddings,
        }
        config = T5Config(**self._config_arguments(vocab_size), **extra)
        if not self.madlad:
            config.task_specific_params = T5_TRANSLATION_TASKS
        model = T5ForConditionalGeneration(config)
        if not extra["tie_word_embeddings"]:
            # transformers 5's T5Config ties the head whatever it is told (keeping the flag as scale_decoder_outputs)
            # and unties it on load only where the checkpoint holds a head of its own, as flan-T5's and MADLAD's do:
            # so this one is drawn apart, as T5 draws it.
            model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * self.init_std)
        return model

    def _config_arguments(self, vocab_size: int) -> dict[str, Any]:
        """The arguments T5Config and MT5Config share: sizes, buckets, no dropout, the FFN, the ids."""
        pad, eos = (1, 2) if self.madlad else (0, 1)
        return dict(
            vocab_size=vocab_size,
            d_model=self.d_model,
            d_kv=self.d_kv,
            d_ff=self.ffn_dim,
            num_layers=self.encoder_layers,
            num_decoder_layers=self.decoder_layers,
            num_heads=self.attention_heads,
            relative_attention_num_buckets=32,
            relative_attention_max_distance=128,
            dropout_rate=0.0,
            layer_norm_epsilon=1e-6,
            initializer_factor=self.init_std,
            feed_forward_proj="gated-gelu" if self.gated or self.madlad else "relu",
            pad_token_id=pad,
            eos_token_id=eos,
            decoder_start_token_id=0,
        )

    def raise_eos(self, model: Any) -> None:
        """No bias to raise in T5: the eos row of the head gains `eos_bias` along the decoder's mean output, so
        that the eos logit rises by about that much (more on some steps, less on others)."""
        import torch

        generator = torch.Generator().manual_seed(self.seed)
        ids = torch.randint(3, model.config.vocab_size - 1, (8, 12), generator=generator)
        decoder_ids = torch.randint(3, model.config.vocab_size - 1, (8, 6), generator=generator)
        states = model(input_ids=ids, decoder_input_ids=decoder_ids, output_hidden_states=True).decoder_hidden_states
        mean = model.decoder.final_layer_norm(states[-1]).mean(dim=(0, 1))
        if model.config.tie_word_embeddings:
            mean = mean * model.config.d_model**-0.5
        eos = model.config.eos_token_id
        model.lm_head.weight[eos] += self.eos_bias * mean / mean.dot(mean)

    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        return MADLAD_GENERATION_CONFIG if self.madlad else T5_GENERATION_CONFIG


def _madlad_tokenizer(out: Path, pieces: list[tuple[str, float]]) -> int:
    """tokenizer.json laid out as MADLAD-400's: a unigram model with `<unk>` 0, `<pad>` 1, `</s>` 2 (`<s>` unused),
    the pieces (the `<2xx>` tokens among them), Metaspace splitting, `</s>` appended."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import Unigram

    vocab = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), *pieces]  # MADLAD pads with <s>
    tokenizer = Tokenizer(Unigram(vocab, unk_id=0, byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Replace(" {2,}", " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(MADLAD_TOKENIZER_CONFIG, encoding="utf-8")
    (out / "special_tokens_map.json").write_text(MADLAD_SPECIAL_TOKENS_MAP, encoding="utf-8")
    return tokenizer.get_vocab_size()


# google/mt5-base's config.json keys MT5Config does not write itself, and its tokenizer files as the hub has them
# (tokenizer_config.json as derived repositories copy it; no tokenizer.json, no extra ids).
MT5_CONFIG_EXTRAS: dict[str, Any] = {
    "output_past": True,
    "tie_word_embeddings": False,
    "tokenizer_class": "T5Tokenizer",
}
MT5_TOKENIZER_CONFIG: dict[str, Any] = {
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
    "extra_ids": 0,
    "additional_special_tokens": None,
    "tokenizer_file": None,
    "name_or_path": "google/mt5-base",
}
MT5_SPECIAL_TOKENS_MAP = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


@dataclass(frozen=True, kw_only=True)
class MT5Spec(T5Spec):
    """A random google/mt5-base-like model: MT5ForConditionalGeneration (gated-gelu, a head of its own, no output
    scaling), and for a tokenizer only `spiece.model`, laid out as mT5's (`<pad>` 0, `</s>` 1, `<unk>` 2, no
    `<s>`), with the hub's tokenizer config (no extra ids). The defaults are tiny."""

    gated: bool = True
    tied: bool = False
    config_extras: ClassVar[dict[str, Any]] = MT5_CONFIG_EXTRAS

    def write_tokenizer(self, out: Path, corpus: list[str] | None) -> int:
        from transformers import T5Tokenizer

        lines = self._training_corpus(corpus)
        spm_model = train_spm(lines, self.pieces, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
        (out / "spiece.model").write_bytes(spm_model)
        write_json(out / "tokenizer_config.json", MT5_TOKENIZER_CONFIG)
        write_json(out / "special_tokens_map.json", MT5_SPECIAL_TOKENS_MAP)
        return len(T5Tokenizer.from_pretrained(str(out)))

    def model(self, vocab_size: int) -> Any:
        import torch
        from transformers import MT5Config, MT5ForConditionalGeneration

        # No n_positions: mt5-base's config names none (onnxmt then allows architectures/t5.py's 512 positions).
        model = MT5ForConditionalGeneration(MT5Config(**self._config_arguments(vocab_size)))
        # MT5Config ties the head whatever it is told; the checkpoint stores a head of its own, drawn as T5 draws it.
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * self.init_std)
        return model

    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        return T5_GENERATION_CONFIG  # mt5-base's: the same ids as t5's


# google/flan-t5-base's architecture (248M): d_model 768, 12+12 layers, 12 heads of 64, gated-gelu FFN 2048, 32,128
# tokens, untied head; t5's tokenizer layout (pad 0, eos 1, unk 2, 100 extra ids).
FLAN_T5_BASE = T5Spec(
    d_model=768, d_kv=64, ffn_dim=2048, encoder_layers=12, decoder_layers=12, attention_heads=12, pieces=8000,
    vocab_size=32128, init_std=1.0, max_position_embeddings=512, gated=True, tied=False,
)  # fmt: skip
# google/madlad400-3b-mt's architecture (its config.json): 32+32 layers, d_model 1024, 16 heads of 128, gated FFN
# 8192, 256,000 rows; 11.8 GB in fp32.
MADLAD_400_3B = T5Spec(
    d_model=1024, d_kv=128, ffn_dim=8192, encoder_layers=32, decoder_layers=32, attention_heads=16, pieces=8000,
    vocab_size=256000, init_std=1.0, max_position_embeddings=512, madlad=True, gated=True, tied=False,
)  # fmt: skip
