"""`onnxmt validate`: an exported model directory against its PyTorch reference, with numbers that explain.

Both sides translate the same corpus with the same settings: onnxmt's `Translator` (its own tokenizer, ONNX
Runtime, its decoding loop) and transformers' tokenizer + `generate()`. Reported:

- logits: max and mean absolute difference, teacher-forced on the reference's greedy output;
- the token-identical rate for greedy search and for beam search (the model's beam size);
- for each output that differs, the first step where it differs, the two tokens, and the logit margin between
  them at that step on both sides. A margin under the fp32 noise is a floating-point tie; a large one is a bug.

Needs the export extra (torch, transformers); both are imported inside the functions that use them.
"""

from __future__ import annotations

import gc
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..architectures import Prompt, scheme_for
from ..runtime.invariance import InvarianceOptions, batch_invariance
from ..runtime.modeldir import load_manifest
from ..runtime.options import BatchLimits, DecodeOptions, RuntimeOptions
from ..runtime.tokenizer import load_tokenizer
from ..runtime.translator import Translator
from . import reference as hf
from .hub import quiet_transformers

# A reference margin under this is a floating-point tie: fp32 exports differ from PyTorch by ~1e-5 in the logits.
TIE_MARGIN = 1e-3

# The default corpus: everyday short sentences and long ones (100+ characters), where errors accumulate.
SHORT_SENTENCES = (
    "Hello world.",
    "How are you today?",
    "The weather is nice.",
    "I would like a cup of tea, please.",
    "Where is the train station?",
    "Thank you very much!",
    "She reads a book every evening.",
    "We will meet again tomorrow morning.",
)
LONG_SENTENCES = (
    "The committee met on Tuesday to discuss the new budget, but after three hours of debate the members still "
    "could not agree on how much money should go to schools.",
    "When the river flooded last spring, hundreds of families in the small town had to leave their homes and stay "
    "with relatives in the city for several weeks.",
    "Researchers at the university have developed a new method for measuring air pollution that is cheaper, faster "
    "and more accurate than the instruments used today.",
    "If you want to travel from the airport to the city centre, the fastest way is to take the express train, which "
    "leaves every fifteen minutes and takes about half an hour.",
    "The museum, which was closed for two years while its old building was repaired, opened its doors again on "
    "Sunday with an exhibition of paintings from the nineteenth century.",
    "Although the company reported higher sales in the last quarter, its profits fell because the cost of energy "
    "and raw materials rose faster than expected.",
    "Doctors recommend that adults sleep at least seven hours a night, drink enough water and walk for thirty "
    "minutes every day to stay healthy.",
    "The new bridge across the bay will connect the two largest cities of the region and is expected to reduce the "
    "travel time between them from two hours to forty minutes.",
)
DEFAULT_CORPUS = SHORT_SENTENCES + LONG_SENTENCES


@dataclass(frozen=True)
class ValidateOptions:
    """decoding: beams is the beam size of the beam-search pass (a greedy pass runs too), max_new_tokens None keeps
    the model's generation limit. batching: batch_size is the sentences per batch on both sides. runtime: threads
    is that of ONNX Runtime and torch. invariance: the batch check (runtime/invariance.py). source_lang,
    target_lang: the language pair, as `Translator.translate` takes it."""

    decoding: DecodeOptions = DecodeOptions()
    runtime: RuntimeOptions = RuntimeOptions()
    batching: BatchLimits = BatchLimits(batch_size=1)
    invariance: InvarianceOptions = InvarianceOptions()
    source_lang: str | None = None
    target_lang: str | None = None


@dataclass(frozen=True)
class Divergence:
    """The first step where the ONNX output differs from the reference output of one sentence."""

    search: str  # "greedy" or "beam"
    index: int  # the sentence's line in the corpus
    text: str
    step: int  # 0-based position in the generated tokens
    reference_token: int | None  # None: that side had already ended
    onnx_token: int | None
    reference_piece: str | None
    onnx_piece: str | None
    reference_margin: float | None  # reference logit of its token minus that of the ONNX token, at this step
    onnx_margin: float | None  # the same difference in the ONNX logits (negative when the choice flipped)
    step_max_abs_logit_diff: float | None

    @property
    def verdict(self) -> str:
        if self.reference_margin is None or self.step_max_abs_logit_diff is None:
            return "one side ended"
        if abs(self.reference_margin) < TIE_MARGIN:
            return "floating-point tie"
        if self.step_max_abs_logit_diff < TIE_MARGIN:
            # Same logits at this step: beam search re-ranked on a near-tie of whole-hypothesis scores.
            return "search tie (logits agree)"
        return "logits differ"


@dataclass
class ValidationReport:
    model_dir: str
    reference: str
    sentences: int
    beams: int
    max_abs_logit_diff: float
    mean_abs_logit_diff: float
    greedy_identical: int
    beam_identical: int
    tokenizer_identical: int
    divergences: list[Divergence] = field(default_factory=list)
    per_sentence: list[dict[str, Any]] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    # search -> BatchInvariance.to_dict(): same tokens alone and in shuffled batches (None: not checked)
    batch_invariance: dict[str, dict[str, Any]] | None = None

    @property
    def greedy_rate(self) -> float:
        return self.greedy_identical / self.sentences if self.sentences else 1.0

    @property
    def beam_rate(self) -> float:
        return self.beam_identical / self.sentences if self.sentences else 1.0

    @property
    def identical_rate(self) -> float:
        """The lower of the two rates: what `--min-identical` is compared with."""
        return min(self.greedy_rate, self.beam_rate)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(greedy_rate=self.greedy_rate, beam_rate=self.beam_rate, identical_rate=self.identical_rate)
        for d, source in zip(data["divergences"], self.divergences, strict=True):
            d["verdict"] = source.verdict
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    def to_markdown(self) -> str:
        lines = [
            f"# Validation of `{self.model_dir}` against `{self.reference}`",
            "",
            "| measure | value |",
            "| --- | --- |",
            f"| sentences | {self.sentences} |",
            f"| tokenizer identical | {self.tokenizer_identical}/{self.sentences} |",
            f"| max abs logit diff (teacher-forced) | {self.max_abs_logit_diff:.3g} |",
            f"| mean abs logit diff (teacher-forced) | {self.mean_abs_logit_diff:.3g} |",
            f"| greedy token-identical | {self.greedy_identical}/{self.sentences} ({self.greedy_rate:.1%}) |",
            f"| beam ({self.beams}) token-identical | {self.beam_identical}/{self.sentences} ({self.beam_rate:.1%}) |",
        ]
        for search, check in (self.batch_invariance or {}).items():
            lines.append(f"| batch-invariant, {search} | {check['description']} |")
        lines.append("")
        if self.divergences:
            lines += [
                "## First differences",
                "",
                "| search | line | step | reference token | onnx token | reference margin | onnx margin | verdict |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for d in self.divergences:
                lines.append(
                    f"| {d.search} | {d.index + 1} | {d.step} | {_token(d.reference_token, d.reference_piece)} | "
                    f"{_token(d.onnx_token, d.onnx_piece)} | {_num(d.reference_margin)} | {_num(d.onnx_margin)} | "
                    f"{d.verdict} |"
                )
            lines.append("")
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        lines.append(
            f"Versions: {versions}. Margins are logit differences at the first differing step; "
            f"a reference margin under {TIE_MARGIN:g} is a floating-point tie."
        )
        return "\n".join(lines) + "\n"


def _token(token: int | None, piece: str | None) -> str:
    return "(ended)" if token is None else f"{token} `{piece}`"


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def read_corpus(path: Path | None) -> list[str]:
    """Non-empty lines of `path`, or the built-in corpus."""
    if path is None:
        return list(DEFAULT_CORPUS)
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    texts = [line for line in lines if line]
    if not texts:
        raise ValueError(f"{path}: no sentences (one per line)")
    return texts


# Below this many parameters the reference runs on one torch thread unless --threads says otherwise (the test
# models; opus-mt has 77M).
SMALL_MODEL_PARAMETERS = 10_000_000


class _Reference:
    """transformers' side: tokenizer, model, generate() and teacher-forced logits. A decoder-only model's prompt is
    its chat template around the family's request (export/reference.py), each prompt generated alone."""

    def __init__(self, reference: str, threads: int | None, max_positions: int, manifest: Any) -> None:
        import torch
        from transformers import AutoTokenizer

        from ..architectures import get_architecture
        from .hub import resolve_model

        source, _ = resolve_model(reference)
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
        self.torch = torch
        # Truncated at the model's positions, as onnxmt's tokenizer does (opus-mt names no model_max_length; T5's
        # config has no max_position_embeddings): the manifest's figure, on both sides.
        self.max_positions = max_positions
        self.languages = manifest.languages
        self.decoder_only = bool(manifest.model.get("decoder_only"))
        self.start = int(manifest.tokens["decoder_start"])
        self.eos_ids = [int(i) for i in manifest.tokens["eos_ids"]]
        with quiet_transformers():
            self.model = get_architecture(config.get("model_type")).load(str(source))
            self.tokenizer = AutoTokenizer.from_pretrained(str(source))
        if not threads and sum(p.numel() for p in self.model.parameters()) < SMALL_MODEL_PARAMETERS:
            threads = 1  # a small model's ops are too short to share: torch's threads only wait for each other
        if threads:
            torch.set_num_threads(threads)

    def prompt_ids(self, text: str, prompt: Prompt, source: str | None) -> list[int]:
        """One text's ids as transformers gives them to the model (`encode`, or the chat template's prompt)."""
        if prompt.chat is not None:
            return hf.chat_ids(self.tokenizer, self.languages, text, prompt)
        return list(self.encode([text], prompt, source).input_ids[0].tolist())

    def outputs(self, texts: Sequence[str], prompt: Prompt, source: str | None, **kwargs: Any) -> list[list[int]]:
        """generate()'s tokens for `texts` (together, or a decoder-only model's each alone)."""
        if self.decoder_only:
            ids = [self.prompt_ids(text, prompt, source) for text in texts]
            return [hf.generate(self.torch, self.model, p, self.eos_ids, **kwargs) for p in ids]
        return self.generate(self.encode(texts, prompt, source), prompt, **kwargs)

    def encode(self, texts: Sequence[str], prompt: Prompt, source: str | None) -> Any:
        """The HF tokenizer's ids under the same language prompt: its text prefix, its source language (the
        tokenizer adds that language's token itself, as users run it)."""
        texts = [prompt.text + t for t in texts]
        if source is not None and hasattr(self.tokenizer, "src_lang"):
            self.tokenizer.src_lang = source
        limit = min(self.tokenizer.model_max_length, self.max_positions)
        return self.tokenizer(list(texts), return_tensors="pt", padding=True, truncation=True, max_length=limit)

    def generate(self, encoded: Any, prompt: Prompt, **kwargs: Any) -> list[list[int]]:
        if prompt.forced_bos is not None:
            kwargs["forced_bos_token_id"] = prompt.forced_bos
        with self.torch.no_grad(), quiet_transformers():
            out = self.model.generate(**encoded, **kwargs)
        config = self.model.generation_config
        pad = config.pad_token_id
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        rows = []
        for row in out.tolist():
            row = row[1:]  # the decoder start token
            # Up to the first eos, as onnxmt returns it: generate() pads a finished row with pad, or with eos where
            # the generation config names no pad (T5's).
            end = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
            row = row[:end]
            while row and row[-1] == pad:
                row.pop()
            rows.append(row)
        return rows

    def logits(self, ids: list[int], tokens: list[int]) -> np.ndarray:
        """(len(tokens) + 1, vocab) logits for one sentence: the next token's at the start and after each of
        `tokens`, the output so far."""
        t = self.torch
        if self.decoder_only:
            return np.asarray(hf.logits(t, self.model, ids, tokens))
        with t.no_grad():
            out = self.model(
                input_ids=t.tensor([ids]),
                attention_mask=t.ones(1, len(ids), dtype=t.long),
                decoder_input_ids=t.tensor([[self.start, *tokens]]),
            )
        return out.logits[0].numpy()


def validate(
    model_dir: str | Path,
    reference: str,
    texts: Sequence[str] = DEFAULT_CORPUS,
    options: ValidateOptions = ValidateOptions(),
    advance: Callable[[int], None] = lambda n: None,
) -> ValidationReport:
    """Compare `model_dir` with `reference` on `texts`. `advance(n)` reports progress: 3 units per sentence.

    The reference runs first, its outputs and teacher-forced logits kept (the logits in a temporary directory:
    steps x vocabulary floats per sentence and search, ~1 MB a step for NLLB-200; a ValueError before they would
    leave less than 1 GB free on that disk), and is freed before ONNX Runtime opens the graphs: the two models are
    never resident together (a 3B model is 13 GB a side)."""
    texts = list(texts)
    directory = Path(model_dir)
    manifest = load_manifest(directory, verify=False)
    tokenizer = load_tokenizer(directory, manifest.tokenizer.get("kind"))
    scheme = scheme_for(manifest.languages, tokenizer.token_id)
    token = (
        scheme.prompt(options.source_lang, options.target_lang),
        scheme.languages.resolve_source(options.source_lang),
    )
    beams = options.decoding.beams or int(manifest.generation.get("num_beams") or 1)
    with tempfile.TemporaryDirectory(prefix="onnxmt-validate-") as scratch:
        ref = _reference_side(reference, texts, beams, token, manifest, options, advance, Path(scratch))
        translator = Translator(model_dir, options.runtime)
        onnx_out = {
            search: _onnx_outputs(translator, texts, b, options, advance if search == "beam" else lambda n: None)
            for search, b in ref.searches
        }
        report = ValidationReport(
            model_dir=str(model_dir),
            reference=reference,
            sentences=len(texts),
            beams=beams,
            max_abs_logit_diff=0.0,
            mean_abs_logit_diff=0.0,
            greedy_identical=sum(a == b for a, b in zip(ref.outputs["greedy"], onnx_out["greedy"], strict=True)),
            beam_identical=sum(a == b for a, b in zip(ref.outputs["beam"], onnx_out["beam"], strict=True)),
            tokenizer_identical=0,
            versions=_versions(),
        )
        total_abs, count = 0.0, 0
        for i, text in enumerate(texts):
            sentence, diff = _compare_sentence(i, text, token[0], ref, onnx_out, translator, report)
            report.per_sentence.append(sentence)
            report.max_abs_logit_diff = max(report.max_abs_logit_diff, float(diff.max()))
            total_abs, count = total_abs + float(diff.sum()), count + diff.size
            advance(1)
    report.mean_abs_logit_diff = total_abs / count if count else 0.0
    if options.invariance.wanted(translator.manifest):
        report.batch_invariance = {}
        for search, b in ref.searches:
            decoding = replace(translator.decoding, beams=b, max_new_tokens=options.decoding.max_new_tokens)
            result = batch_invariance(
                translator,
                texts,
                sample=options.invariance.batch_sample,
                options=decoding,
                source_lang=options.source_lang,
                target_lang=options.target_lang,
            )
            report.batch_invariance[search] = {**result.to_dict(), "description": result.describe()}
    return report


@dataclass
class _ReferenceRun:
    """What the reference produced: per search its outputs, per sentence its source ids, and the teacher-forced
    logits on each output, (steps, vocab), in files under `scratch`."""

    searches: tuple[tuple[str, int], ...]
    outputs: dict[str, list[list[int]]]
    ids: list[list[int]]
    scratch: Path

    def logits(self, search: str, index: int) -> np.ndarray:
        return np.load(self.scratch / f"{search}-{index}.npy")


def _reference_side(
    reference: str,
    texts: list[str],
    beams: int,
    token: tuple[Prompt, str | None],
    manifest: Any,
    options: ValidateOptions,
    advance: Callable[[int], None],
    scratch: Path,
) -> _ReferenceRun:
    """transformers' outputs for both searches and their teacher-forced logits; the model is freed on return."""
    ref = _Reference(reference, options.runtime.threads, int(manifest.model["max_positions"]), manifest)
    searches = (("greedy", 1), ("beam", beams))
    outputs: dict[str, list[list[int]]] = {search: [] for search, _ in searches}
    size, max_new_tokens = options.batching.batch_size, options.decoding.max_new_tokens
    limit: dict[str, Any] = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
    for first in range(0, len(texts), size):
        batch = texts[first : first + size]
        for search, b in searches:
            outputs[search] += ref.outputs(batch, *token, num_beams=b, **limit)
        advance(len(batch))
    ids = [ref.prompt_ids(text, *token) for text in texts]
    # One float32 row of logits per step: as wide as the LM head (a separate decoder vocabulary can be narrower
    # than config.vocab_size).
    width = int(ref.model.get_output_embeddings().weight.shape[0])
    _check_room(scratch, sum(len(out) for rows in outputs.values() for out in rows) * width * 4)
    for search, _ in searches:
        for i, out in enumerate(outputs[search]):
            logits = ref.logits(ids[i], out[:-1])
            _check_room(scratch, logits.nbytes)  # and again per file: the disk may fill meanwhile
            np.save(scratch / f"{search}-{i}.npy", logits)
    del ref
    gc.collect()
    return _ReferenceRun(searches, outputs, ids, scratch)


# What validate leaves free on the scratch directory's disk while it stores the reference's logits.
SCRATCH_SPARE_BYTES = 1 << 30


def _check_room(scratch: Path, nbytes: int) -> None:
    """Refuse to store `nbytes` more of the reference's logits where that would leave less than
    SCRATCH_SPARE_BYTES free: they take steps x vocabulary x 4 bytes per sentence and search (NLLB-200: ~1 MB a
    step), so a large --input can fill a disk. Checked for all of them once the reference has generated, and again
    before each file."""
    free = shutil.disk_usage(scratch).free
    if free - nbytes < SCRATCH_SPARE_BYTES:
        used = sum(f.stat().st_size for f in scratch.iterdir())
        raise ValueError(
            f"validate stores the reference's logits in {scratch.parent} ({used / 2**20:,.0f} MB so far, "
            f"{nbytes / 2**20:,.1f} MB more to come) and keeps {SCRATCH_SPARE_BYTES / 2**20:,.0f} MB of that disk "
            f"free, which has {free / 2**20:,.0f} MB free; validate fewer sentences (--input) or fewer tokens "
            "(--max-new-tokens), or set TMPDIR to a larger disk"
        )


def _onnx_outputs(
    translator: Translator, texts: list[str], beams: int, options: ValidateOptions, advance: Callable[[int], None]
) -> list[list[int]]:
    """onnxmt's outputs, in batches of the same sentences as the reference's."""
    out: list[list[int]] = []
    size = options.batching.batch_size
    decoding = replace(translator.decoding, beams=beams, max_new_tokens=options.decoding.max_new_tokens)
    for first in range(0, len(texts), size):
        batch = texts[first : first + size]
        results = translator.translate(
            batch,
            source_lang=options.source_lang,
            target_lang=options.target_lang,
            options=decoding,
            batching=options.batching,
        )
        out += [r.token_ids for r in results]
        advance(len(batch))
    return out


def _compare_sentence(
    index: int,
    text: str,
    prompt: Prompt,
    ref: _ReferenceRun,
    onnx_out: dict[str, list[list[int]]],
    translator: Translator,
    report: ValidationReport,
) -> tuple[dict[str, Any], np.ndarray]:
    """One sentence: tokenizers, teacher-forced logits, first differences (added to `report`).
    Returns its JSON record and its absolute logit differences (steps, vocab)."""
    ids = ref.ids[index]
    same_ids = ids == translator.encode(text, prompt)
    report.tokenizer_identical += same_ids
    greedy = ref.outputs["greedy"][index]
    diff = np.abs(ref.logits("greedy", index) - _onnx_logits(translator, ids, greedy[:-1]))
    record: dict[str, Any] = {
        "index": index,
        "chars": len(text),
        "tokenizer_identical": same_ids,
        "max_abs_logit_diff": float(diff.max()),
    }
    for search, _ in ref.searches:
        ref_out, ours = ref.outputs[search][index], onnx_out[search][index]
        record.update({f"{search}_identical": ref_out == ours, f"{search}_reference": ref_out, f"{search}_onnx": ours})
        if ref_out != ours:
            report.divergences.append(_divergence(search, index, text, ids, ref, ours, translator))
    return record, diff


def _onnx_logits(translator: Translator, ids: list[int], tokens: list[int]) -> np.ndarray:
    """(len(tokens) + 1, vocab) logits from the ONNX graphs, as `_Reference.logits`: one cached step per token as
    the runtime runs, after the encoder (from the decoder start) or a decoder-only model's prefilled prompt."""
    graphs = translator.graphs
    if graphs.decoder_only:
        logits, cache = graphs.prefill([ids])  # type: ignore[attr-defined]
        rows = [logits[0]]
    else:
        source = np.array([ids], dtype=np.int64)
        cache = graphs.encode(source, np.ones_like(source))
        rows, tokens = [], [int(translator.manifest.tokens["decoder_start"]), *tokens]
    for token in tokens:
        logits, cache = graphs.step(np.array([[token]], dtype=np.int64), cache)
        rows.append(logits[0])
    return np.stack(rows)


def _divergence(
    search: str,
    index: int,
    text: str,
    ids: list[int],
    ref: _ReferenceRun,
    onnx_out: list[int],
    translator: Translator,
) -> Divergence:
    ref_out = ref.outputs[search][index]
    step = next(
        (
            t
            for t in range(max(len(ref_out), len(onnx_out)))
            if t >= len(ref_out) or t >= len(onnx_out) or ref_out[t] != onnx_out[t]
        ),
        0,
    )
    a = ref_out[step] if step < len(ref_out) else None
    b = onnx_out[step] if step < len(onnx_out) else None
    ref_margin = onnx_margin = step_diff = None
    if a is not None and b is not None:
        # The logits at this step, given the prefix both outputs share: the reference's from its teacher-forced run
        # on its own output (row `step` follows that prefix).
        ref_row = ref.logits(search, index)[step]
        onnx_row = _onnx_logits(translator, ids, ref_out[:step])[-1]
        ref_margin = float(ref_row[a] - ref_row[b])
        onnx_margin = float(onnx_row[a] - onnx_row[b])
        step_diff = float(np.abs(ref_row - onnx_row).max())

    def piece(t: int | None) -> str | None:
        return None if t is None else translator.tokenizer.decode([t]) or f"<{t}>"

    return Divergence(
        search=search,
        index=index,
        text=text,
        step=step,
        reference_token=a,
        onnx_token=b,
        reference_piece=piece(a),
        onnx_piece=piece(b),
        reference_margin=ref_margin,
        onnx_margin=onnx_margin,
        step_max_abs_logit_diff=step_diff,
    )


def _versions() -> dict[str, str]:
    """The installed versions, from the packages' metadata (without importing torch: benchmarks/validate_sides.py runs
    the ONNX side alone, torch-free); a module's `__version__` for a distribution named otherwise (onnxruntime-gpu)."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("onnxruntime", "torch", "transformers"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = str(getattr(sys.modules.get(name), "__version__", "unknown"))
    return found
