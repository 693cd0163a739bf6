"""A decoder-only translator (tiny HY-MT) on the Ray paths, without a cluster: the Serve application `app_builder`
makes binds the directory to its replicas, a `Replica` built as Ray builds it answers /translate as the library,
and Ray Data's batch function (`translate-corpus`) gives each line whole to the model under its chat prompt."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.helpers.skips import importorskip

importorskip("ray")

from onnxmt import DecodeOptions, Translator  # noqa: E402
from onnxmt.runtime.options import RuntimeOptions  # noqa: E402
from onnxmt.scale.corpus import TranslateBatch  # noqa: E402
from onnxmt.scale.rayserve import Replica, app_builder  # noqa: E402

TEXTS = ["The river was quiet. The market was not open yet.", "", "Good?"]
PAIR = {"source_lang": "en", "target_lang": "zh"}


def _library(directory: Path, texts: list[str]) -> list[str]:
    translator = Translator(directory, RuntimeOptions(threads=1))
    return [t.text for t in translator.translate(texts, max_new_tokens=6, **PAIR)]


class _InProcess(Replica):
    """A replica outside Ray: its async constructor and `__del__` awaited by the test, as Ray awaits them (the
    garbage collector's own `__del__` call would leave a coroutine never awaited)."""

    def __del__(self) -> None:  # type: ignore[override]
        pass


def test_the_serve_deployment_builds_a_decoder_only_translator(hy_mt_onnx_dir: Path) -> None:
    app = app_builder({"model_dir": str(hy_mt_onnx_dir), "max_new_tokens": "6", "threads": "1"})
    model_dirs, options, runtime, decoding, _board = app._bound_deployment.init_args[0]._bound_deployment.init_args

    async def run() -> tuple[int, bytes, str]:
        replica = _InProcess.__new__(_InProcess)
        await Replica.__init__(replica, model_dirs, options, runtime, decoding)
        try:
            await replica.check_health()
            translator = replica.service.pool.entries[0].translator
            body = json.dumps({"q": TEXTS[0], "source": "en", "target": "zh"}).encode()
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST"}
            scope.update(scheme="http", path="/translate", raw_path=b"/translate", query_string=b"", root_path="")
            scope["headers"] = [(b"content-type", b"application/json"), (b"host", b"replica")]
            status, _, answer = await replica.answer(scope, body)
            return status, answer, translator.manifest.architecture
        finally:
            await Replica.__del__(replica)

    status, answer, architecture = asyncio.run(run())
    assert architecture == "hunyuan_v1_dense" and model_dirs == [str(hy_mt_onnx_dir)]
    assert status == 200, answer
    assert json.loads(answer)["translatedText"] == _library(hy_mt_onnx_dir, TEXTS[:1])[0]


def test_the_corpus_batch_function_gives_each_line_whole(hy_mt_onnx_dir: Path) -> None:
    batch = TranslateBatch(
        str(hy_mt_onnx_dir), {"threads": 1}, {"max_new_tokens": 6}, {}, PAIR, column="text", output_column="out"
    )
    assert list(batch({"text": TEXTS})["out"]) == _library(hy_mt_onnx_dir, TEXTS)
    assert isinstance(batch.translator.decoding, DecodeOptions)
