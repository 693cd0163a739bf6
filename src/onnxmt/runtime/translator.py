"""`Translator`: the library API on top of the tokenizer, the graphs and the decoding loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from ..architectures import LanguageScheme, Prompt, scheme_for
from ..manifest import Manifest, ModelDirError, verify_files
from .cancel import CancelToken
from .decoding import Settings, decode, resolve_settings
from .graphs import Graphs, open_graphs
from .modeldir import load_manifest
from .options import DecodeOptions, RuntimeOptions
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
    ) -> None:
        self.directory = Path(model_dir)
        sessions: dict[str, Any] = {}  # graphs opened to read an Optimum directory, reused to run it
        # Sizes are checked here; the sha256 of every file (300 MB in fp32: ~0.3 s) is computed on a thread while
        # ONNX Runtime builds the sessions, and a mismatch is raised before this constructor returns.
        self.manifest: Manifest = load_manifest(self.directory, verify=False, sessions=sessions, options=runtime)
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
        if decoding.target_lang is not None or decoding.source_lang is not None:
            self.prompt(decoding.source_lang, decoding.target_lang)  # fail at construction, not at the first request

    @property
    def target_languages(self) -> list[str]:
        return sorted(self.manifest.languages.get("target_tokens", {}))

    @property
    def source_languages(self) -> list[str]:
        return sorted(self.manifest.languages.get("source_tokens", {}))

    def target_token(self, target_lang: str | None) -> str | None:
        """The language token for `target_lang`: any code a client sends (`zh`, `zh-TW`, `cmn_Hant`, `>>cmn_Hant<<`,
        `zho_Hans`, see onnxmt.languages); ValueError naming the valid ones."""
        lang = self.scheme.resolve_target(target_lang)
        return None if lang is None else str(self.manifest.languages["target_tokens"][lang])

    def prompt(self, source_lang: str | None = None, target_lang: str | None = None) -> Prompt:
        """What the model's language scheme puts around a text for this language pair (architectures/schemes.py);
        ValueError naming the valid codes."""
        return self.scheme.prompt(source_lang, target_lang)

    def source_code(self, source_lang: str | None) -> str | None:
        """The model's own code for a client's source code (`en` -> `eng_Latn`), None if it names no source."""
        return self.scheme.languages.resolve_source(source_lang)

    def encode(self, text: str, prompt: Prompt) -> list[int]:
        """The source ids of `text` under `prompt`: the one path every caller (validate, eval, serve) encodes by."""
        return self.tokenizer.encode(prompt.text + text, prefix=prompt.prefix, suffix=prompt.suffix)

    def translate(
        self,
        texts: Sequence[str],
        *,
        source_lang: str | Sequence[str | None] | None = None,
        target_lang: str | Sequence[str | None] | None = None,
        cancel: CancelToken | Sequence[CancelToken] | None = None,
        on_batch: Callable[[int], None] | None = None,
        **overrides: Any,
    ) -> list[Translation]:
        """Translate `texts` (a list of strings); keyword arguments (beams, max_new_tokens, batch_size, ...)
        override this translator's DecodeOptions for this call. Empty texts give empty translations; the order of
        the input is kept.

        `source_lang`, `target_lang`: one code for all texts, or one per text (a batch may mix them; models told
        the source language by a token, as NLLB and M2M100, use it, others check it). None: the translator's
        DecodeOptions, then the model's defaults.

        `cancel`: one token for all texts, or one per text. Once a text's token is set, the text leaves its decoder
        batch at the next step (or is never started) and comes back with `cancelled=True`. `on_batch(n)` is called
        with the size of each decoder batch as it starts (the service's batch metrics)."""
        _check_texts(texts)
        options = self.decoding.merged(**overrides)
        prompts = self._prompts(len(texts), options, source_lang, target_lang)
        return self._translate_list(list(texts), options, _tokens(cancel, len(texts)), prompts, on_batch)

    def cost(self, texts: Sequence[str], **overrides: Any) -> int:
        """What translating `texts` may cost, in tokens x beams: the sum over texts of (source tokens + most new
        tokens) x beams. Decoder memory grows with it (the attention caches); the service budgets by it."""
        _check_texts(texts)
        options = self.decoding.merged(**overrides)
        settings = resolve_settings(self.manifest, options)
        prompt = self.prompt(options.source_lang, options.target_lang)
        return sum(text_cost(len(self.encode(t, prompt)), settings) for t in texts if t.strip())

    def _prompts(
        self,
        n: int,
        options: DecodeOptions,
        source_lang: str | Sequence[str | None] | None,
        target_lang: str | Sequence[str | None] | None,
    ) -> list[Prompt]:
        """One prompt per text; a pair of codes is resolved once however many texts share it."""
        sources = _per_text(source_lang, n, "source_lang", options.source_lang)
        targets = _per_text(target_lang, n, "target_lang", options.target_lang)
        resolved: dict[tuple[str | None, str | None], Prompt] = {}
        for pair in zip(sources, targets, strict=True):
            if pair not in resolved:
                resolved[pair] = self.prompt(*pair)
        return [resolved[pair] for pair in zip(sources, targets, strict=True)]

    def translate_iter(self, texts: Iterable[str], **overrides: Any) -> Iterator[Translation]:
        """Streaming variant: reads `texts` lazily, yields translations in input order."""
        options = self.decoding.merged(**overrides)
        iterator = iter(texts)
        window = max(1, options.batch_size) * STREAM_WINDOW_BATCHES
        while chunk := list(islice(iterator, window)):
            _check_texts(chunk)
            yield from self._translate_list(chunk, options, None, self._prompts(len(chunk), options, None, None))

    def translate_stream(self, text: str, **overrides: Any) -> Iterator[str]:
        """One text (a sentence or a whole document) translated as a stream of pieces of text: token by token with
        greedy search, sentence by sentence with beam search. The pieces join to what
        `onnxmt.documents.translate_document` returns (sentences split, whitespace and line breaks kept)."""
        from ..documents.stream import stream_document

        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        return stream_document(self, text, **overrides)

    def _translate_list(
        self,
        texts: list[str],
        options: DecodeOptions,
        tokens: list[CancelToken | None] | None,
        prompts: list[Prompt],
        on_batch: Callable[[int], None] | None = None,
    ) -> list[Translation]:
        if options.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {options.batch_size}")
        settings = resolve_settings(self.manifest, options)
        tokens = tokens or [None] * len(texts)
        results: list[Translation | None] = [None] * len(texts)
        encoded = {i: self.encode(t, prompts[i]) for i, t in enumerate(texts) if t.strip()}
        for i, text in enumerate(texts):
            if not text.strip():
                results[i] = Translation(text="", token_ids=[], score=0.0)
        # Sorting by length keeps padding, and so wasted work, small.
        order = sorted(encoded, key=lambda i: len(encoded[i]))
        for batch in _batches(order, [text_cost(len(encoded[i]), settings) for i in order], options):
            # Texts cancelled before their batch starts are never encoded.
            for i in [i for i in batch if _is_cancelled(tokens[i])]:
                results[i] = Translation(text="", token_ids=[], score=0.0, cancelled=True)
            batch = [i for i in batch if results[i] is None]
            if batch:
                if on_batch is not None:
                    on_batch(len(batch))
                ids, batch_tokens = [encoded[i] for i in batch], [tokens[i] for i in batch]
                forced = [prompts[i].forced_bos for i in batch]
                for i, hyps in zip(batch, self._decode_batch(ids, settings, batch_tokens, forced), strict=True):
                    results[i] = hyps
        return [r for r in results if r is not None]

    def _decode_batch(
        self,
        ids: list[list[int]],
        settings: Settings,
        tokens: list[CancelToken | None],
        forced: Sequence[int | None] = (),
    ) -> list[Translation]:
        input_ids, mask = pad_batch(ids, self.manifest.tokens["pad"])
        cancelled = None
        if any(t is not None for t in tokens):
            cancelled = lambda: np.array([_is_cancelled(t) for t in tokens])  # noqa: E731
        forced_bos = _forced_bos(forced, settings)
        out = []
        for hyps in decode(self.graphs, input_ids, mask, settings, cancelled, forced_bos=forced_bos):
            first, *rest = (Translation(self.tokenizer.decode(h.tokens), h.tokens, h.score) for h in hyps)
            out.append(Translation(first.text, first.token_ids, first.score, tuple(rest), hyps[0].cancelled))
        return out


def _per_text(value: str | Sequence[str | None] | None, n: int, name: str, default: str | None) -> list[str | None]:
    if value is None or isinstance(value, str):
        return [default if value is None else value] * n
    if len(value) != n:
        raise ValueError(f"{name} holds {len(value)} codes for {n} texts; give one code, or one per text")
    return [default if v is None else v for v in value]


def _forced_bos(forced: Sequence[int | None], settings: Settings) -> np.ndarray | None:
    """The rows' forced first tokens for `decode`, or None when no prompt forces one (the model's own
    forced_bos_token_id, if any, then applies to all rows)."""
    if all(f is None for f in forced):
        return None
    fallback = settings.forced_bos
    if any(f is None for f in forced) and fallback is None:
        raise ValueError("a batch cannot mix texts with and without a forced first token")
    return np.array([fallback if f is None else f for f in forced], dtype=np.int64)


def _tokens(cancel: CancelToken | Sequence[CancelToken] | None, n: int) -> list[CancelToken | None] | None:
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


def _batches(order: list[int], costs: list[int], options: DecodeOptions) -> Iterator[list[int]]:
    """`order` cut into decoder batches of at most `batch_size` texts and `max_batch_cost` tokens x beams (a text
    above the budget alone gets a batch of its own)."""
    batch: list[int] = []
    total = 0
    budget = options.max_batch_cost
    for i, cost in zip(order, costs, strict=True):
        if batch and (len(batch) == options.batch_size or (budget is not None and total + cost > budget)):
            yield batch
            batch, total = [], 0
        batch.append(i)
        total += cost
    if batch:
        yield batch


def pad_batch(ids: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists as one right-padded (rows, longest) batch and its attention mask (1 for real tokens)."""
    width = max(len(x) for x in ids)
    input_ids = np.full((len(ids), width), pad, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for row, x in enumerate(ids):
        input_ids[row, : len(x)] = x
        mask[row, : len(x)] = 1
    return input_ids, mask


def _check_texts(texts: object) -> None:
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a list of strings, not a single string; for one text use translate([text])")
    if not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a list of strings, got {type(texts).__name__}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, expected str")
