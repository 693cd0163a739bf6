"""A command's flags generated from the options dataclasses' fields (`onnxmt.options`): each field's help, flag
names and ONNXMT_* variable come from its metadata, and the parsed values are packed back into the dataclasses,
whose own checks then run. Typer reads a command's parameters from `inspect.signature`, so `with_options` gives the
command a `__signature__` of its own parameters followed by the generated ones."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

import typer

from ..options import Option, described, split_list
from .common import fail

Command = Callable[..., None]


@dataclass(frozen=True)
class Flags:
    """The fields of the options dataclass `cls` a command takes as flags: `names`, a field of a composed dataclass
    written "decoding.beams". `helps`: the command's own help for a field it gives another meaning. `partial`: the
    command completes the dataclass itself, so it gets a dict of the values instead. `panel`: the `--help` panel
    of the flags (None: "Options"), `panels`: a panel title -> the fields it shows instead."""

    cls: type
    names: tuple[str, ...]
    helps: Mapping[str, str] = field(default_factory=dict)
    partial: bool = False
    panel: str | None = None
    panels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def panel_of(self, name: str) -> str | None:
        return next((title for title, names in self.panels.items() if name in names), self.panel)


def flags(
    cls: type,
    *names: str,
    helps: Mapping[str, str] | None = None,
    partial: bool = False,
    panel: str | None = None,
    panels: Mapping[str, tuple[str, ...]] | None = None,
) -> Flags:
    """`Flags` of `names`, or of every field declared with `option` when none are given."""
    every = tuple(f.name for f in dataclasses.fields(cls) if described(f))
    return Flags(cls, names or every, helps or {}, partial, panel, panels or {})


@dataclass(frozen=True)
class _Flag:
    path: tuple[str, ...]  # ("decoding", "beams")
    parameter: inspect.Parameter
    parse: Callable[[Any], Any]


def with_options(*, env: bool = False, **groups: Flags) -> Callable[[Command], Command]:
    """The command with one flag per field of each group, called with keyword `group` bound to the dataclass built
    from them. `env`: every generated flag defaults from its ONNXMT_<NAME> variable (else only the fields whose
    metadata asks for it). A dataclass's ValueError exits 2, as `fail` does."""

    def decorate(command: Command) -> Command:
        own = inspect.signature(command, eval_str=True)
        generated = {group: [_flag(spec, name, env) for name in spec.names] for group, spec in groups.items()}
        parameters = [p for p in own.parameters.values() if p.name not in groups]
        parameters += [flag.parameter for group in generated.values() for flag in group]
        names = [p.name for p in parameters]
        if len(set(names)) != len(names):
            raise TypeError(f"{command.__name__}: two flags of one name in {names}")

        def run(**values: Any) -> None:
            try:
                packed = {group: _pack(groups[group], flags, values) for group, flags in generated.items()}
            except ValueError as e:
                fail(str(e))
            command(**values, **packed)

        run.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        for attribute in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(run, attribute, getattr(command, attribute))
        return run

    return decorate


def _flag(spec: Flags, name: str, env: bool) -> _Flag:
    """The typer parameter of the field `name` of `spec.cls` and how to read its value back."""
    path = tuple(name.split("."))
    if len(path) > 2:
        raise TypeError(f"{name}: flags reach one composed dataclass deep")
    owner, default = spec.cls, None
    for part in path[:-1]:  # down to the dataclass that declares the field
        default = getattr(default, part) if default is not None else _field_default(_field(owner, part))
        owner = type(default)
    declared = _field(owner, path[-1])
    option: Option | None = described(declared)
    if option is None:
        raise TypeError(f"{owner.__name__}.{path[-1]} is not declared with onnxmt.options.option")
    value = getattr(default, path[-1]) if default is not None else _field_default(declared)
    hint = typing.get_type_hints(owner)[path[-1]]
    kind, cli_default, parse = _cli_type(hint, value, option)
    envvar = f"ONNXMT_{path[-1].upper()}" if env or option.env else None
    info = typer.Option(
        *option.flags, help=spec.helps.get(name, option.help), envvar=envvar, rich_help_panel=spec.panel_of(name)
    )
    parameter = inspect.Parameter(
        path[-1], inspect.Parameter.KEYWORD_ONLY, default=cli_default, annotation=Annotated[kind, info]
    )
    return _Flag(path, parameter, parse)


def _cli_type(hint: Any, default: Any, option: Option) -> tuple[Any, Any, Callable[[Any], Any]]:
    """(the flag's type, its default, its value -> the field's). A tuple of strings is a comma-separated list
    (`repeat`: the flag may also be repeated, each time such a list)."""
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    base = next(k for k in kinds if k is not type(None))
    if typing.get_origin(base) is not tuple:
        parse = option.parse or (lambda value: value)
        return hint, default, lambda value: parse(value) if value is not None else None
    if option.repeat:
        return list[str] | None, list(default) or None, lambda values: _split_each(values or [])
    return str | None, ",".join(default) or None, split_list


def _split_each(values: list[str]) -> tuple[str, ...]:
    return tuple(item for value in values for item in split_list(value))


def _pack(spec: Flags, flags: list[_Flag], values: dict[str, Any]) -> Any:
    """The dataclass (with `partial`, a dict of its fields) from the flags' values, taken out of `values`."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for flag in flags:
        value = flag.parse(values.pop(flag.parameter.name))
        if len(flag.path) == 1:
            top[flag.path[0]] = value
        else:
            nested.setdefault(flag.path[0], {})[flag.path[1]] = value
    for name, changes in nested.items():
        top[name] = replace(_field_default(_field(spec.cls, name)), **changes)
    return top if spec.partial else spec.cls(**top)


def _field(cls: type, name: str) -> dataclasses.Field[Any]:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def _field_default(declared: dataclasses.Field[Any]) -> Any:
    if declared.default_factory is not dataclasses.MISSING:
        return declared.default_factory()
    return declared.default
