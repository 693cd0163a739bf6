"""Each option declared once: a field of a frozen options dataclass (`RuntimeOptions`, `DecodeOptions`,
`ServeOptions`, ...) written `option(default, help=..., min=...)`, whose help text and limits live in the field's
metadata. `check` (each dataclass's `__post_init__`) enforces the limits; the CLI (`onnxmt.cli.flags`: flags and
`ONNXMT_*` variables) and the service's request fields (`serve/schemas.py`, `serve/protocol.py`) are generated from
the same metadata. This module imports nothing of onnxmt, so every layer may use it."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any, TypeVar

T = TypeVar("T")

KEY = "onnxmt"  # the metadata key of an Option


@dataclass(frozen=True)
class Option:
    """What a field's metadata says about it.

    min: the least valid value; above: a value it must exceed; max: the most; choices: the valid values (limits
    never apply to None, which means "the default"). flags: the field's CLI declarations when they are not
    `--field-name` (`--force` for a switch without `--no-force`, `--cache-buffer/--cache-concat`). env: its
    ONNXMT_<NAME> variable is read by every command (`onnxmt serve` reads one for each of its flags anyway).
    parse: the field's value from the flag's or variable's value (a tuple field takes a comma-separated list;
    repeat: or the flag given several times)."""

    help: str
    min: int | float | None = None
    above: int | float | None = None
    max: int | float | None = None
    choices: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    env: bool = False
    parse: Callable[[Any], Any] | None = None
    repeat: bool = False

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` ("must be at least 1"), or None."""
        if self.min is not None and self.max is not None and not self.min <= value <= self.max:
            return f"must be {self.min}..{self.max}"
        if self.min is not None and value < self.min:
            return "must not be negative" if self.min == 0 else f"must be at least {self.min}"
        if self.above is not None and not value > self.above:
            return "must be positive" if self.above == 0 else f"must exceed {self.above}"
        if self.max is not None and value > self.max:
            return f"must be at most {self.max}"
        return None


def option(default: Any = MISSING, *, help: str, **facts: Any) -> Any:
    """A dataclass field with its help text and limits (the keywords of `Option`)."""
    return dataclasses.field(default=default, metadata={KEY: Option(help, **facts)})


def described(field: dataclasses.Field[Any]) -> Option | None:
    """The Option of a field declared with `option`, else None."""
    return field.metadata.get(KEY)


def spec(cls: type, name: str) -> Option:
    """The Option of field `name` of the dataclass `cls`: `spec(DecodeOptions, "beams").min`."""
    for field in dataclasses.fields(cls):
        if field.name == name and KEY in field.metadata:
            return field.metadata[KEY]
    raise KeyError(f"{cls.__name__} has no option {name!r}")


def check(options: object) -> None:
    """ValueError naming the first field of the dataclass instance `options` outside its limits."""
    for field in dataclasses.fields(options):  # type: ignore[arg-type]
        described_as, value = field.metadata.get(KEY), getattr(options, field.name)
        if described_as is None or value is None:
            continue
        if described_as.choices and value not in described_as.choices:
            what = field.name.replace("_", " ")
            raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(described_as.choices)}")
        problem = described_as.problem(value)
        if problem:
            raise ValueError(f"{field.name} {problem}, got {value}")


def split_list(value: str | None) -> tuple[str, ...]:
    """`"a, b,,c"` -> `("a", "b", "c")`: how list settings (API keys, CORS origins) arrive from flags and the
    environment."""
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())


def restore(cls: type[T], data: Mapping[str, Any]) -> T:
    """The dataclass `cls` from `dataclasses.asdict` of one (through JSON: lists back to tuples, composed options
    back to their dataclasses)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.name not in data:
            continue
        value, hint = data[field.name], hints[field.name]
        if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
            value = restore(hint, value)  # type: ignore[arg-type]
        elif isinstance(value, list):
            value = tuple(value)
        values[field.name] = value
    return cls(**values)
