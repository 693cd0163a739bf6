"""Every generation-config field that changes the output is honoured or refused, at export and at load."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from onnxmt.manifest import (
    FORMAT_VERSION,
    GENERATION_KEYS,
    MANIFEST_NAME,
    REFUSED_GENERATION,
    ModelDirError,
    check_generation_config,
    read_manifest,
    refused_generation_fields,
)
from onnxmt.runtime.translator import Translator, resolve_settings
from tests.helpers import ROOT
from tests.helpers.skips import importorskip


def test_sampling_and_other_searches_are_refused_by_name() -> None:
    refused = refused_generation_fields({"do_sample": True, "num_beam_groups": 2, "diversity_penalty": 0.5})
    assert refused == ["do_sample=True", "num_beam_groups=2", "diversity_penalty=0.5"]
    with pytest.raises(ModelDirError, match=r"generation_config.json: .*do_sample=True.*docs/decoding.md"):
        check_generation_config({"do_sample": True}, "generation_config.json")


def test_inactive_values_and_sampling_knobs_without_sampling_pass() -> None:
    # transformers ignores temperature/top_k/top_p unless do_sample is on; the inactive values change nothing.
    config = {"do_sample": False, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "num_beam_groups": 1}
    config |= {"diversity_penalty": 0.0, "remove_invalid_values": False, "max_time": None, "low_memory": True}
    assert refused_generation_fields(config) == []


def test_honoured_and_refused_fields_are_real_generation_config_fields() -> None:
    transformers = importorskip("transformers")
    known = set(vars(transformers.GenerationConfig()))
    # forced_decoder_ids left GenerationConfig in transformers 5, but 4.x checkpoints still carry it.
    assert set(GENERATION_KEYS) <= known
    assert set(REFUSED_GENERATION) - {"forced_decoder_ids"} <= known


def test_every_generation_config_field_is_listed_in_docs() -> None:
    transformers = importorskip("transformers")
    doc = (ROOT / "docs" / "decoding.md").read_text(encoding="utf-8")
    missing = [f for f in vars(transformers.GenerationConfig()) if not f.startswith("_") and f"`{f}`" not in doc]
    assert missing == []


def test_export_refuses_a_sampling_config_before_any_work(tiny_hf_dir: Path, tmp_path: Path) -> None:
    from onnxmt.export.exporter import export

    source = tmp_path / "hf"
    shutil.copytree(tiny_hf_dir, source)
    path = source / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "do_sample": True, "top_k": 10}), encoding="utf-8")
    with pytest.raises(ModelDirError, match="do_sample=True"):
        export(str(source), tmp_path / "out", progress=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_renormalize_logits_reaches_the_manifest_and_the_settings(tiny_onnx_dir: Path) -> None:
    manifest = read_manifest(tiny_onnx_dir)
    assert manifest.generation["renormalize_logits"] is True
    translator = Translator(tiny_onnx_dir)
    assert resolve_settings(manifest, translator.decoding).renormalize
    assert not resolve_settings(manifest, replace(translator.decoding, renormalize_logits=False)).renormalize


def _as_version_1(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    data = json.loads((target / MANIFEST_NAME).read_text(encoding="utf-8"))
    data["format_version"] = 1
    data["generation"] = {k: v for k, v in data["generation"].items() if k != "renormalize_logits"}
    (target / MANIFEST_NAME).write_text(json.dumps(data), encoding="utf-8")
    return target


def test_a_version_1_directory_reads_its_generation_config_again(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    # Version 1 did not copy renormalize_logits; the generation_config.json kept beside it still has it.
    old = _as_version_1(tiny_onnx_dir, tmp_path / "v1")
    manifest = read_manifest(old)
    assert manifest.format_version == FORMAT_VERSION and manifest.generation["renormalize_logits"] is True


def test_a_version_1_directory_with_a_refused_field_is_refused(tiny_onnx_dir: Path, tmp_path: Path) -> None:
    old = _as_version_1(tiny_onnx_dir, tmp_path / "v1")
    path = old / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "do_sample": True}), encoding="utf-8")
    with pytest.raises(ModelDirError, match="do_sample=True"):
        read_manifest(old)
