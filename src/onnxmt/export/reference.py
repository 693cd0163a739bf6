"""transformers' side of a decoder-only translator, for `onnxmt validate` and `onnxmt eval --reference`: the prompt
as transformers renders and tokenizes it (`apply_chat_template` on the family's request), and `generate()` with the
vendor's sampling set aside, as onnxmt decodes (architectures/decoder_only.py says why).

The request's messages are the family's (`prompt_messages`, torch-free, the contract onnxmt documents); rendering
and tokenizing them are transformers' own, so a validation's "tokenizer identical" count proves onnxmt's
jinja2 rendering and one-call tokenization give transformers' prompt ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..architectures import Prompt
from ..architectures.decoder_only import prompt_messages

# What generate() is told so that it decodes as onnxmt does: no sampling, whatever the generation config says.
DETERMINISTIC = {"do_sample": False, "top_k": None, "top_p": None, "temperature": None}


def chat_ids(tokenizer: Any, languages: dict[str, Any], text: str, prompt: Prompt) -> list[int]:
    """The prompt ids of `text` under a chat `prompt` (its language pair, glossary, context), by transformers'
    `apply_chat_template(add_generation_prompt=True, tokenize=True)` on the family's messages."""
    assert prompt.chat is not None
    messages, variables = prompt_messages(
        languages, text, *prompt.chat, glossary=prompt.glossary, context=prompt.context
    )
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **variables)
    if not isinstance(ids, list):  # transformers 5 answers a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def generate(torch: Any, model: Any, prompt: Sequence[int], eos_ids: Sequence[int], **kwargs: Any) -> list[int]:
    """generate()'s new tokens for one prompt alone (batch 1: no padding to reason about), up to and with the first
    eos id, as onnxmt returns them."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(prompt)]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            eos_token_id=list(eos_ids),
            **DETERMINISTIC,
            **kwargs,
        )
    new = out[0, len(prompt) :].tolist()
    end = next((i + 1 for i, token in enumerate(new) if token in eos_ids), len(new))
    return new[:end]


def logits(torch: Any, model: Any, prompt: Sequence[int], tokens: Sequence[int]) -> Any:
    """(len(tokens) + 1, vocab) logits: the next token's after the prompt and after each of `tokens`."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[*prompt, *tokens]]))
    return out.logits[0, len(prompt) - 1 :].float().numpy()
