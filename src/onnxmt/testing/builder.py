"""The random-model builder every family shares: generated text, sentencepiece training, the seeded model, the
real checkpoint's configs with the random model's sizes.

Real weights cannot be downloaded on our machines, so tests and benchmarks build models here. What differs between
families (the tokenizer files, the transformers classes, how the eos logit is raised, the real checkpoint's
metadata) is carried by a `ModelSpec` subclass; `build_random_model` only calls it in order. torch and transformers
are imported when a model is built, never at import: the run side imports this package without them.
"""

from __future__ import annotations

import io
import json
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

# Words for the English side; enough variety for a unigram model of a few hundred pieces.
_WORDS = tuple(
    (
        "the a an of to in and is was for on that with as by at from it this be are have has had not but or "
        "which one all were we they when there can more if no out so what up about into than them only other "
        "new some time could these two may first then do any like my now over such our man me even most made "
        "after also did many before must through back years where much your way well down should because each "
        "just those people how too little state good very make world still own see men work long get here "
        "between both life being under never day same another know while last might us great old year off "
        "come since against go came right used take three house water city music river mountain story paper "
        "school market doctor garden window morning evening hello translate model engine fast small quiet "
        "bright heavy green yellow number letter friend family"
    ).split()
)

# Common CJK characters for the Chinese side.
_HANZI = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多"
    "天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但"
    "身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四"
)


@dataclass(frozen=True, kw_only=True)
class ModelSpec(ABC):
    """A random model's architecture and seed; a family's subclass adds its tokenizer and says how its files are
    written. The defaults are a tiny model for tests."""

    d_model: int = 32
    encoder_layers: int = 2
    decoder_layers: int = 2
    attention_heads: int = 4
    ffn_dim: int = 64
    max_position_embeddings: int = 64  # also the generation length limit (max_length) of the configs
    # The embedding's rows, as a real checkpoint's: the family pads its vocabulary with tokens no text produces to
    # reach it. None: as many as the tokenizer needs.
    vocab_size: int | None = None
    init_std: float = 0.2
    eos_bias: float = 0.0  # added to the eos logit, so short sentences can finish before the length limit
    dtype: str = "float32"  # the weights as saved (opus-mt-tc-big ships float16)
    seed: int = 0
    # Keys of the real config.json that the transformers config class does not write itself.
    config_extras: ClassVar[dict[str, Any]] = {}

    @abstractmethod
    def write_tokenizer(self, out: Path, corpus: list[str] | None) -> int:
        """Write the tokenizer files into `out`, trained on `corpus` (None: generated sentences); return the
        embedding's row count."""

    @abstractmethod
    def model(self, vocab_size: int) -> Any:
        """The transformers model with `vocab_size` embedding rows, randomly initialised (torch is seeded)."""

    @abstractmethod
    def raise_eos(self, model: Any) -> None:
        """Add `eos_bias` to the eos logit of `model` (called under torch.no_grad)."""

    @abstractmethod
    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        """The real checkpoint's generation_config.json with this model's ids (max_length is set by the builder)."""

    def config_arguments(self) -> dict[str, Any]:
        """The config arguments every family spells alike (BART's names): the sizes, the init, no dropout."""
        return {
            "d_model": self.d_model,
            "encoder_layers": self.encoder_layers,
            "decoder_layers": self.decoder_layers,
            "encoder_attention_heads": self.attention_heads,
            "decoder_attention_heads": self.attention_heads,
            "encoder_ffn_dim": self.ffn_dim,
            "decoder_ffn_dim": self.ffn_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "init_std": self.init_std,
            "dropout": 0.0,
            "attention_dropout": 0.0,
            "activation_dropout": 0.0,
        }


def build_random_model(output_dir: str | Path, spec: ModelSpec, corpus: list[str] | None = None) -> Path:
    """Write a random model directory (weights, configs, tokenizer files) as transformers saves the real checkpoint
    `spec` stands for, and return its path. The tokenizer is trained on `corpus` where given (the source side's
    sentences), else on generated English-like and Chinese-like sentences."""
    import torch
    from transformers import GenerationConfig

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = spec.write_tokenizer(out, corpus)
    torch.manual_seed(spec.seed)
    model = spec.model(vocab_size).eval()
    with torch.no_grad():
        spec.raise_eos(model)
    length = {"max_length": spec.max_position_embeddings}
    model.generation_config = GenerationConfig(**{**spec.generation_config(vocab_size), **length})
    model = model.to(getattr(torch, spec.dtype))
    model.save_pretrained(out)
    config_path = out / "config.json"
    saved = json.loads(config_path.read_text(encoding="utf-8"))
    saved.update({**spec.config_extras, **length})
    config_path.write_text(json.dumps(saved, indent=2), encoding="utf-8")
    return out


def generate_corpus(seed: int, lines: int = 3000) -> tuple[list[str], list[str]]:
    """Deterministic English-like sentences and their word-by-word "translations" into Chinese characters (one
    to three characters a word, from a seeded dictionary), for the sentencepiece models."""
    rng = random.Random(seed)
    dictionary = {word: "".join(rng.choices(_HANZI, k=rng.randint(1, 3))) for word in _WORDS}
    marks = {".": "。", "?": "？", "!": "！", ",": "，"}
    english, chinese = [], []
    for _ in range(lines):
        words = rng.choices(_WORDS, k=rng.randint(3, 18))
        mark = rng.choice([".", ".", "?", "!", ","])
        english.append(" ".join(words).capitalize() + mark)
        chinese.append("".join(dictionary[w] for w in words) + marks[mark])
    return english, chinese


def train_spm(lines: list[str], vocab_size: int, model_type: str = "unigram", **special_ids: Any) -> bytes:
    """A sentencepiece model trained on `lines`: unigram or bpe, as the family's real tokenizer is; `special_ids`:
    the trainer's `pad_id`, `eos_id`, `unk_id`, `bos_id` where the family's differ from sentencepiece's defaults."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
        **special_ids,
    )
    return model.getvalue()


def spm_pieces(model: bytes) -> list[str]:
    """The pieces of a sentencepiece model in id order, its control and unknown pieces left out."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)]


def write_json(path: Path, data: Any) -> None:
    """`data` as the hub's tokenizer files are written: UTF-8, not escaped, indent 1."""
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
