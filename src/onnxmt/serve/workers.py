"""Document preparation in worker processes: reading a file, cutting it into sentences, writing it again.

Not threads: preparation is pure Python (zip, XML, HTML, sentence splitting), and a thread doing it holds the GIL
that the event loop, the tokenizer calls and the decoder's batches need (measured: a one-sentence translation on
the tiny model, 7 ms alone, 375 ms beside one such thread). A process has its own, and can be stopped at a
deadline (a thread cannot), at a memory limit of its own (`RLIMIT_AS`: a document that needs more fails alone),
and when its client leaves. A stopped worker is replaced by a new one.

A job is a module-level function and picklable arguments (documents/prepare.py); each worker runs one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger("onnxmt.serve")
Disconnected = Callable[[], Awaitable[object]] | None
WORKER_NICENESS = 10


class WorkerBusy(Exception):
    """Every worker is busy and `max_waiting` jobs already wait for one."""


class WorkerGone(Exception):
    """The worker died during the job: past its memory limit, or killed."""


class WorkerTimeout(Exception):
    """The job did not finish before its deadline; its worker was stopped."""


class ClientLeft(Exception):
    """The client disconnected during the job; its worker was stopped."""


class JobError(Exception):
    """The job raised: `kind` is "value" (ValueError: the document cannot be read), "too_large" (DocumentTooLarge)
    or "import" (a missing optional dependency)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _serve(conn: Connection, memory_bytes: int) -> None:
    """A worker's loop: a job in, its result out, until the service closes the pipe."""
    import resource

    # Ctrl+C reaches the whole process group: the service stops its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Below the service's own threads: on a busy machine the cores go to translations first, documents after.
    os.nice(WORKER_NICENESS)
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    from ..documents import prepare  # noqa: F401  (imported once, before the first job waits for it)

    while True:
        try:
            function, args = conn.recv()
        except (EOFError, OSError):
            return
        answer = answered(function, args)
        try:
            conn.send(answer)
        except MemoryError:
            conn.send(("error", "memory", ""))


def answered(function: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, ...]:
    """`function(*args)` as a worker answers it: ("ok", result), or ("error", kind, message)."""
    from ..documents.limits import DocumentTooLarge

    try:
        return ("ok", function(*args))
    except MemoryError:
        return ("error", "memory", "")
    except DocumentTooLarge as e:
        return ("error", "too_large", str(e))
    except ValueError as e:
        return ("error", "value", str(e))
    except ImportError as e:
        return ("error", "import", str(e))
    except Exception as e:  # what a parser raises on input it was not written for (python-docx: KeyError...)
        return ("error", "value", f"{type(e).__name__}: {e}")


def _result(answer: tuple[Any, ...]) -> Any:
    if answer[0] == "error":
        kind, message = answer[1], answer[2]
        if kind == "memory":
            raise WorkerGone("preparing the document needs more memory than a document worker has")
        raise JobError(kind, message)
    return answer[1]


class _Worker:
    """A worker process and the thread that talks to it: sending a document and waiting for the answer block,
    and must block neither the event loop nor the threads other requests use."""

    def __init__(self, memory_bytes: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, memory_bytes), name="onnxmt-documents", daemon=True)
        self.process.start()
        child.close()
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxmt-documents")

    def exchange(self, job: tuple[Any, ...]) -> tuple[Any, ...]:
        self.conn.send(job)
        answer: tuple[Any, ...] = self.conn.recv()
        return answer

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()  # after the process: the thread's recv has ended with EOFError by then
        self.thread.shutdown(wait=False)


class DocumentWorkers:
    """`workers` processes, each with `memory_mb` of address space (0: no limit); at most `max_waiting` jobs wait
    for one (one more: WorkerBusy)."""

    def __init__(self, workers: int, max_waiting: int, memory_mb: int) -> None:
        self.workers = workers
        self.max_waiting = max_waiting
        self.memory_bytes = memory_mb << 20
        self._idle: asyncio.Queue[_Worker] | None = None
        self._all: set[_Worker] = set()
        self._waiting = 0
        self._stopped = False

    def start(self) -> None:
        """Start the workers (each imports its modules meanwhile, so the first document does not wait for it)."""
        self._idle = asyncio.Queue()
        for _ in range(self.workers):
            self._idle.put_nowait(self._new())

    def _new(self) -> _Worker:
        worker = _Worker(self.memory_bytes)
        self._all.add(worker)
        return worker

    def stop(self) -> None:
        self._stopped = True
        for worker in list(self._all):
            worker.kill()
        self._all.clear()

    async def run(
        self, function: Callable[..., Any], args: tuple[Any, ...], timeout: float | None, disconnected: Disconnected
    ) -> Any:
        """`function(*args)` in a worker, within `timeout` seconds (waiting for a worker included)."""
        if self._idle is None or self._stopped:
            raise WorkerGone("the document workers are stopped")
        if self._waiting >= self.max_waiting:
            raise WorkerBusy(f"{self._waiting} documents are waiting for a worker")
        deadline = None if timeout is None else time.monotonic() + timeout
        self._waiting += 1
        try:
            worker = await asyncio.wait_for(self._idle.get(), timeout)
        except asyncio.TimeoutError as e:
            raise WorkerTimeout(f"no document worker was free within {timeout:g} s") from e
        finally:
            self._waiting -= 1
        healthy = False
        try:
            answer = await self._call(worker, function, args, deadline, disconnected)
            healthy = True
        finally:
            if not healthy:  # stopped at a deadline, a disconnect, a crash: a new worker takes its place
                worker.kill()
                self._all.discard(worker)
                if not self._stopped:
                    worker = self._new()
            if not self._stopped:
                self._idle.put_nowait(worker)
        return _result(answer)

    async def run_small(self, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """`function(*args)` on a thread, not a worker: for the texts of a request (a stream's text, a snippet of
        HTML), which are bounded as any request's texts are, and whose preparation takes milliseconds. They neither
        wait for a worker nor count against the document queue."""
        return _result(await asyncio.to_thread(answered, function, args))

    async def _call(
        self,
        worker: _Worker,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        deadline: float | None,
        disconnected: Disconnected,
    ) -> tuple[Any, ...]:
        loop = asyncio.get_running_loop()
        answer = loop.run_in_executor(worker.thread, worker.exchange, (function, args))
        # Read its outcome even when nobody waits for it any more (a killed worker's EOFError).
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())
        waits: set[asyncio.Future[Any]] = {answer}
        gone = asyncio.ensure_future(disconnected()) if disconnected is not None else None
        if gone is not None:
            waits.add(gone)
        try:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left = gone is not None and gone.done() and not gone.cancelled()
            if gone is not None:
                gone.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await gone
        if answer.done():
            try:
                return answer.result()
            except (EOFError, OSError) as e:
                raise WorkerGone("the document worker died (past its memory limit?)") from e
        if left:
            raise ClientLeft("the client disconnected")
        raise WorkerTimeout("preparing the document took too long")
