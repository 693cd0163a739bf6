"""How the service opens its models: the entries of the directories it is given (read by their manifests, without
loading them), and for each model its checks, its runtime options, its load and its batcher (what the model pool
calls back)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from ..manifest import MANIFEST_NAME, Manifest, read_manifest
from ..models import is_model_dir, model_dirs_in
from ..runtime.cancel import CancelToken
from ..runtime.capabilities import Capabilities
from ..runtime.modeldir import check_model_dir, load_manifest
from ..runtime.options import BatchLimits, DecodeOptions, RuntimeOptions
from ..runtime.sessions import release_memory
from ..runtime.translator import Prepared, Translation, Translator
from .batcher import Batcher, MicroBatcher
from .costs import cost_limits
from .inflight import InflightBatcher
from .metrics import Metrics
from .options import ServeOptions
from .pool import ModelEntry, model_bytes
from .protocol import Languages

log = logging.getLogger("onnxmt.serve")


@dataclass(frozen=True)
class Loader:
    """Opens the models of one service, with its options, on its inference thread (`executor`)."""

    options: ServeOptions
    runtime: RuntimeOptions
    decoding: DecodeOptions
    batching: BatchLimits
    executor: ThreadPoolExecutor
    metrics: Metrics

    def read_entries(self, model_dirs: list[Path]) -> list[ModelEntry]:
        """Every model directory given (directories of model directories opened), by its manifest: what it
        translates, without loading it."""
        dirs = [d for given in model_dirs for d in model_dirs_in(given)]
        names = unique_names(dirs)
        options = self.manifest_options()
        return [
            model_entry(d, name, load_manifest(d, verify=False, options=options))
            for d, name in zip(dirs, names, strict=True)
        ]

    def translator(self, directory: Path) -> Translator:
        """A model opened at once, its checks with it (the only model of a service)."""
        return Translator(directory, self.runtime_for(directory), self.decoding, self.batching)

    def check(self, entry: ModelEntry) -> None:
        """Runs on a thread of its own before a load: the directory's checks, its files' sha256 included, which
        `load` then skips (on the inference thread every model shares, a 1 GB file's would stall them ~1 s)."""
        check_model_dir(entry.directory, verify=self.runtime.verify, options=self.manifest_options())

    def load(self, entry: ModelEntry) -> Translator:
        """Runs on the inference thread, after `check`."""
        runtime = replace(self.runtime_for(entry.directory, entry.manifest), verify=False)
        return Translator(entry.directory, runtime, self.decoding, self.batching)

    def manifest_options(self) -> RuntimeOptions:
        """What a manifest is read with: an Optimum directory's graphs are opened to read it, on one thread."""
        return RuntimeOptions(threads=1, variant=self.runtime.variant)

    def runtime_for(self, directory: Path, manifest: Manifest | None = None) -> RuntimeOptions:
        """The runtime options a model is opened with. A model batched in flight has its waiting requests encoded
        while the decoder steps, on the encoder thread (serve/inflight.py): unless `--encoder-threads` says
        otherwise, its encoder runs on half of the threads (at least 1), so that the two together do not
        oversubscribe the cores. Models with static batches encode between steps, on all of them."""
        runtime = self.runtime
        if runtime.encoder_threads is not None:
            return runtime
        if manifest is None:
            if not (directory / MANIFEST_NAME).is_file():
                return runtime  # Optimum's and Transformers.js's directories run static batches
            manifest = read_manifest(directory)
        if not Capabilities.of(manifest).in_flight:
            return runtime
        return replace(runtime, encoder_threads=max(1, (runtime.threads or os.cpu_count() or 1) // 2))

    def make_batcher(self, entry: ModelEntry) -> Batcher:
        """In-flight batching for a decoder that takes one cache length per row; static micro-batches otherwise
        (directories exported before format 4, Optimum's)."""
        assert entry.translator is not None
        o = self.options
        on_queue = self.metrics.queue_depth.labels(entry.name).set
        on_idle = partial(release_memory, entry.translator.directory)
        limits = BatchLimits(
            o.max_batch_size, cost_limits(entry.manifest, o).batch, o.max_skip_ms / 1000, o.reserved_texts
        )
        if entry.translator.capabilities.in_flight:
            return InflightBatcher(
                entry.translator,
                self.executor,
                limits=limits,
                max_queue=o.max_queue,
                on_queue=on_queue,
                on_step=partial(self.metrics.observe_step, entry.name),
                on_idle=on_idle,
            )
        log.info(
            "model %s: static batches (its decoder takes one cache length for all rows; `onnxmt export` it again "
            "for in-flight batching)",
            entry.name,
        )
        return MicroBatcher(
            partial(_translate, entry),
            self.executor,
            limits=limits,
            window=o.batch_window_ms / 1000,
            max_queue=o.max_queue,
            on_queue=on_queue,
            on_batch=partial(self.metrics.observe_batch, entry.name),
            on_running=partial(self.metrics.observe_running, entry.name),
            on_idle=on_idle,
        )


def holds_models(path: Path) -> bool:
    """A directory of model directories rather than one."""
    return path.is_dir() and not is_model_dir(path)


def model_entry(directory: Path, name: str, manifest: Manifest) -> ModelEntry:
    """The entry of a model directory, by its manifest."""
    return ModelEntry(name, directory, manifest, Languages(manifest), model_bytes(directory, manifest))


def unique_names(dirs: list[Path]) -> list[str]:
    """Each directory's name; where two are the same, with as many parent parts as tell them apart."""
    names = [d.name for d in dirs]
    for depth in range(2, 8):
        clashes = {n for n in names if names.count(n) > 1}
        if not clashes:
            break
        names = ["/".join(d.parts[-depth:]) if n in clashes else n for d, n in zip(dirs, names, strict=True)]
    for i, name in enumerate(names):  # the same path given twice
        if names.count(name) > 1:
            names[i] = f"{name}#{names[:i].count(name) + 1}"
    return names


def _translate(
    entry: ModelEntry, prepared: list[Prepared], tokens: list[CancelToken], on_batch: Callable[[int], None]
) -> list[Translation]:
    """Runs on the inference thread, in the model's batcher."""
    assert entry.translator is not None
    return entry.translator.translate_prepared(prepared, cancel=tokens, on_batch=on_batch)
