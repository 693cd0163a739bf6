"""transformers' side of the parity tests: generate()'s rows as token ids, its M2M100 / NLLB-200 tokenizer and model
for a directory, and the checks that a tiny random model (tests/conftest.py) gives outputs of many lengths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The language pairs the tiny M2M100 and NLLB models are checked on: a source, two targets.
M2M100_PAIRS = ("en", ("zh", "fr"))
NLLB_PAIRS = ("eng_Latn", ("zho_Hans", "fra_Latn"))
MBART50_PAIRS = ("en_XX", ("zh_CN", "fr_XX"))


def generated_ids(out: Any, pad: int) -> list[list[int]]:
    """generate()'s rows as token ids: the decoder start token dropped, trailing padding dropped, eos kept."""
    rows = []
    for row in out.tolist():
        row = row[1:]
        while row and row[-1] == pad:
            row.pop()
        rows.append(row)
    return rows


def hf_m2m100(model_dir: Path) -> tuple[Any, Any]:
    """transformers' tokenizer and model of a model told its languages by tokens (M2M100, NLLB-200, mBART-50),
    the classes its configs name."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    return tokenizer, model


def hf_special_tokens(tokenizer: Any, model: Any) -> dict[str, int]:
    """The special ids as transformers uses them: generate()'s decoder start (the generation config's, else the
    model config's) and the tokenizer's pad, eos and unk."""
    start = model.generation_config.decoder_start_token_id
    return {
        "decoder_start": model.config.decoder_start_token_id if start is None else start,
        "pad": tokenizer.pad_token_id,
        "eos": tokenizer.eos_token_id,
        "unk": tokenizer.unk_token_id,
    }


def hf_language_id(tokenizer: Any, code: str) -> int:
    """The id of a language code's token: M2M100's `__zh__` for "zh", NLLB's own token for "zho_Hans"."""
    return (
        int(tokenizer.get_lang_id(code)) if hasattr(tokenizer, "get_lang_id") else tokenizer.convert_tokens_to_ids(code)
    )


def assert_varied_outputs(model_dir: Path, target_token: str | None = None, *, most_long: bool = True) -> None:
    """Greedy and the model's own beam search on tests/helpers/sentences.py give outputs of many lengths: some end
    within 5 tokens, some run to the length limit, at least 4 different lengths, and (`most_long`) most are longer
    than 10 tokens and there are at least 6 lengths."""
    import torch
    import transformers

    from tests.helpers.sentences import SENTENCES

    tokenizer = transformers.MarianTokenizer.from_pretrained(model_dir)
    model = transformers.MarianMTModel.from_pretrained(model_dir).eval()
    texts = [f"{target_token} {t}" for t in SENTENCES] if target_token else SENTENCES
    limit = model.config.max_position_embeddings
    encoded = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=limit)
    for beams in (1, model.generation_config.num_beams):
        with torch.no_grad():
            out = model.generate(**encoded, num_beams=beams)
        lengths = sorted(int((row != model.generation_config.pad_token_id).sum()) for row in out[:, 1:])
        assert min(lengths) <= 5 and max(lengths) == limit - 1, (beams, lengths)
        assert len(set(lengths)) >= 4, (beams, lengths)
        if most_long:
            assert sum(n > 10 for n in lengths) >= len(lengths) / 2 and len(set(lengths)) >= 6, (beams, lengths)


def assert_varied_m2m100(model_dir: Path, source: str, targets: tuple[str, ...]) -> None:
    """Greedy and beam 4 over tests/helpers/sentences.py into `targets`: for each search (over the targets together)
    some outputs end within 5 tokens, some run past 20 (greedy: to the length limit), with at least 5 lengths
    (greedy: 6); and into each target alone, outputs of at least two lengths, one past 20 (no target ends every
    output at its first step)."""
    import torch

    from tests.helpers.sentences import SENTENCES

    tokenizer, model = hf_m2m100(model_dir)
    tokenizer.src_lang = source
    limit = model.config.max_position_embeddings
    encoded = tokenizer(SENTENCES, return_tensors="pt", padding=True, truncation=True, max_length=limit)
    for beams in (1, 4):
        lengths = []
        for target in targets:
            with torch.no_grad():
                out = model.generate(**encoded, num_beams=beams, forced_bos_token_id=hf_language_id(tokenizer, target))
            alone = [int((row != model.generation_config.pad_token_id).sum()) for row in out[:, 1:]]
            assert len(set(alone)) >= 2 and max(alone) > 20, (beams, target, sorted(alone))
            lengths += alone
        longest = limit - 1 if beams == 1 else 20
        kinds = 6 if beams == 1 else 5
        assert min(lengths) <= 5 and max(lengths) >= longest and len(set(lengths)) >= kinds, (beams, sorted(lengths))
