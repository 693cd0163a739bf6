"""Options declared once: every field carries its help and limits, and the CLI, the environment and the service's
request fields are generated from them."""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from typing import Any

import pytest
import typer.main

from onnxmt.cli import app
from onnxmt.eval import EvalOptions
from onnxmt.export.exporter import ExportOptions
from onnxmt.export.quantize import QuantizeOptions
from onnxmt.export.validate import ValidateOptions
from onnxmt.options import described, restore, spec
from onnxmt.runtime.invariance import InvarianceOptions
from onnxmt.runtime.options import BatchLimits, DecodeOptions, RuntimeOptions, call_options, decode_options
from onnxmt.scale.rayserve import RayServeOptions
from onnxmt.serve.options import ServeOptions
from onnxmt.serve.schemas import TranslateBody

DECLARED = (
    RuntimeOptions,
    DecodeOptions,
    ServeOptions,
    ExportOptions,
    QuantizeOptions,
    RayServeOptions,
    InvarianceOptions,
)


@pytest.mark.parametrize("cls", DECLARED, ids=lambda cls: cls.__name__)
def test_every_option_has_its_help(cls: type) -> None:
    for field in dataclasses.fields(cls):
        option = described(field)
        assert option is not None and option.help.endswith((".", ")")), f"{cls.__name__}.{field.name}"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_queue": 0}, "max_queue must be at least 1, got 0"),
        ({"timeout": -1.0}, "timeout must not be negative, got -1.0"),
        ({"request_timeout": 0.0}, "request_timeout must be positive, got 0.0"),
        ({"port": 70000}, "port must be 0..65535, got 70000"),
        ({"log_level": "loud"}, "unknown log level 'loud'; valid: critical, error"),
    ],
)
def test_limits_come_from_the_fields(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServeOptions(**changes)  # type: ignore[arg-type]


def test_a_calls_keywords_become_typed_options() -> None:
    decoding, batching = call_options(
        DecodeOptions(beams=2), BatchLimits(8, 100), {"beams": 4, "batch_size": 3, "max_new_tokens": None}
    )
    assert decoding == DecodeOptions(beams=4) and batching == BatchLimits(3, 100)
    with pytest.raises(TypeError, match=r"unknown decoding option\(s\) \['beam'\]; valid: \[.*'batch_size'"):
        call_options(DecodeOptions(), BatchLimits(), {"beam": 4})
    # Texts are prepared one by one: a batch limit is not theirs to take.
    with pytest.raises(TypeError, match=r"unknown decoding option\(s\) \['batch_size'\]"):
        decode_options(DecodeOptions(), {"batch_size": 4})
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        call_options(DecodeOptions(), BatchLimits(), {"batch_size": 0})


def test_composed_options_survive_json() -> None:
    options = EvalOptions(
        decoding=DecodeOptions(beams=2),
        batching=BatchLimits(batch_size=4),
        runtime=RuntimeOptions(threads=1),
        invariance=InvarianceOptions(batch_check=True),
        target_lang="fra_Latn",
    )
    assert restore(EvalOptions, json.loads(json.dumps(dataclasses.asdict(options)))) == options
    assert ValidateOptions().batching.batch_size == 1  # validate's own default, taken by its --batch-size


def _parameters(command: str) -> dict[str, Any]:
    """The click parameters of a command, by name."""
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    return {p.name: p for p in commands[command].params}


def test_serve_flags_are_serve_options_with_their_variables() -> None:
    parameters = _parameters("serve")
    for field in dataclasses.fields(ServeOptions):
        parameter = parameters[field.name]
        assert parameter.envvar == f"ONNXMT_{field.name.upper()}"
        assert parameter.help == spec(ServeOptions, field.name).help
    for name in ("beams", "max_new_tokens", "threads", "variant", "replicas", "cpus_per_replica"):
        assert parameters[name].envvar == f"ONNXMT_{name.upper()}"


def test_decoding_flags_are_declared_once() -> None:
    # The same DecodeOptions field, the same help, wherever a command takes it (eval and validate say what
    # their beam pass means); only --variant reads its variable outside `serve`.
    for command in ("translate", "translate-corpus", "serve"):
        assert _parameters(command)["beams"].help == spec(DecodeOptions, "beams").help
    assert _parameters("translate")["threads"].envvar is None
    assert _parameters("translate")["variant"].envvar == "ONNXMT_VARIANT"
    assert _parameters("validate")["batch_size"].default == 1 and _parameters("eval")["batch_size"].default == 16


def test_request_fields_take_the_options_bound_and_help() -> None:
    schema = TranslateBody.model_json_schema()["properties"]
    for name in ("beams", "max_new_tokens"):
        option = spec(DecodeOptions, name)
        field = next(s for s in schema[name]["anyOf"] if s.get("type") == "integer")
        assert field["minimum"] == option.min
        assert schema[name]["description"].lower() == f"onnxmt: {option.help}".lower()


def test_commands_keep_their_own_parameters_first() -> None:
    from onnxmt.cli import translate

    names = list(inspect.signature(translate).parameters)
    assert names[:3] == ["texts", "model", "input_file"] and "decoding" not in names
    assert typing.get_type_hints(DecodeOptions)["beams"] == int | None
