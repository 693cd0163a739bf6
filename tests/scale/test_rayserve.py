"""The service as a Ray Serve deployment, on a local Ray cluster (3 logical CPUs on 2 cores): 2 replicas answer as
the single-process app does (/translate, /languages, errors), /metrics sums them, a client's disconnect stops its
work in the replica, and what a replica killed under load does to the requests it holds."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.skips import importorskip

ray = importorskip("ray")
serve = importorskip("ray.serve")
httpx = importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from onnxmt.runtime.options import DecodeOptions  # noqa: E402
from onnxmt.scale.rayserve import RayServeOptions, app_builder, application  # noqa: E402
from onnxmt.serve.app import create_app  # noqa: E402
from onnxmt.serve.options import ServeOptions  # noqa: E402
from onnxmt.testing import generate_corpus  # noqa: E402

TEXTS = generate_corpus(11, lines=24)[0]
OPTIONS = ServeOptions(max_batch_size=8, cache_size=0)  # no cache: every answer is a fresh translation


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster with Serve's proxy on a free port; the base URL."""
    # Three: the two replicas of `deployed` and the one of `heavy` (which idles but for its test).
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def deployed(cluster: str, tiny_onnx_dir: Path) -> Iterator[str]:
    """The tiny model on 2 replicas; serve.run returns once both passed their first health check (model loaded)."""
    serve.run(application(tiny_onnx_dir, OPTIONS, scaling=RayServeOptions(replicas=2)), name="onnxmt")
    yield cluster
    serve.delete("onnxmt")


@pytest.fixture(scope="module")
def local(tiny_onnx_dir: Path) -> Iterator[TestClient]:
    """The plain app in this process: what every replica must answer."""
    with TestClient(create_app(tiny_onnx_dir, OPTIONS)) as client:
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield client


@pytest.fixture(scope="module")
def target(local: TestClient) -> str:
    """A language the tiny model translates into (not its source)."""
    first = local.get("/languages").json()[0]
    return str(next(t for t in first["targets"] if t != first["code"]))


def _replica_actors() -> list[Any]:
    """The replica actors of the `onnxmt` deployment in this test's cluster (Serve names them
    `SERVE_REPLICA::<app>#<deployment>#<id>`), not those of another Ray cluster on the machine."""
    actors = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] == "serve" and entry["name"].startswith("SERVE_REPLICA::onnxmt#onnxmt#"):
            with contextlib.suppress(ValueError):  # gone since it was listed
                actors.append(ray.get_actor(entry["name"], namespace="serve"))
    return actors


def _pid(actor: Any) -> int:
    return int(ray.get(actor.__ray_call__.remote(lambda _: os.getpid()), timeout=10))


def _replica_pids() -> set[int]:
    """The processes of the replicas that answer (a dead replica, or one still starting, is left out)."""
    pids = set()
    for actor in _replica_actors():
        with contextlib.suppress(ray.exceptions.RayError):
            pids.add(_pid(actor))
    return pids


def _replica_holding_requests(ready: Callable[[], bool], seconds: float = 60.0) -> tuple[int, int]:
    """(pid, requests held) of the replica that holds the most requests, as soon as `ready()` and one holds any: Ray
    counts the requests each replica actor has been sent and not yet answered (queued or running). Fails after
    `seconds` without."""
    actors = _replica_actors()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        held = ray.get([actor.get_num_ongoing_requests.remote() for actor in actors])
        busiest = max(range(len(actors)), key=held.__getitem__)
        if ready() and held[busiest] > 0:
            return _pid(actors[busiest]), held[busiest]
        time.sleep(0.05)
    pytest.fail(f"after {seconds} s, ready: {ready()}; requests held by the {len(actors)} replicas: {held}")


def _post(base: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}/translate", json=body, timeout=60)


@pytest.mark.timeout(300)
def test_two_replicas_answer_as_the_single_process_app(deployed: str, local: TestClient, target: str) -> None:
    assert len(_replica_pids()) == 2
    bodies = [{"q": text, "target": target, "max_new_tokens": 20} for text in TEXTS[:12]]
    bodies.append({"q": TEXTS[12:16], "source": "en", "target": target, "beams": 2, "max_new_tokens": 20})
    with ThreadPoolExecutor(6) as pool:  # concurrent, so both replicas and their batchers take part
        remote = list(pool.map(lambda body: _post(deployed, body), bodies))
    for body, response in zip(bodies, remote, strict=True):
        expected = local.post("/translate", json=body)
        assert (response.status_code, response.json()) == (200, expected.json())
    assert len({str(r.json()["translatedText"]) for r in remote}) > 6  # not one repeated output

    assert httpx.get(f"{deployed}/languages").json() == local.get("/languages").json()
    unknown = {"q": "hello", "target": "xx"}
    error = _post(deployed, unknown)
    assert error.status_code == 400 and error.headers["content-type"] == "application/json"
    assert error.json() == local.post("/translate", json=unknown).json()
    assert "error" in error.json()
    assert httpx.get(f"{deployed}/ready").json() == {"ready": True}
    assert "onnxmt_requests_total" in httpx.get(f"{deployed}/metrics").text
    page = httpx.get(f"{deployed}/")
    assert page.status_code == 200 and page.text == local.get("/").text


def _metric(base: str, name: str, **labels: str) -> float:
    """A sample of the deployment's /metrics, summed over its label sets matching `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def _eventually(check: Any, seconds: float = 15.0) -> Any:
    """`check()` once it is truthy (replicas push their metrics every second), or its last value."""
    deadline = time.monotonic() + seconds
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.25)
    return value


def _settled(read: Any, seconds: float = 30.0) -> Any:
    """A metric once two reads 1.5 s apart agree: the replicas push every second, so the texts of earlier tests
    may still be on their way when a test starts counting."""
    deadline = time.monotonic() + seconds
    value = read()
    while time.monotonic() < deadline:
        time.sleep(1.5)
        again = read()
        if again == value:
            break
        value = again
    return value


@pytest.mark.timeout(300)
def test_metrics_are_the_sum_over_the_replicas(deployed: str, target: str) -> None:
    assert _eventually(lambda: _metric(deployed, "onnxmt_replicas_reporting") == 2)
    assert _metric(deployed, "onnxmt_gateway_repeated_requests_total") == 0
    before = _settled(lambda: _metric(deployed, "onnxmt_translated_texts_total"))
    bodies = [{"q": f"{TEXTS[i % 24]} {i}", "target": target, "max_new_tokens": 8} for i in range(24)]
    with ThreadPoolExecutor(8) as pool:  # concurrent: Ray spreads them over both replicas
        assert {r.status_code for r in pool.map(lambda body: _post(deployed, body), bodies)} == {200}
    # Every text counted once, wherever it ran: one replica's counters would hold only its part.
    assert _eventually(lambda: _metric(deployed, "onnxmt_translated_texts_total") - before == 24)
    histogram = _metric(deployed, "onnxmt_step_rows_count")
    assert histogram > 0 and "# TYPE onnxmt_step_rows histogram" in httpx.get(f"{deployed}/metrics").text


@pytest.fixture(scope="module")
def heavy(cluster: str, tiny_onnx_dir: Path) -> Iterator[str]:
    """One replica whose every text runs to 63 tokens (min_new_tokens), under /heavy: a request that takes long."""
    options = ServeOptions(timeout=120, max_texts=256, max_request_cost=0, cache_size=0)
    decoding = DecodeOptions(max_new_tokens=63, min_new_tokens=63)
    app = application(tiny_onnx_dir, options, decoding=decoding, scaling=RayServeOptions(name="heavy"))
    serve.run(app, name="heavy", route_prefix="/heavy")
    yield f"{cluster}/heavy"
    serve.delete("heavy")


@pytest.mark.timeout(300)
def test_a_client_that_disconnects_cancels_its_work_in_the_replica(heavy: str) -> None:
    """The client of a long request leaves: Ray cancels the gateway's call and the replica's, the replica's app is
    told the client has gone (499, as in one process) and its work stops, so the next request is answered soon."""
    body = {"q": [f"{TEXTS[i % 24]} {i}" for i in range(256)], "beams": 8}  # ~20 s of work on one core
    assert _post(heavy, {"q": "a", "max_new_tokens": 3}).status_code == 200  # warm
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{heavy}/translate", json=body, timeout=1.0)  # closes its connection
    started = time.monotonic()
    small = httpx.post(f"{heavy}/translate", json={"q": "a"}, timeout=60)
    took = time.monotonic() - started
    assert small.status_code == 200, small.text
    assert took < 8, took  # the heavy request's work stopped (within the replica's grace: 5 s)
    counted = _eventually(lambda: _metric(heavy, "onnxmt_requests_total", path="/translate", status="499") == 1)
    lines = [line for line in httpx.get(f"{heavy}/metrics").text.splitlines() if "requests_total" in line]
    assert counted, lines


@pytest.mark.timeout(300)
def test_a_killed_replica_is_replaced(deployed: str, target: str) -> None:
    """A replica SIGKILLed while requests are in flight: every request is answered 200 (the gateway sends those
    the killed replica held to the other one), and Ray starts a new replica that answers."""
    # Heavy (8 texts, 4 beams, to the tiny model's length limit), so a request stays in its replica for a while.
    body = {"q": TEXTS[:8], "target": target, "beams": 4, "max_new_tokens": 63}
    statuses: list[int] = []
    errors: list[str] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                response = _post(deployed, body)
                statuses.append(response.status_code)
                if response.status_code != 200:
                    errors.append(response.text[:200])
            except httpx.HTTPError as e:
                statuses.append(-1)
                errors.append(repr(e))

    clients = [threading.Thread(target=load, daemon=True) for _ in range(6)]
    for client in clients:
        client.start()
    # Under load (answers have come back), the kill must catch requests in the replica, or the test would not show
    # what happens to them: how many each replica holds at a given moment depends on the machine's speed and on
    # Ray's routing.
    victim, held = _replica_holding_requests(lambda: len(statuses) > 0)
    before = len(statuses)
    os.kill(victim, signal.SIGKILL)
    time.sleep(8)
    stop.set()
    for client in clients:
        client.join(timeout=60)
    counts = {status: statuses.count(status) for status in set(statuses)}
    repeated = serve.get_deployment_handle("gateway", app_name="onnxmt").repeated_requests.remote().result()
    print(f"\nkilled replica {victim} holding {held}: {before} answers before, {counts}, {repeated} sent again")
    assert before > 0 and statuses.count(200) > before  # the other replica kept answering
    assert set(statuses) == {200}, (counts, errors[:3])
    assert repeated >= 1  # the killed replica held requests: the gateway sent them again
    assert _metric(deployed, "onnxmt_gateway_repeated_requests_total") == repeated  # and /metrics says so

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # Ray notices the dead actor and starts another
        pids = _replica_pids()
        if len(pids) == 2 and victim not in pids:
            break
        time.sleep(1)
    assert len(pids) == 2 and victim not in pids
    with ThreadPoolExecutor(4) as pool:
        after = list(pool.map(lambda _: _post(deployed, body), range(8)))
    assert {r.status_code for r in after} == {200}


def test_app_builder_reads_serve_run_arguments(tiny_onnx_dir: Path) -> None:
    app = app_builder({"model_dir": str(tiny_onnx_dir), "replicas": "2", "max_batch_size": "4", "beams": "2"})
    deployment = app._bound_deployment.init_args[0]._bound_deployment  # behind the gateway
    assert deployment.num_replicas == 2 and deployment.max_ongoing_requests == 8
    model_dirs, options, runtime, decoding, _board = deployment.init_args
    assert model_dirs == [str(tiny_onnx_dir)] and options.max_batch_size == 4
    assert (runtime.threads, decoding.beams) == (1, 2)
    scaled = app_builder({"model_dirs": [str(tiny_onnx_dir)], "min_replicas": 1, "max_replicas": "3"})
    config = scaled._bound_deployment.init_args[0]._bound_deployment._deployment_config.autoscaling_config
    assert (config.min_replicas, config.max_replicas, config.target_ongoing_requests) == (1, 3, 32)
    with pytest.raises(ValueError, match="unknown argument.*replicass"):
        app_builder({"model_dir": str(tiny_onnx_dir), "replicass": "2"})
    with pytest.raises(ValueError, match="needs model_dir"):
        app_builder({})
    with pytest.raises(ValueError, match="max_batch_size='x': expected int"):
        app_builder({"model_dir": str(tiny_onnx_dir), "max_batch_size": "x"})
