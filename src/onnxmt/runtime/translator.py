"""`Translator`: the library API on top of the tokenizer, the graphs and the decoding loop."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..architectures import LanguageScheme, Prompt, scheme_for
from ..architectures.decoder_only import check_request, glossary_pairs
from ..manifest import Manifest, ModelDirError, read_manifest, verify_files
from ..tokenization.base import check_unicode
from .cache import Cache
from .cancel import CancelToken
from .capabilities import Capabilities
from .decoder_only import DecoderOnlyGraphs, Prompts, check_prompt_lengths
from .graphs import Graphs, OnnxmtGraphs, OptimumGraphs
from .modeldir import load_manifest
from .options import BatchLimits, CallOptions, DecodeOptions, Glossary, RuntimeOptions, call_options, decode_options
from .running import RunningBatch, decode, encode_texts, pad_batch
from .scheduler import Request, Scheduler
from .search import Hypothesis, Settings, forced_bos_rows, resolve_settings
from .tokenizer import load_tokenizer

# How many texts the streaming variant reads ahead: enough to sort into full batches of similar length.
STREAM_WINDOW_BATCHES = 8


@dataclass(frozen=True)
class Translation:
    """One translated text. `alternatives` holds hypotheses 2..n when num_return_sequences > 1. `cancelled`: its
    `CancelToken` was set before it finished, and the text is what was generated until then (maybe nothing)."""

    text: str
    token_ids: list[int]
    score: float
    alternatives: tuple[Translation, ...] = field(default=())
    cancelled: bool = False


@dataclass(frozen=True)
class Prepared:
    """A text made ready for the decoder, once (`Translator.prepare`): its source ids under its language pair's
    prompt (none for a text with nothing to translate), the prompt (its forced first token among it) and the
    resolved decoding settings. Hashable: the service's cache keys on it."""

    text: str
    ids: tuple[int, ...]
    prompt: Prompt
    settings: Settings

    @property
    def cost(self) -> int:
        """What translating it may cost, in tokens x beams (see `Translator.cost`)."""
        return text_cost(len(self.ids), self.settings) if self.ids else 0


@dataclass(frozen=True)
class ModelInput:
    """What the model is given for a text (`Translator.model_input`): the text its tokenizer reads (a decoder-only
    model's whole rendered prompt), the ids, and the token forced first in the output (None: none)."""

    text: str
    ids: tuple[int, ...]
    forced_bos: int | None


@dataclass(frozen=True)
class Event:
    """One thing `Translator.generate` tells about the text at `index`: a new token (`token`), or its translation,
    done (`translation`)."""

    index: int
    token: int | None
    translation: Translation | None


class Translator:
    """Translate with an exported model directory (onnxmt's or Optimum's), on ONNX Runtime, without torch.

    >>> translator = Translator("opus-mt-en-zh-onnx")           # doctest: +SKIP
    >>> translator.translate(["Hello world"])[0].text            # doctest: +SKIP
    """

    def __init__(
        self,
        model_dir: str | Path,
        runtime: RuntimeOptions = RuntimeOptions(),
        decoding: DecodeOptions = DecodeOptions(),
        batching: BatchLimits = BatchLimits(),
    ) -> None:
        self.directory = self.model_dir(model_dir)
        sessions: dict[str, Any] = {}  # graphs opened to read an Optimum directory, reused to run it
        # Sizes are checked here; the sha256 of every file (300 MB in fp32: ~0.3 s) is computed on a thread while
        # ONNX Runtime builds the sessions, and a mismatch is raised before this constructor returns.
        try:
            self.manifest: Manifest = load_manifest(self.directory, verify=False, sessions=sessions, options=runtime)
        except ModelDirError:
            if runtime.verify:
                _corrupted_file(self.directory)  # a corrupted file explains the failure better than what it broke
            raise
        with ThreadPoolExecutor(max_workers=1) as pool:
            hashes = pool.submit(verify_files, self.directory, self.manifest) if runtime.verify else None
            try:
                self.tokenizer = load_tokenizer(self.directory, self.manifest.tokenizer.get("kind"))
                # Truncate at the model's positions even where the tokenizer's own limit is larger: opus-mt's
                # tokenizer_config.json names no length, so MarianTokenizer's 512 applies, past a smaller model's
                # position table.
                self.tokenizer.model_max_length = min(
                    self.tokenizer.model_max_length, int(self.manifest.model["max_positions"])
                )
                try:
                    self.scheme: LanguageScheme = scheme_for(self.manifest.languages, self.tokenizer.token_id)
                except KeyError as e:
                    raise ModelDirError(f"{self.directory}: language token {e} is not in the tokenizer") from e
                self.graphs: Graphs = open_graphs(self.directory, self.manifest, runtime, sessions)
            except Exception:
                if hashes is not None:
                    hashes.result()  # a corrupted file explains the failure better than what it broke
                raise
            if hashes is not None:
                hashes.result()
        self.runtime = runtime
        self.decoding = decoding
        self.batching = batching
        self.capabilities = Capabilities.of(self.manifest)
        self.chat: Prompts | None = None  # a decoder-only model's prompts: its chat template around the request
        if self.graphs.decoder_only:
            self.chat = Prompts(self.directory, self.manifest, self.tokenizer)

    @staticmethod
    def model_dir(given: str | Path) -> Path:
        """The directory `given` names: here a path (onnxmt.Translator, models.py, also takes a hub id)."""
        return Path(given)

    @property
    def target_languages(self) -> list[str]:
        """The target codes a text may be given (none: the model has one target)."""
        return self.scheme.languages.named or sorted(self.manifest.languages.get("target_tokens", {}))

    @property
    def source_languages(self) -> list[str]:
        """The source codes a text may be given (none: the model has one source, or is not told it)."""
        return self.scheme.languages.named or sorted(self.manifest.languages.get("source_tokens", {}))

    def target_token(self, target_lang: str | None) -> str | None:
        """The language token for `target_lang`: any code a client sends (`zh`, `zh-TW`, `cmn_Hant`, `>>cmn_Hant<<`,
        `zho_Hans`, see onnxmt.languages); ValueError naming the valid ones."""
        lang = self.scheme.resolve_target(target_lang)
        return None if lang is None else str(self.manifest.languages["target_tokens"][lang])

    def prompt(
        self,
        source_lang: str | None = None,
        target_lang: str | None = None,
        *,
        glossary: Glossary = (),
        context: str | None = None,
    ) -> Prompt:
        """What the model's language scheme puts around a text for this language pair (architectures/schemes.py);
        a `glossary` ((source term, target term) pairs, or a {source: target} mapping) or a `context` (text the
        translation should agree with, not translated) for a family with prompts for them (HY-MT). ValueError
        naming the valid codes, or saying that the model has no such prompt."""
        prompt = self.scheme.prompt(source_lang, target_lang)
        pairs = glossary_pairs(glossary)
        if context is not None and not isinstance(context, str):
            raise ValueError(f"context must be a string, got {type(context).__name__}")
        context = context if context and context.strip() else None
        if not pairs and context is None:
            return prompt
        family = self.manifest.languages.get("prompt") if prompt.chat is not None else None
        check_request(family or f"{self.manifest.architecture}: no chat template", pairs, context)
        return replace(prompt, glossary=pairs, context=context)

    def model_input(
        self,
        text: str,
        *,
        source_lang: str | None = None,
        target_lang: str | None = None,
        glossary: Glossary = (),
        context: str | None = None,
    ) -> ModelInput:
        """What the model is given for `text` (arguments as `translate`'s): a decoder-only model's whole prompt,
        its chat template rendered around the request, and its ids; an encoder-decoder's source text with its
        language prefix, its ids with the language tokens, and the token forced first in the output."""
        prompt = self.prompt(source_lang, target_lang, glossary=glossary, context=context)
        if prompt.chat is not None:
            assert self.chat is not None
            rendered = self.chat.render(text, prompt)
            return ModelInput(rendered, tuple(self.tokenizer.prompt_ids(rendered)), None)
        return ModelInput(prompt.text + text, tuple(self.encode(text, prompt)), prompt.forced_bos)

    def source_code(self, source_lang: str | None) -> str | None:
        """The model's own code for a client's source code (`en` -> `eng_Latn`), None if it names no source."""
        return self.scheme.languages.resolve_source(source_lang)

    def encode(self, text: str, prompt: Prompt) -> list[int]:
        """The source ids of `text` under `prompt`: the one path every caller (validate, eval, serve) encodes by.
        A decoder-only model's are its whole prompt: the chat template rendered around the request."""
        if prompt.chat is not None:
            assert self.chat is not None
            return self.chat.encode(text, prompt)
        return self.tokenizer.encode(prompt.text + text, prefix=prompt.prefix, suffix=prompt.suffix)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of generated ids, special tokens skipped (what `Translation.text` holds)."""
        return str(self.tokenizer.decode(token_ids))

    def prepare(
        self,
        texts: Sequence[str],
        call: CallOptions | None = None,
        *,
        ids: Sequence[Sequence[int] | None] | None = None,
        **keywords: Any,
    ) -> list[Prepared]:
        """`texts` made ready for the decoder, each once: checked, its language pair resolved, tokenized, its
        settings and cost known. What `translate` does first; the service prepares a request once and carries
        the result through its cost check, cache and batcher. `call`: the language pair, glossary, context and
        decoding options (default: none, and this translator's options); keyword arguments (a field of
        `CallOptions` or of `DecodeOptions`, as `translate`'s) over them. `ids`: each text's source ids under its
        prompt where the caller already has them (a document's sentences, counted when it was cut), which are then
        not tokenized again. ValueError naming the valid choices for a bad option or language."""
        _check_texts(texts)
        call, overrides = (call or CallOptions()).over(keywords)
        settings = resolve_settings(self.manifest, decode_options(call.options or self.decoding, overrides))
        prompts = self.prompts(len(texts), call)
        if ids is not None and len(ids) != len(texts):
            raise ValueError(f"ids holds {len(ids)} lists for {len(texts)} texts")
        prepared = []
        seen: dict[tuple[str, Prompt], tuple[int, ...]] = {}  # a text sent twice is tokenized once
        for i, (text, prompt) in enumerate(zip(texts, prompts, strict=True)):
            given = None if ids is None else ids[i]
            if not text.strip():
                source: tuple[int, ...] = ()
            elif given is not None:
                source = tuple(given)
            elif (text, prompt) in seen:
                source = seen[text, prompt]
            else:
                source = seen[text, prompt] = tuple(self.encode(text, prompt))
            prepared.append(Prepared(text, source, prompt, settings))
        if self.chat is not None:
            check_prompt_lengths(texts, [p.ids for p in prepared], self.tokenizer.model_max_length)
        return prepared

    def translate(
        self,
        texts: Sequence[str],
        *,
        source_lang: str | Sequence[str | None] | None = None,
        target_lang: str | Sequence[str | None] | None = None,
        glossary: Glossary = (),
        context: str | None = None,
        cancel: CancelToken | Sequence[CancelToken] | None = None,
        on_batch: Callable[[int], None] | None = None,
        options: DecodeOptions | None = None,
        batching: BatchLimits | None = None,
        **overrides: Any,
    ) -> list[Translation]:
        """Translate `texts` (a list of strings). Empty texts give empty translations; the order of the input is
        kept.

        `options`, `batching`: this call's decoding options and batch limits (default: this translator's); keyword
        arguments, any field of DecodeOptions and `batch_size`, `max_batch_cost`, override them for this call
        (`translate(texts, beams=4)`); TypeError for another name.

        `source_lang`, `target_lang`: one code for all texts, or one per text (a batch may mix them; models told
        the source language by a token, as NLLB and M2M100, use it, others check it). None: the model's defaults.

        `glossary`: (source term, target term) pairs, or a {source: target} mapping; `context`: text the
        translations should agree with (not itself translated). For a family with prompts for them (HY-MT's
        terminology and context prompts; each text's prompt holds the terms that occur in it); ValueError for
        another model (see `model_input` for the exact prompt).

        `cancel`: one token for all texts, or one per text. Once a text's token is set, the text leaves its decoder
        batch at the next step (or is never started) and comes back with `cancelled=True`. `on_batch(n)` is called
        with the size of each decoder batch as it starts (the service's batch metrics)."""
        given = CallOptions(source_lang, target_lang, glossary, context, options)
        call, batching = self.call_options(overrides, given, batching)
        return self.translate_prepared(self.prepare(texts, call), cancel=cancel, on_batch=on_batch, batching=batching)

    def call_options(
        self,
        keywords: Mapping[str, Any],
        call: CallOptions | None = None,
        batching: BatchLimits | None = None,
    ) -> tuple[CallOptions, BatchLimits]:
        """A call's options and batch limits, typed: `call` (default: none) and `batching` (default: this
        translator's) with the call's keyword arguments (`target_lang="de"`, `beams=4`, `batch_size=8`) over them,
        its decoding options resolved (default: this translator's); TypeError for an unknown name."""
        call, overrides = (call or CallOptions()).over(keywords)
        options, batching = call_options(call.options or self.decoding, batching or self.batching, overrides)
        return replace(call, options=options), batching

    def translate_prepared(
        self,
        prepared: Sequence[Prepared],
        *,
        cancel: CancelToken | Sequence[CancelToken | None] | None = None,
        on_batch: Callable[[int], None] | None = None,
        batching: BatchLimits | None = None,
    ) -> list[Translation]:
        """The translations of texts `prepare` made ready, in their order; arguments as `generate`'s."""
        results: list[Translation | None] = [None] * len(prepared)
        for event in self.generate(prepared, cancel=cancel, on_batch=on_batch, batching=batching):
            if event.translation is not None:
                results[event.index] = event.translation
        return [r for r in results if r is not None]

    def cost(self, texts: Sequence[str], call: CallOptions | None = None, **keywords: Any) -> int:
        """What translating `texts` may cost, in tokens x beams: the sum over texts of (source tokens + most new
        tokens) x beams. Decoder memory grows with it (the attention caches); the service budgets by it. Options
        as `prepare`'s."""
        return sum(p.cost for p in self.prepare(texts, call, **keywords))

    def prompts(self, n: int, call: CallOptions) -> list[Prompt]:
        """The prompts of `n` texts under `call` (`prompt` for each text's language pair); a pair of codes is
        resolved once however many texts share it."""
        sources = _per_text(call.source_lang, n, "source_lang")
        targets = _per_text(call.target_lang, n, "target_lang")
        resolved: dict[tuple[str | None, str | None], Prompt] = {}
        for pair in zip(sources, targets, strict=True):
            if pair not in resolved:
                resolved[pair] = self.prompt(*pair, glossary=call.glossary, context=call.context)
        return [resolved[pair] for pair in zip(sources, targets, strict=True)]

    def translate_iter(
        self,
        texts: Iterable[str],
        call: CallOptions | None = None,
        *,
        batching: BatchLimits | None = None,
        **keywords: Any,
    ) -> Iterator[Translation]:
        """Streaming variant: reads `texts` lazily, yields translations in input order. `call` and keyword
        arguments as `prepare`'s, `batching` and batch limits by keyword as `translate`'s."""
        call, batching = self.call_options(keywords, call, batching)
        iterator = iter(texts)
        while chunk := list(islice(iterator, batching.batch_size * STREAM_WINDOW_BATCHES)):
            yield from self.translate_prepared(self.prepare(chunk, call), batching=batching)

    def generate(
        self,
        prepared: Sequence[Prepared],
        *,
        cancel: CancelToken | Sequence[CancelToken | None] | None = None,
        on_batch: Callable[[int], None] | None = None,
        batching: BatchLimits | None = None,
        in_order: bool = False,
    ) -> Generator[Event, None, None]:
        """The decoding of prepared texts, step by step: an `Event` with each new token of a text (greedy search;
        beam search knows its best hypothesis only at the end) and one with its `Translation` when it is done.
        Texts run in decoder batches within `batching` (default: this translator's), sorted by length so that
        padding stays small, or, `in_order`, of consecutive texts with the first alone, so that the first text
        comes soonest (streams). A decoder-only
        model's texts run in running batches that the scheduler fills (its rows start at their prompts' lengths).
        Encoder-decoders keep sorted fixed batches offline: one running batch refilled as texts finish measured
        0.82-1.04x their speed (docs/benchmarks.md). Closing the iterator stops the batch running at its next
        step."""
        tokens = _tokens(cancel, len(prepared)) or [None] * len(prepared)
        todo = []
        for i, item in enumerate(prepared):
            if not item.ids:
                yield Event(i, None, Translation(text="", token_ids=[], score=0.0))
            else:
                todo.append(i)
        batching = batching or self.batching
        if self.graphs.decoder_only:
            yield from self._running(prepared, todo, tokens, batching)
            return
        for batch in _batches(prepared, todo, batching, in_order=in_order):
            # Texts cancelled before their batch starts are never encoded.
            for i in [i for i in batch if _is_cancelled(tokens[i])]:
                yield Event(i, None, Translation(text="", token_ids=[], score=0.0, cancelled=True))
            batch = [i for i in batch if not _is_cancelled(tokens[i])]
            if batch:
                if on_batch is not None:
                    on_batch(len(batch))
                yield from self._decode_batch([prepared[i] for i in batch], batch, [tokens[i] for i in batch])

    def _running(
        self,
        prepared: Sequence[Prepared],
        todo: list[int],
        tokens: list[CancelToken | None],
        batching: BatchLimits,
    ) -> Iterator[Event]:
        """`generate`'s events from running batches (one per beam width) that the scheduler fills: the texts by
        length, each joining as soon as a place is free within the limits; encoded a batch ahead, in one call."""
        order = sorted(todo, key=lambda i: len(prepared[i].ids))
        position = {i: text for text, i in enumerate(order)}  # each text's place in the scheduler's request
        request = Request([prepared[i].cost for i in order], 0.0, preemptible=False)
        scheduler = Scheduler(batching)
        scheduler.add(request)
        batches: dict[int, RunningBatch] = {}
        caches: dict[int, Cache] = {}
        pad = self.manifest.tokens["pad"]
        while request.left:
            admitted = []
            for _, text in scheduler.schedule(0.0).admit:
                i = order[text]
                if _is_cancelled(tokens[i]):
                    scheduler.finished(request, text)
                    yield Event(i, None, Translation(text="", token_ids=[], score=0.0, cancelled=True))
                else:
                    admitted.append(i)
            if any(i not in caches for i in admitted):  # with the next texts, up to a batch: one encoder call
                ahead = [order[t] for t in itertools.islice(request.waiting, batching.batch_size)]
                group = [i for i in dict.fromkeys(admitted + ahead) if i not in caches]
                caches.update(zip(group, encode_texts(self.graphs, pad, [prepared[i].ids for i in group]), strict=True))
            for settings, group in _by_settings(prepared, admitted).items():
                batch = batches.setdefault(settings.num_beams, RunningBatch(self.graphs, settings.num_beams, pad))
                polled = [tokens[i] for i in group]
                batch.admit(
                    [prepared[i].ids for i in group],
                    settings,
                    group,
                    [prepared[i].prompt.forced_bos for i in group],
                    lambda polled=polled: np.array([_is_cancelled(t) for t in polled]),  # type: ignore[misc]
                    encoded=[caches.pop(i) for i in group],
                )
            widths = [beams for beams, batch in batches.items() if batch.rows]
            if not widths:
                continue
            width = scheduler.next_width(widths)
            started = time.perf_counter()
            step = batches[width].step()
            scheduler.stepped(width, time.perf_counter() - started, 1)
            for key, token in step.tokens:
                yield Event(cast(int, key), token, None)
            for key, hyps in step.finished:
                scheduler.finished(request, position[cast(int, key)])
                yield Event(cast(int, key), None, self.translation(hyps))

    def _decode_batch(
        self, batch: list[Prepared], indices: list[int], tokens: list[CancelToken | None]
    ) -> Iterator[Event]:
        settings = batch[0].settings
        input_ids, mask = pad_batch([p.ids for p in batch], self.manifest.tokens["pad"])
        cancelled = None
        if any(t is not None for t in tokens):
            cancelled = lambda: np.array([_is_cancelled(t) for t in tokens])  # noqa: E731
        forced_bos = forced_bos_rows([p.prompt.forced_bos for p in batch], settings)
        steps = decode(self.graphs, input_ids, mask, settings, cancelled, forced_bos=forced_bos)
        try:
            while True:
                step = next(steps)
                for row, token in step.tokens:
                    yield Event(indices[cast(int, row)], token, None)
        except StopIteration as done:
            hypotheses: list[list[Hypothesis]] = done.value
        finally:
            steps.close()  # the consumer has gone: the batch stops here
        for i, hyps in zip(indices, hypotheses, strict=True):
            yield Event(i, None, self.translation(hyps))

    def translation(self, hypotheses: Sequence[Hypothesis]) -> Translation:
        """A text's hypotheses from the decoding loop as a `Translation`: the best, the others its alternatives."""
        first, *rest = (Translation(self.detokenize(h.tokens), h.tokens, h.score) for h in hypotheses)
        return Translation(first.text, first.token_ids, first.score, tuple(rest), hypotheses[0].cancelled)


def _corrupted_file(directory: Path) -> None:
    """ModelDirError naming a file whose sha256 is not its manifest's, if one is (and the manifest reads)."""
    try:
        manifest = read_manifest(directory)
    except Exception:
        return
    verify_files(directory, manifest)


def _per_text(value: str | Sequence[str | None] | None, n: int, name: str) -> list[str | None]:
    if value is None or isinstance(value, str):
        return [value] * n
    if len(value) != n:
        raise ValueError(f"{name} holds {len(value)} codes for {n} texts; give one code, or one per text")
    return list(value)


def _tokens(cancel: CancelToken | Sequence[CancelToken | None] | None, n: int) -> list[CancelToken | None] | None:
    if cancel is None or isinstance(cancel, CancelToken):
        return None if cancel is None else [cancel] * n
    if len(cancel) != n:
        raise ValueError(f"cancel holds {len(cancel)} tokens for {n} texts; give one token, or one per text")
    return list(cancel)


def _is_cancelled(token: CancelToken | None) -> bool:
    return token is not None and token.cancelled


def text_cost(source_tokens: int, settings: Settings) -> int:
    """What a text of `source_tokens` may cost to translate, in tokens x beams (see `Translator.cost`)."""
    return (source_tokens + settings.max_length - 1) * settings.num_beams


def _batches(
    prepared: Sequence[Prepared], todo: list[int], batching: BatchLimits, *, in_order: bool
) -> Iterator[list[int]]:
    """The texts `todo` cut into decoder batches of one setting within `batching` (a text above its cost budget
    alone gets a batch of its own): sorted by length, or `in_order` (the first text alone)."""
    if not in_order:
        # Sorting by length keeps padding, and so wasted work, small; texts of one setting together.
        rank = {s: r for r, s in enumerate(dict.fromkeys(prepared[i].settings for i in todo))}
        todo = sorted(todo, key=lambda i: (rank[prepared[i].settings], len(prepared[i].ids)))
    batch: list[int] = []
    total = 0
    for i in todo:
        cost = prepared[i].cost
        full = len(batch) == batching.batch_size or (in_order and len(batch) == 1 and batch[0] == todo[0])
        over = batching.max_batch_cost is not None and total + cost > batching.max_batch_cost
        if batch and (full or over or prepared[batch[0]].settings != prepared[i].settings):
            yield batch
            batch, total = [], 0
        batch.append(i)
        total += cost
    if batch:
        yield batch


def _by_settings(prepared: Sequence[Prepared], texts: list[int]) -> dict[Settings, list[int]]:
    groups: dict[Settings, list[int]] = {}
    for i in texts:
        groups.setdefault(prepared[i].settings, []).append(i)
    return groups


def _check_texts(texts: object) -> None:
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a list of strings, not a single string; for one text use translate([text])")
    if not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a list of strings, got {type(texts).__name__}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, expected str")
    check_unicode(texts)


def open_graphs(
    directory: Path, manifest: Manifest, options: RuntimeOptions, sessions: dict[str, Any] | None = None
) -> Graphs:
    """The graphs of a model directory; `sessions` are ones `load_manifest` already opened with these options."""
    if manifest.model.get("decoder_only"):
        return DecoderOnlyGraphs(directory, manifest, options, (sessions or {}).get("decoder"))
    if manifest.layout == "onnxmt":
        return OnnxmtGraphs(directory, manifest, options)
    return OptimumGraphs(directory, manifest, options, sessions)
