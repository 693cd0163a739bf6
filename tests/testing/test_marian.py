"""The random models carry the real opus-mt-en-zh metadata, checked against its files in ../shared/data."""

from __future__ import annotations

import json
from pathlib import Path

from onnxmt.testing.marian import (
    OPUS_MT_EN_ZH_CONFIG_EXTRAS,
    OPUS_MT_EN_ZH_GENERATION_CONFIG,
    OPUS_MT_EN_ZH_TOKENIZER_CONFIG,
)
from tests.helpers.skips import shared_data


def test_metadata_constants_are_the_real_files() -> None:
    real = shared_data("opus-mt-en-zh")
    assert (real / "tokenizer_config.json").read_text(encoding="utf-8") == OPUS_MT_EN_ZH_TOKENIZER_CONFIG
    assert json.loads((real / "generation_config.json").read_text()) == OPUS_MT_EN_ZH_GENERATION_CONFIG
    config = json.loads((real / "config.excerpt.json").read_text())
    assert {k: config[k] for k in OPUS_MT_EN_ZH_CONFIG_EXTRAS} == OPUS_MT_EN_ZH_CONFIG_EXTRAS


def test_a_built_model_has_the_real_files_with_its_own_sizes(tiny_hf_dir: Path) -> None:
    assert (tiny_hf_dir / "tokenizer_config.json").read_text(encoding="utf-8") == OPUS_MT_EN_ZH_TOKENIZER_CONFIG
    assert not (tiny_hf_dir / "special_tokens_map.json").exists() and not (tiny_hf_dir / "tokenizer.json").exists()
    generation = json.loads((tiny_hf_dir / "generation_config.json").read_text())
    config = json.loads((tiny_hf_dir / "config.json").read_text())
    pad = config["pad_token_id"]
    assert pad == len(json.loads((tiny_hf_dir / "vocab.json").read_text())) - 1  # <pad> last, as 65000 there
    expected = {**OPUS_MT_EN_ZH_GENERATION_CONFIG, "bad_words_ids": [[pad]], "decoder_start_token_id": pad}
    expected |= {"pad_token_id": pad, "max_length": config["max_position_embeddings"]}
    assert {k: generation[k] for k in expected} == expected
    assert config["max_length"] == config["max_position_embeddings"] and config["num_beams"] == 4
