"""The npm `libretranslate` client (tests/helpers/js: package.json pins it) run by node against an `onnxmt serve`
process; the node_modules fixture of tests/serve/conftest.py installs it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.helpers.server import Server

JS_DIR = Path(__file__).parent / "js"

# The key, when there is one, comes from LT_API_KEY: the client sends it as `apiKey`.
NODE_CLIENT = """
const { translate } = require("libretranslate");
const [apiurl, source, target, ...texts] = process.argv.slice(1);
const apiKey = process.env.LT_API_KEY;
(async () => {
  const out = [];
  for (const query of texts) out.push(await translate({ query, source, target, apiurl, apiKey }));
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(String(e)); process.exit(1); });
"""


def run_node(
    server: Server, source: str, target: str, texts: list[str], *, api_key: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = ["node", "-e", NODE_CLIENT, server.url, source, target, *texts]
    env = {k: v for k, v in os.environ.items() if k != "LT_API_KEY"}
    if api_key is not None:
        env["LT_API_KEY"] = api_key
    return subprocess.run(command, cwd=JS_DIR, env=env, capture_output=True, text=True, timeout=120)
