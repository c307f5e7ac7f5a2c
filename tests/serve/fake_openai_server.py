"""A stand-in OpenAI-compatible server for tests: ``python fake_openai_server.py PORT [CHILD_PID_FILE]``.

``GET /health`` -> 200. ``POST /v1/completions``: with a token-id prompt (vLLM style) it answers the ids
``[7, 8, 2]`` as ``token_id:N`` strings with log-probs ``-0.5``; with a text prompt it answers the text
``"ok"``. It starts one child process (like vLLM's engine core: to test that the whole process group is
stopped) and writes the child's pid to CHILD_PID_FILE.
"""

import json
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send(200 if self.path == "/health" else 404, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if isinstance(body["prompt"], list):
            choice = {"text": "", "finish_reason": "stop",
                      "logprobs": {"tokens": ["token_id:7", "token_id:8", "token_id:2"],
                                   "token_logprobs": [-0.5, -0.5, -0.5]}}
        else:
            choice = {"text": "ok", "finish_reason": "stop"}
        self._send(200, {"choices": [choice], "echo": body})


if __name__ == "__main__":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as fh:
            fh.write(str(child.pid))
    HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
