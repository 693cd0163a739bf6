"""A decoder-only translator (tiny HY-MT, TranslateGemma) served: /languages lists its table's languages as ISO
codes, concurrent requests of mixed settings share the running batch (prompts joining mid-run) and each answer is
the library's for the text alone, the stream and the LibreTranslate client work, a bad language is a 400."""

from __future__ import annotations

import html
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from onnxmt import Translator
from onnxmt.documents.translate import translate_document
from onnxmt.runtime.options import RuntimeOptions
from onnxmt.serve.options import ServeOptions
from tests.helpers.server import Server, metric_sample, server_fixture

TEXTS = [
    "Hello world.",
    "The river was quiet in the morning, and the market was not open yet.",
    "Good?",
    "A small fast model.",
    "He came from the city with three friends.",
    "We know.",
]
SHORT = {"max_new_tokens": 12}

hy_mt = server_fixture("hy_mt_onnx_dir", log="hy-mt-serve", max_batch_size=8)
gemma = server_fixture("translategemma_onnx_dir", log="gemma-serve")


@pytest.fixture(scope="module")
def library(hy_mt_onnx_dir: Path) -> Translator:
    return Translator(hy_mt_onnx_dir, RuntimeOptions(threads=1))


def _post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def test_info_and_a_text_file(hy_mt: Server, library: Translator) -> None:
    info = httpx.get(f"{hy_mt.url}/info", timeout=30)
    assert info.status_code == 200 and info.json()["models"][0]["encoder_threads"] is None, info.text
    text = f"{TEXTS[1]} {TEXTS[4]}\n\n{TEXTS[0]}\n"
    fields = {"source": "en", "target": "zh", "max_new_tokens": "12"}
    uploaded = httpx.post(f"{hy_mt.url}/translate_file", files={"file": ("a.txt", text.encode())}, data=fields)
    assert uploaded.status_code == 200, uploaded.text
    got = httpx.get(uploaded.json()["translatedFileUrl"], timeout=30).text
    each = library.translate([f"{TEXTS[1]} {TEXTS[4]}", TEXTS[0]], source_lang="en", target_lang="zh", **SHORT)
    assert got == f"{each[0].text}\n\n{each[1].text}\n"  # a line, one prompt
    fields["glossary"] = '{"river": "江"}'  # a form's glossary: JSON text
    uploaded = httpx.post(f"{hy_mt.url}/translate_file", files={"file": ("a.txt", text.encode())}, data=fields)
    got = httpx.get(uploaded.json()["translatedFileUrl"], timeout=30).text
    first = library.translate(
        [f"{TEXTS[1]} {TEXTS[4]}"], source_lang="en", target_lang="zh", glossary={"river": "江"}, **SHORT
    )
    assert got == f"{first[0].text}\n\n{each[1].text}\n" and first[0].text != each[0].text


def test_languages_are_the_prompt_tables_codes(hy_mt: Server, gemma: Server) -> None:
    listed = {e["code"]: e for e in httpx.get(f"{hy_mt.url}/languages", timeout=30).json()}
    assert {"en", "zh", "zt", "fr", "yue", "fil"} <= set(listed)  # zh-Hant shown as LibreTranslate's zt, tl as fil
    assert {"zh", "fr", "de"} <= set(listed["en"]["targets"]) and "en" not in listed["en"]["targets"]
    listed = {e["code"] for e in httpx.get(f"{gemma.url}/languages", timeout=30).json()}
    assert {"en", "de", "zh", "pb"} <= listed


def test_concurrent_requests_answer_as_the_library_alone(hy_mt: Server, library: Translator) -> None:
    """Twelve requests of one to three texts, greedy and beam 2, three target languages, sent at once: they share
    the running batches (the rows gauge shows more than one request's), and every text is its translation alone."""
    requests = []
    for i in range(12):
        texts = TEXTS[i % 6 : i % 6 + 1 + i % 3]
        target = ("zh", "fr", "de")[i % 3]
        requests.append({"q": texts, "source": "en", "target": target, "beams": 1 + i % 2, **SHORT})

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(lambda body: _post(hy_mt, "/translate", body), requests))
    for body, answer in zip(requests, answers, strict=True):
        assert answer.status_code == 200, answer.text
        for text, got in zip(body["q"], answer.json()["translatedText"], strict=True):
            alone = library.translate(
                [text], source_lang="en", target_lang=body["target"], beams=body["beams"], **SHORT
            )[0]
            assert got == alone.text, (body, text)
    metrics = httpx.get(f"{hy_mt.url}/metrics", timeout=30).text
    assert metric_sample(metrics, "onnxmt_batch_size_sum", model="model") < sum(len(b["q"]) for b in requests) * 2


def test_a_chinese_source_gets_the_chinese_prompt(hy_mt: Server, library: Translator) -> None:
    chinese = "河流很长，山很高。"
    got = _post(hy_mt, "/translate", {"q": chinese, "source": "zh", "target": "en", **SHORT})
    assert got.status_code == 200, got.text
    prompt = library.chat.text(chinese, "zh", "en")  # type: ignore[union-attr]
    assert "将以下文本翻译为英语" in prompt
    want = library.translate([chinese], source_lang="zh", target_lang="en", **SHORT)[0].text
    assert got.json()["translatedText"] == want


def test_the_stream_and_the_libretranslate_client(hy_mt: Server, library: Translator) -> None:
    """A paragraph of two sentences streams as one prompt's translation (the model's unit of text), each paragraph
    under the chat prompt the library gives it."""
    from libretranslatepy import LibreTranslateAPI

    paragraphs = [f"{TEXTS[1]} {TEXTS[4]}", TEXTS[0]]
    text = "\n\n".join(paragraphs)
    each = library.translate(paragraphs, source_lang="en", target_lang="zh", **SHORT)
    whole = "\n\n".join(t.text for t in each)
    assert translate_document(library, text, source_lang="en", target_lang="zh", **SHORT) == whole
    stream = _post(hy_mt, "/translate/stream", {"q": text, "source": "en", "target": "zh", **SHORT})
    assert stream.status_code == 200, stream.text
    events = [block.splitlines() for block in stream.text.strip().split("\n\n")]
    assert events[-1][0] == "event: done" and json.loads(events[-1][1][6:]) == {"translatedText": whole}
    pieces = [json.loads(lines[0][6:])["translatedText"] for lines in events[:-1]]
    assert "".join(pieces) == whole and len(pieces) >= 3
    api = LibreTranslateAPI(hy_mt.url)  # no length: the service's fallback (the model's config names none)
    length = ServeOptions().fallback_max_new_tokens
    want = library.translate([TEXTS[3]], source_lang="en", target_lang="fr", max_new_tokens=length)[0].text
    assert api.translate(TEXTS[3], "en", "fr") == want


def test_bad_languages_are_400s_naming_the_valid_ones(hy_mt: Server, gemma: Server) -> None:
    bad = _post(hy_mt, "/translate", {"q": "Hi", "source": "en", "target": "xx"})
    assert bad.status_code == 400 and "valid:" in bad.json()["error"] and "zh" in bad.json()["error"]
    no_source = _post(gemma, "/translate", {"q": "Hi", "source": "auto", "target": "de", **SHORT})
    assert no_source.status_code in (200, 400), no_source.text  # auto: detected, or a clear error
    if no_source.status_code == 400:
        assert "source" in no_source.json()["error"]


@pytest.mark.parametrize("max_skip", [2.0, 0.0])
def test_a_short_prompt_is_prefilled_between_a_long_prompts_chunks(
    hy_mt_onnx_dir: Path, library: Translator, monkeypatch: pytest.MonkeyPatch, max_skip: float
) -> None:
    """Prompts are prefilled a chunk at a time, the call with the fewest positions left first: a short request
    arriving while a long prompt is being prefilled has its prompt run before the long one's last chunk, and both
    answers are the library's (the same chunk boundaries: the same bits). With the age bound at 0, the long call has
    waited long enough: the prefill alternates between it and the short one."""
    from onnxmt.runtime import decoder_only

    monkeypatch.setattr(decoder_only, "PREFILL_CHUNK", 8)
    long, short = _long_and_short(library)
    calls, _, answers = _beside_a_long_prompt(library, monkeypatch, long, short, max_skip)
    monkeypatch.undo()
    calls = [c for c in calls if c != (-1, -1)]  # the prefill calls alone

    def last_chunk(prompt: tuple[int, ...]) -> int:
        """The index of the prefill call that ran a prompt's last chunk (its prefix: all but the last token)."""
        n = len(prompt) - 1
        return calls.index(((n - 1) // 8 * 8, n - (n - 1) // 8 * 8))

    def first_chunk(prompt: tuple[int, ...]) -> int:
        return next(i for i in range(last_chunk(prompt), -1, -1) if calls[i][0] == 0)

    chunks = -(-(len(short[0].ids) - 1) // 8)
    assert calls[0] == (0, 8) and len(calls) == -(-(len(long[0].ids) - 1) // 8) + chunks
    assert last_chunk(short[0].ids) < last_chunk(long[0].ids)  # run between the long prompt's chunks
    between = last_chunk(short[0].ids) - first_chunk(short[0].ids) + 1 - chunks  # the long one's, meanwhile
    if max_skip:
        assert between == 0  # fewest positions left first: the short prompt's chunks one after the other
    else:
        assert between >= chunks - 1  # the long call has waited long enough: every other piece is its
    monkeypatch.setattr(decoder_only, "PREFILL_CHUNK", 8)
    assert answers == [library.translate_prepared(p)[0].text for p in (long, short)]


def test_a_short_request_decodes_between_a_long_prompts_chunks(
    library: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill chunks and steps take turns on the inference thread: no two model calls run at once (a chunk beside
    a step would share the cores with it), and a one-sentence request that arrives while a long prompt is prefilled
    is answered before the long prompt's last chunk (its steps run between the chunks, not after the whole prompt).
    Both answers are the library's."""
    from onnxmt.runtime import decoder_only

    monkeypatch.setattr(decoder_only, "PREFILL_CHUNK", 8)
    long, short = _long_and_short(library)
    calls, overlapped, answers = _beside_a_long_prompt(library, monkeypatch, long, short, 2.0)
    monkeypatch.undo()
    n = len(long[0].ids) - 1  # its prefix: all but the last token
    last = calls.index(((n - 1) // 8 * 8, n - (n - 1) // 8 * 8))
    answered = calls.index((-1, -1))  # where the short answer came, among the prefill calls
    assert not overlapped
    assert answered < last, (answered, last, len(calls))
    monkeypatch.setattr(decoder_only, "PREFILL_CHUNK", 8)
    assert answers == [library.translate_prepared(p)[0].text for p in (long, short)]


def _long_and_short(library: Translator) -> tuple[list[Any], list[Any]]:
    long = library.prepare([" ".join(TEXTS) * 3], source_lang="en", target_lang="zh", **SHORT)
    short = library.prepare([TEXTS[2]], source_lang="en", target_lang="zh", **SHORT)
    assert len(long[0].ids) > 3 * len(short[0].ids)
    return long, short


def _beside_a_long_prompt(
    library: Translator, monkeypatch: pytest.MonkeyPatch, long: list[Any], short: list[Any], max_skip: float
) -> tuple[list[tuple[int, int]], bool, list[str]]:
    """The long request served, then the short one sent once the long prompt's prefill has started: the (start,
    positions) of each prefill call in order, with (-1, -1) where the short answer came; whether two model calls
    ever ran at once; the two answers."""
    import asyncio
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from onnxmt.runtime.options import BatchLimits
    from onnxmt.serve.inflight import InflightBatcher

    graphs = library.graphs
    calls: list[tuple[int, int]] = []
    running: list[int] = []  # model calls in progress
    overlapped = False
    real_step, real_extend = graphs.step, graphs.extend
    stepping = threading.local()
    started = threading.Event()

    def step(tokens: Any, cache: Any) -> Any:
        stepping.on = True
        try:
            return real_step(tokens, cache)
        finally:
            stepping.on = False

    def extend(ids: Any, lengths: Any, cache: Any) -> Any:
        nonlocal overlapped
        running.append(1)
        overlapped = overlapped or len(running) > 1
        try:
            if not getattr(stepping, "on", False):  # a prefill call
                calls.append((int(cache.self_len[0]), int(lengths[0])))
                started.set()
                time.sleep(0.01)  # a long prompt's chunk takes a while, as on a real model
            return real_extend(ids, lengths, cache)
        finally:
            running.pop()

    monkeypatch.setattr(graphs, "step", step)
    monkeypatch.setattr(graphs, "extend", extend)

    async def run() -> list[str]:
        executor = ThreadPoolExecutor(1, thread_name_prefix="onnxmt-inference")
        limits = BatchLimits(batch_size=4, max_skip_age=max_skip)
        batcher = InflightBatcher(library, executor, limits=limits, max_queue=16)
        batcher.start()
        try:
            first = asyncio.ensure_future(batcher.translate(long, None))
            while not started.is_set():
                await asyncio.sleep(0.001)
            second = asyncio.ensure_future(batcher.translate(short, None))
            second.add_done_callback(lambda _: calls.append((-1, -1)))
            done = await asyncio.wait_for(asyncio.gather(first, second), 120)
            return [d[0].text for d in done]
        finally:
            await batcher.stop()
            executor.shutdown()

    answers = asyncio.run(run())
    return calls, overlapped, answers


def test_a_glossary_and_a_context_per_request(hy_mt: Server, gemma: Server, library: Translator) -> None:
    """HY-MT's terminology prompt for the terms a text holds (pairs or an object), its context prompt; a family
    without them, both at once, a malformed or too large glossary, a context too long: one clear 400."""
    texts = ["The river was quiet.", "Good?"]
    body = {"q": texts, "source": "en", "target": "zh", **SHORT}
    pairs = _post(hy_mt, "/translate", {**body, "glossary": [["river", "江"], ["mountain", "山"]]})
    mapping = _post(hy_mt, "/translate", {**body, "glossary": {"river": "江"}})
    assert pairs.status_code == mapping.status_code == 200, pairs.text
    want = library.translate(texts, source_lang="en", target_lang="zh", glossary=[("river", "江")], **SHORT)
    assert pairs.json()["translatedText"] == mapping.json()["translatedText"] == [t.text for t in want]
    plain = library.translate(texts, source_lang="en", target_lang="zh", **SHORT)
    assert want[0].text != plain[0].text and want[1].text == plain[1].text  # "Good?" holds no term
    context = _post(hy_mt, "/translate", {**body, "q": "Good?", "context": "A story about a town."})
    want = library.translate(["Good?"], source_lang="en", target_lang="zh", context="A story about a town.", **SHORT)
    assert context.status_code == 200 and context.json()["translatedText"] == want[0].text, context.text
    refusals = [
        (gemma, {"q": "Hi", "source": "en", "target": "de", "glossary": {"Hi": "Hallo"}}, "no such template"),
        (gemma, {"q": "Hi", "source": "en", "target": "de", "context": "c"}, "no such template"),
        (hy_mt, {**body, "glossary": {"a": "b"}, "context": "c"}, "not both at once"),
        (hy_mt, {**body, "glossary": [["river"]]}, "not a [source term, target term] pair"),
        (hy_mt, {**body, "glossary": "river=江"}, "glossary must be a list"),
        (hy_mt, {**body, "glossary": {f"t{i}": "x" for i in range(101)}}, "the limit is 100"),
        (hy_mt, {**body, "context": "x" * 2001}, "the limit is 2000"),
    ]
    for server, refused, message in refusals:
        answer = _post(server, "/translate", refused)
        assert answer.status_code == 400 and message in answer.json()["error"], (refused, answer.text)


def test_html_paragraphs_are_one_prompt_each(hy_mt: Server, library: Translator) -> None:
    page = f"<p>{TEXTS[1]} {TEXTS[4]}</p><p>{TEXTS[5]}</p>"
    answer = _post(hy_mt, "/translate", {"q": page, "format": "html", "source": "en", "target": "zh", **SHORT})
    assert answer.status_code == 200, answer.text
    first, second = library.translate([f"{TEXTS[1]} {TEXTS[4]}", TEXTS[5]], source_lang="en", target_lang="zh", **SHORT)
    assert (
        answer.json()["translatedText"]
        == f"<p>{html.escape(first.text, quote=False)}</p><p>" + html.escape(second.text, quote=False) + "</p>"
    )
