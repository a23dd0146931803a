"""A stand-in for vLLM's OpenAI server (tests only): it logs vLLM 0.32.0's start-up lines
(the KV cache size, an empty AOT artifact when FAKE_VLLM_EMPTY is set), answers /health and
/v1/completions with as many tokens as asked, and stops on SIGINT like vLLM. Decoding takes
FAKE_VLLM_TOKEN_S seconds per token after the first."""

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
p.add_argument("--model")
opts, _ = p.parse_known_args()
say = lambda line: print(f"INFO 12-07 19:00:00 [x.py:1] {line}", flush=True)  # noqa: E731
if os.environ.get("FAKE_VLLM_EMPTY"):
    say("reconstructed serializable fn from standalone compile artifacts. num_artifacts=0 "
        "num_submods=0")  # fmt: skip
    say("Directly load AOT compilation from path /c/torch_compile_cache/torch_aot_compile/ab/m")
say(f"CPU KV cache size: {os.environ.get('FAKE_VLLM_KV', '7,280')} tokens")
say("Maximum concurrency for 256 tokens per request: 28.44x")
say("init engine (profile, create kv cache, warmup model) took 3.21 s")
per_token = float(os.environ.get("FAKE_VLLM_TOKEN_S", "0.01"))


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _send(self, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send({})

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = int(req["max_tokens"])
        time.sleep(per_token * (n - 1))
        ids = [(i * 7) % 100 for i in range(n)]
        self._send({"choices": [{"text": "x" * n, "token_ids": ids}],
                    "usage": {"completion_tokens": n}})  # fmt: skip


server = ThreadingHTTPServer(("127.0.0.1", opts.port), Handler)
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
try:
    server.serve_forever()
finally:
    server.server_close()
