"""Code the tests share that is not a fixture: skips that CI turns into failures (skips.py), the parity sentences
(sentences.py), transformers' side of the parity tests (hf.py), `onnxmt serve` processes (server.py), the `onnxmt`
command as a user runs it (cli.py), Word files and zips (office.py), the headless browser (browser.py), the npm
client (node.py) and the Optimum venv (optimum_env.py).
"""

from __future__ import annotations

from pathlib import Path

# The repository's root: what tests that read docs/, benchmarks/ or the whole tree start from.
ROOT = Path(__file__).resolve().parents[2]
