"""`onnxmt inspect`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ..manifest import ModelDirError
from ..runtime.options import RuntimeOptions
from .common import fail, size, variants
from .flags import flags, with_options


@with_options(runtime=flags(RuntimeOptions, "variant"))
def inspect(
    model_dir: Annotated[Path, typer.Argument(help="onnxmt, Optimum or Transformers.js model directory.")],
    prompt: Annotated[
        str | None,
        typer.Option(help="Decoder-only models: print the prompt this text becomes (with --source, --target)."),
    ] = None,
    source: Annotated[str, typer.Option(help="--prompt's source language code.")] = "en",
    target: Annotated[str, typer.Option(help="--prompt's target language code.")] = "zh",
    *,
    runtime: RuntimeOptions,
) -> None:
    """Show a model directory: manifest summary, each graph's quantization (read from the graph) and its inputs and
    outputs; with --prompt, a decoder-only model's prompt for a text."""
    from ..runtime.graphinfo import read_graph
    from ..runtime.modeldir import load_manifest

    try:
        manifest = load_manifest(model_dir, verify=True, options=RuntimeOptions(threads=1, variant=runtime.variant))
        found = {part: read_graph(model_dir / graph.file) for part, graph in manifest.graphs.items()}
    except (ModelDirError, ValueError, OSError) as e:
        fail(str(e))
    out = Console()
    if prompt is not None:
        _print_prompt_for(out, model_dir, manifest, prompt, source, target)
        return
    summary = Table(title=f"{model_dir}", show_header=False)
    summary.add_column(no_wrap=True)
    summary.add_column()
    for key, value in _summary(manifest, found).items():
        summary.add_row(key, value)
    out.print(summary)
    if manifest.model.get("decoder_only"):
        _print_prompt(out, model_dir, manifest)
    for part, graph in manifest.graphs.items():
        out.print(_graph_table(part, graph))


def _graph_table(part: str, graph: Any) -> Table:
    """A graph's inputs and outputs: names whole (they are what the manifest and ONNX Runtime call them), the role
    only where it is not the name (Optimum's graphs), the shape wrapped when the terminal is narrow."""
    specs = [(kind, spec) for kind, group in (("in", graph.inputs), ("out", graph.outputs)) for spec in group]
    roles = any(spec.role != spec.name for _, spec in specs)
    table = Table(title=f"{part}: {graph.file}")
    table.add_column("")
    table.add_column("name", no_wrap=True)
    if roles:
        table.add_column("role", no_wrap=True)
    table.add_column("dtype", no_wrap=True)
    table.add_column("shape")
    for kind, spec in specs:
        shape = "(" + ", ".join(map(str, spec.shape)) + ")"
        table.add_row(kind, spec.name, *([spec.role] if roles else []), spec.dtype, shape)
    return table


def _print_prompt_for(out: Console, model_dir: Path, manifest: Any, text: str, source: str, target: str) -> None:
    """The prompt text and ids a translation request becomes (decoder-only models)."""
    import jinja2

    from ..runtime.decoder_only import Prompts

    if not manifest.model.get("decoder_only"):
        fail(f"{model_dir}: --prompt is for decoder-only models; this one is {manifest.architecture}")
    try:
        prompts = Prompts(model_dir, manifest)
        rendered = prompts.text(text, source, target)
    except (ValueError, jinja2.TemplateError) as e:  # an unknown language, or the template's own refusal
        fail(str(e))
    ids = prompts.tokenizer.prompt_ids(rendered)
    out.print(rendered, markup=False, highlight=False, soft_wrap=True)
    out.print(f"{len(ids)} ids: {ids}", markup=False, highlight=False, soft_wrap=True)


def _print_prompt(out: Console, model_dir: Path, manifest: Any) -> None:
    """A decoder-only model's prompt: the family's request rule (and its glossary and context prompts), its language
    table, the vendor's sampling settings set aside, and the chat template itself."""
    from ..architectures.decoder_only import HY_MT_CONTEXT, HY_MT_TERMS, PROMPT_RULES
    from ..tokenization.chat import ChatTemplate

    langs = manifest.languages
    table = Table(title="prompt", show_header=False)
    table.add_row("request", PROMPT_RULES.get(langs.get("prompt"), str(langs.get("prompt"))))
    hy_mt = langs.get("prompt") == "hy_mt"
    table.add_row("with a glossary", repr(HY_MT_TERMS) if hy_mt else "(refused: no terminology prompt)")
    table.add_row("with a context", repr(HY_MT_CONTEXT) if hy_mt else "(refused: no context prompt)")
    table.add_row("languages", ", ".join(f"{code}={name}" for code, name in sorted(langs.get("names", {}).items())))
    if langs.get("names_zh"):
        table.add_row("languages (zh)", ", ".join(f"{c}={n}" for c, n in sorted(langs["names_zh"].items())))
    sampling = langs.get("vendor_sampling") or {}
    table.add_row("vendor sampling (not used)", ", ".join(f"{k}={v}" for k, v in sampling.items()) or "(none)")
    table.add_row("output length", "max_length counts the prompt's tokens too (transformers'); prefer max_new_tokens")
    out.print(table)
    out.print("chat template:", markup=False)
    out.print(ChatTemplate.from_dir(model_dir).source, markup=False, highlight=False)


def _decoder_form(manifest: Any) -> str:
    """How the decoder holds its self-attention cache, and so how rows may share its calls."""
    decoder = manifest.graphs.get("decoder")
    if decoder is None:
        return "Optimum's (static batches)"
    from ..runtime.capabilities import Capabilities

    capabilities = Capabilities.of(manifest)
    if capabilities.in_flight:
        if capabilities.inexact_rows:
            return (
                "buffer, one length per row (rows of different lengths share a call; a row's logits can move in "
                "the last bits with the batch: export again for bit-exact rows)"
            )
        return "buffer, one length per row (rows of different lengths share a call, each row's logits bit-exact)"
    if decoder.has_input("past_length"):
        return "buffer, one length for all rows (static batches; export again for per-row lengths)"
    return "grown by Concat (static batches)"


def _batched(manifest: Any) -> str:
    """Whether a text's translation is the one it gets alone whatever it is batched with (`/info`'s
    batch_invariant, for a batch of more than one text)."""
    from ..runtime.capabilities import Capabilities

    capabilities = Capabilities.of(manifest)
    invariant = capabilities.batch_invariant(max_batch_size=2)
    if invariant is None:
        return "cannot tell: the directory does not record its quantization (onnxmt validate measures it)"
    return "the same as alone, in any batch" if invariant else f"can differ from alone: {capabilities.variant_batches}"


def _output_length(manifest: Any) -> str:
    """The most tokens a translation gets by default, and where that number comes from."""
    from ..runtime.search import DEFAULT_MAX_NEW_TOKENS, names_no_length

    if names_no_length(manifest):
        return (
            f"at most {DEFAULT_MAX_NEW_TOKENS} new tokens: transformers' default, as the model's configs name no "
            "length (most sentences are cut short); pass --max-new-tokens (onnxmt serve: --fallback-max-new-tokens)"
        )
    length = manifest.generation.get("max_length")
    if length is not None:  # the decoder start counted, as transformers counts it
        return f"at most {int(length) - 1} new tokens (the model's max_length {length})"
    return f"at most {manifest.generation['max_new_tokens']} new tokens (the model's max_new_tokens)"


def _summary(manifest: Any, found: dict[str, Any]) -> dict[str, str]:
    """The manifest's rows, then each graph's quantization as read from the graph."""
    from ..architectures import text_unit

    langs = manifest.languages
    rows = {
        "architecture": manifest.architecture,
        "layout": manifest.layout,
        "source model": manifest.provenance.get("source_model", "?"),
        "model": ", ".join(f"{k}={v}" for k, v in manifest.model.items()),
        "special tokens": ", ".join(f"{k}={v}" for k, v in manifest.tokens.items()),
        "generation": ", ".join(f"{k}={v}" for k, v in manifest.generation.items()) or "(transformers defaults)",
        "output length": _output_length(manifest),
        "languages": f"{langs.get('source')} -> {langs.get('target')}",
        "language scheme": str(langs.get("scheme", "target_token_prefix")),
        "source tokens": f"{len(langs['source_tokens'])} (default {langs.get('default_source')})"
        if langs.get("source_tokens")
        else "(none)",
        "target tokens": ", ".join(sorted(langs.get("target_tokens", {}))) or "(single target)",
        "default target": str(langs.get("default_target")),
        "variant": variants(manifest),
        "decoder cache": _decoder_form(manifest),
        "batched translations": _batched(manifest),
        "quantization (manifest)": str(manifest.quantization.get("method")) if manifest.quantization else "none",
        **{f"{part} graph": contents.quantization() for part, contents in found.items()},
        "files": ", ".join(f"{n} ({size(i.get('bytes'))})" for n, i in manifest.files.items()),
    }
    rows["unit of text"] = f"{text_unit(manifest.architecture)} (onnxmt translate --unit, onnxmt serve --text-unit)"
    if langs.get("scheme") == "chat_template":  # the prompt names the languages: its table is shown below
        rows["languages"] = f"{len(langs.get('names', {}))} in the prompt's table (below)"
        for row in ("source tokens", "target tokens"):
            rows[row] = "(none: the prompt names the languages)"
    return rows
