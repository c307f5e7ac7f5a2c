"""Serving (envace.serving) and the HTTP model backends (envace.backends), against a stand-in server;
one test starts the real ``transformers serve`` with the tiny model."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envace.backends import TextCompletionsBackend, VLLMCompletionsBackend
from envace.bench.runner import BackendError
from envace.serving import ServedModel, Server, ServerError, free_port, server_command

FAKE = str(Path(__file__).with_name("fake_openai_server.py"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not reaped by its parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_vllm_and_transformers_command_lines():
    cmd = server_command("vllm", "/m/qwen", host="0.0.0.0", port=8123, served_name="qwen3_8b", gpus=2, seed=3,
                         max_model_len=20480)
    assert cmd[1:3] == ["serve", "/m/qwen"] and cmd[0].endswith("vllm")
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags == {"--host": "0.0.0.0", "--port": "8123", "--served-model-name": "qwen3_8b",
                     "--tensor-parallel-size": "2", "--seed": "3", "--max-model-len": "20480"}
    cmd = server_command("transformers", "/m/tiny", host="127.0.0.1", port=9, device="cpu")
    assert cmd[1:3] == ["serve", "/m/tiny"] and cmd[cmd.index("--device") + 1] == "cpu"
    multi = server_command("transformers", "", host="127.0.0.1", port=9, device="cpu")
    assert multi[1:3] == ["serve", "--host"] and "--model-timeout" in multi  # nothing pinned
    with pytest.raises(ValueError):
        server_command("tgi", "/m", host="h", port=1)  # type: ignore[arg-type]


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_server_health_backends_and_group_shutdown(tmp_path):
    pidfile = tmp_path / "child.pid"
    server = Server("vllm", "fake", command=[sys.executable, FAKE, "{port}", str(pidfile)], ready_timeout=30,
                    log_path=tmp_path / "s.log")
    with server:
        assert server.poll() is None and server.base_url.startswith("http://127.0.0.1:")
        vllm = VLLMCompletionsBackend(server.base_url, "fake", server=server, seed=0)
        ids, logprobs = asyncio.run(vllm.generate([1, 2, 3], {"max_tokens": 5, "temperature": 0.6}))
        assert ids == [7, 8, 2] and logprobs == [-0.5, -0.5, -0.5]
        from envace.bench.scripted import CharTokenizer

        text = TextCompletionsBackend(server.base_url, "fake", CharTokenizer(), server=server)
        ids, logprobs = asyncio.run(text.generate([104, 105], {"max_tokens": 50}))
        assert CharTokenizer().decode(ids) == "ok<|im_end|>" and logprobs == [0.0] * len(ids)
        child = int(pidfile.read_text())
        assert _alive(child)
        server.proc.kill()  # the server dies mid-run
        server.proc.wait()
        with pytest.raises(BackendError, match="exited with code"):
            asyncio.run(vllm.generate([1], {"max_tokens": 1}))
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_exit_code_waits_for_a_killed_server(tmp_path):
    server = Server("transformers", "m", command=[sys.executable, "-c", "import time; time.sleep(60)"],
                    log_path=tmp_path / "s.log")
    server.proc = subprocess.Popen(server.argv(0), start_new_session=True)
    assert server.exit_code(wait=0.1) is None
    os.killpg(server.proc.pid, signal.SIGKILL)
    assert server.exit_code(wait=5.0) == -signal.SIGKILL
    server.stop()


def test_server_that_exits_early_fails_with_its_log(tmp_path):
    script = "import sys; print('boom: no GPU'); sys.exit(3)"
    server = Server("vllm", "x", command=[sys.executable, "-c", script], ready_timeout=30, attempts=2,
                    log_path=tmp_path / "x.log")
    with pytest.raises(ServerError, match="(?s)exited with code 3.*boom: no GPU"):
        server.start()


def test_server_never_healthy_times_out(tmp_path):
    server = Server("vllm", "x", command=[sys.executable, "-c", "import time; time.sleep(60)"],
                    ready_timeout=1, log_path=tmp_path / "y.log")
    t0 = time.time()
    with pytest.raises(ServerError, match="not healthy"):
        server.start()
    assert time.time() - t0 < 20 and server.proc is None


def test_real_transformers_serve_with_the_tiny_model(tmp_path):
    """What `envace eval` does on CPU: one unpinned server, each model named by its path."""
    from envace.tiny_model import build_tiny_model, tiny_model_and_tokenizer

    first = build_tiny_model(tmp_path / "tiny0", seed=0)
    second = build_tiny_model(tmp_path / "tiny1", seed=1)
    _, tok = tiny_model_and_tokenizer()
    chat = [{"role": "user", "content": "hi"}]
    prompt = tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
    params = {"max_tokens": 4, "temperature": 0.0}
    with Server("transformers", "", ready_timeout=90, log_path=tmp_path / "ts.log") as server:
        outputs = []
        for model_dir in (first, second):
            served = ServedModel(server, str(model_dir))
            backend = TextCompletionsBackend(served.base_url, served.served_name, tok, server=served, seed=0)
            ids, _ = asyncio.run(backend.generate(prompt, params))
            assert 1 <= len(ids) <= 4
            outputs.append(ids)
        pid = server.proc.pid
    assert not _alive(pid) and len(outputs) == 2
