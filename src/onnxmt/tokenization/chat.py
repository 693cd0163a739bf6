"""A model's chat template rendered as transformers' `apply_chat_template` renders it, torch-free, on jinja2.

The environment is transformers' (utils/chat_template_utils.py): sandboxed and immutable, `trim_blocks` and
`lstrip_blocks`, the loop-controls extension, its `tojson` filter (no HTML escaping), `raise_exception` raising
jinja2's TemplateError, `strftime_now`, and the tokenizer's special tokens (`bos_token`, `eos_token`, ...) as
variables. The text it renders is tokenized in one call without adding special tokens: the template writes BOS
itself (`apply_chat_template(tokenize=True)` does the same), so the prompt never gets it twice.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..manifest import ModelDirError

CHAT_TEMPLATE_FILE = "chat_template.jinja"
_SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=16)
def compile_template(source: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): its body as it is."""

        tags = {"generation"}  # noqa: RUF012  (jinja2's Extension API)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatTemplate:
    """A chat template and the special tokens it may name."""

    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        self.source = source
        self.special_tokens = special_tokens

    @classmethod
    def from_dir(cls, directory: str | Path) -> ChatTemplate:
        """From `chat_template.jinja` (transformers 5's file), else tokenizer_config.json's `chat_template`."""
        directory = Path(directory)
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        path = directory / CHAT_TEMPLATE_FILE
        source = path.read_text(encoding="utf-8") if path.is_file() else config.get("chat_template")
        if not isinstance(source, str):
            raise ModelDirError(f"{directory}: no chat template ({CHAT_TEMPLATE_FILE} or tokenizer_config.json)")
        specials = {}
        for role in _SPECIAL_ROLES:
            value = config.get(role)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                specials[role] = value
        return cls(source, specials)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The template's text for `messages`; `kwargs` are the template's own variables (`enable_thinking`)."""
        return str(
            compile_template(self.source).render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens, **kwargs
            )
        )
