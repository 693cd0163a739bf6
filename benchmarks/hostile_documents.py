"""Each hostile document of tests/serve/test_documents_hostile.py sent alone to a running `onnxmt serve` of MODEL_DIR:
its answer, its time, and the server's peak RSS (its process and its document workers) while it is handled.

    python benchmarks/hostile_documents.py MODEL_DIR
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: the tests package
from tests.helpers.hostile import HOSTILE, tree_rss
from tests.helpers.server import start_server


def main(model_dir: str) -> None:
    server = start_server(Path(model_dir), Path(tempfile.mkdtemp()), max_body_bytes=4 << 20)
    try:
        httpx.post(f"{server.url}/translate_file", files={"file": ("a.txt", b"Hi.")}, timeout=60)
        print(f"resting RSS {tree_rss(server.process.pid) >> 20} MB\n")
        print("| document | status | seconds | peak RSS |\n| --- | --- | --- | --- |")
        for name, (filename, data) in HOSTILE.items():
            peak = [tree_rss(server.process.pid)]
            done = threading.Event()

            def sample(peak: list[int] = peak, done: threading.Event = done) -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], tree_rss(server.process.pid))
                    time.sleep(0.01)

            sampler = threading.Thread(target=sample)
            sampler.start()
            started = time.perf_counter()
            files = {"file": (filename, data)}
            response = httpx.post(
                f"{server.url}/translate_file", files=files, data={"max_new_tokens": "4"}, timeout=300
            )
            seconds = time.perf_counter() - started
            done.set()
            sampler.join()
            print(f"| {name} | {response.status_code} | {seconds:.2f} | {peak[0] >> 20} MB |")
    finally:
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1])
