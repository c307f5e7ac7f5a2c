"""``envace serve``: start an OpenAI-compatible server for a model, wait for health, stop it cleanly.

Implemented: ``vllm serve`` (``--backend vllm``, default with ``--device cuda``) or ``transformers serve``
(``--backend transformers``, default with ``--device cpu``) through :class:`envace.serving.Server`; port 0
picks a free port (retried if another job takes it first). Prints one line ``READY <base_url> <model>``
to stdout once healthy (``--ready-file`` also gets it, written atomically), then keeps running until
SIGINT/SIGTERM or until the server exits (exit code 1 then: a server that dies is reported). On exit the
whole server process group is stopped. ``--model-path`` may be a local directory or an HF id.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HELP = "start an OpenAI-compatible server for a model and wait for health"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help=HELP, description=HELP)
    p.add_argument("--model-path", required=True, help="local model directory or HF id")
    p.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--backend", choices=["vllm", "transformers"],
                   help="server kind (default: vllm for cuda, transformers for cpu)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-name", help="model name clients use (default: the model path)")
    p.add_argument("--gpus", type=int, default=1, help="vLLM tensor-parallel size")
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for health")
    p.add_argument("--log", help="server log file (default: a temp file)")
    p.add_argument("--ready-file", help="write 'base_url model' here once healthy")
    p.set_defaults(func=run, command_name="serve")


def run(args: argparse.Namespace) -> int:
    from envace.serving import Server, ServerError, install_signal_handlers

    kind = args.backend or ("vllm" if args.device == "cuda" else "transformers")
    local = Path(args.model_path)
    if args.model_path.startswith((".", "/")) and not local.is_dir():
        raise FileNotFoundError(f"model directory {local} does not exist")
    install_signal_handlers()
    server = Server(kind, args.model_path, host=args.host, port=args.port, served_name=args.served_name,
                    ready_timeout=args.ready_timeout, log_path=args.log, gpus=args.gpus, device=args.device)
    try:
        with server:
            line = f"READY {server.base_url} {server.served_name}"
            print(line, flush=True)
            if args.ready_file:
                ready = Path(args.ready_file)
                ready.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=ready.parent, prefix=".ready.")
                with os.fdopen(fd, "w") as fh:
                    fh.write(line + "\n")
                os.replace(tmp, ready)
            while server.poll() is None:
                time.sleep(1.0)
            print(f"envace serve: error: the server exited with code {server.poll()}; log {server.log_path}",
                  file=sys.stderr)
            return 1
    except ServerError as exc:
        print(f"envace serve: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
