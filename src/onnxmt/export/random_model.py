"""Randomly initialised MarianMT models with a working tokenizer, built offline.

Real weights cannot be downloaded on our machines, so tests and benchmarks build models here: a sentencepiece model
trained on generated text, a Marian `vocab.json`, a `MarianConfig`, and the metadata files of the real
Helsinki-NLP/opus-mt-en-zh (its `tokenizer_config.json` byte for byte, its generation config with only the sizes
changed, no `special_tokens_map.json`, no `tokenizer.json`), so that what is tested is what users load.
`MarianTokenizer.from_pretrained(path)` and `MarianMTModel.from_pretrained(path)` load the result.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass
from pathlib import Path

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

SPECIAL_PIECES = ("</s>", "<unk>")

# The real opus-mt-en-zh metadata (hub snapshot 408d9bc4; tests/test_random_model.py compares these with the files
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


@dataclass(frozen=True)
class RandomMarianSpec:
    """Architecture and tokenizer of a random model. The defaults are a tiny model for tests."""

    d_model: int = 32
    encoder_layers: int = 2
    decoder_layers: int = 2
    attention_heads: int = 4
    ffn_dim: int = 64
    max_position_embeddings: int = 64
    vocab_size: int | None = None  # None: exactly the tokenizer's pieces; larger pads vocab.json with dummy tokens
    source_pieces: int = 180
    target_pieces: int = 180
    target_languages: tuple[str, ...] = ()  # e.g. ("cmn_Hans", "yue_Hant") for a multi-target model
    init_std: float = 0.3
    eos_bias: float = 0.0  # added to the eos logit, so short sentences can finish before the length limit
    seed: int = 0
    reverse: bool = False  # zh→en (opus-mt-zh-en's metadata): Chinese source pieces, English target pieces


OPUS_MT_EN_ZH = RandomMarianSpec(
    d_model=512,
    encoder_layers=6,
    decoder_layers=6,
    attention_heads=8,
    ffn_dim=2048,
    max_position_embeddings=512,
    vocab_size=65001,
    source_pieces=2000,
    target_pieces=2000,
    target_languages=OPUS_MT_EN_ZH_TARGETS,
    init_std=0.02,
)


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


def train_spm(lines: list[str], vocab_size: int, model_type: str = "unigram") -> bytes:
    """A sentencepiece model trained on `lines`: unigram as Marian's, or bpe as M2M100's and NLLB's."""
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
    )
    return model.getvalue()


def spm_pieces(model: bytes) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)]


def build_vocab(
    source_pieces: list[str], target_pieces: list[str], languages: tuple[str, ...], size: int | None
) -> dict[str, int]:
    """A shared Marian vocab laid out like opus-mt's: </s>=0, <unk>=1, language tokens, pieces, <pad> last."""
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
    return {token: i for i, token in enumerate(tokens)}


def build_random_marian(output_dir: str | Path, spec: RandomMarianSpec = RandomMarianSpec()) -> Path:
    """Write a random MarianMT model directory (weights, configs, tokenizer files) and return its path."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    english, chinese = generate_corpus(spec.seed)
    source_lines, target_lines = (chinese, english) if spec.reverse else (english, chinese)
    source_spm = train_spm(source_lines, spec.source_pieces)
    target_spm = train_spm(target_lines, spec.target_pieces)
    (out / "source.spm").write_bytes(source_spm)
    (out / "target.spm").write_bytes(target_spm)
    vocab = build_vocab(spm_pieces(source_spm), spm_pieces(target_spm), spec.target_languages, spec.vocab_size)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
    tokenizer_config = OPUS_MT_ZH_EN_TOKENIZER_CONFIG if spec.reverse else OPUS_MT_EN_ZH_TOKENIZER_CONFIG
    (out / "tokenizer_config.json").write_text(tokenizer_config, encoding="utf-8")

    pad = len(vocab) - 1
    config = MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=len(vocab),
        d_model=spec.d_model,
        encoder_layers=spec.encoder_layers,
        decoder_layers=spec.decoder_layers,
        encoder_attention_heads=spec.attention_heads,
        decoder_attention_heads=spec.attention_heads,
        encoder_ffn_dim=spec.ffn_dim,
        decoder_ffn_dim=spec.ffn_dim,
        max_position_embeddings=spec.max_position_embeddings,
        activation_function="swish",
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=pad,
        eos_token_id=0,
        bos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        init_std=spec.init_std,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )
    torch.manual_seed(spec.seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias[0, 0] += spec.eos_bias
    model.generation_config = GenerationConfig(
        **{
            **OPUS_MT_EN_ZH_GENERATION_CONFIG,
            "bad_words_ids": [[pad]],
            "decoder_start_token_id": pad,
            "pad_token_id": pad,
            "max_length": spec.max_position_embeddings,
        }
    )
    model.save_pretrained(out)
    config_path = out / "config.json"
    saved = json.loads(config_path.read_text(encoding="utf-8"))
    saved.update({**OPUS_MT_EN_ZH_CONFIG_EXTRAS, "max_length": spec.max_position_embeddings})
    config_path.write_text(json.dumps(saved, indent=2), encoding="utf-8")
    return out
