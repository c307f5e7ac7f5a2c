"""Serving (envace.serve.vllm_server) and the HTTP model backend (envace.serve.backends) against a stand-in
server: the
``vllm serve`` command line from the config, health, restart, group shutdown, servers dying with a
kill -9'd parent, the model-path checks. The real ``vllm serve`` tests are in test_vllm.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envace.common.config import ConfigError, load_config
from envace.core.rollout import BackendError
from envace.serve.backends import VLLMCompletionsBackend, sample_seed
from envace.serve.vllm_server import (
    ModelPathError,
    Server,
    ServerError,
    VLLMSettings,
    check_model_path,
    free_port,
    server_command,
)

FAKE = str(Path(__file__).with_name("fake_openai_server.py"))
ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not reaped by its parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_vllm_command_line_comes_from_the_config():
    for name in ("config.yaml", "smoke.yaml"):
        settings = VLLMSettings.from_config(load_config(ROOT / "config" / name))
        cmd = server_command("vllm", "/m/qwen", host="0.0.0.0", port=8123, served_name="qwen3_8b", gpus=2,
                             settings=settings)
        assert cmd[1:3] == ["serve", "/m/qwen"] and cmd[0].endswith("vllm")
        assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
        assert cmd[cmd.index("--served-model-name") + 1] == "qwen3_8b"
        assert cmd[cmd.index("--max-model-len") + 1] == str(settings.max_model_len)
        assert cmd[cmd.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in cmd
        record = settings.record()
        assert record["flags"] == settings.flags() and record["settings"]["dtype"] == settings.dtype
    smoke = VLLMSettings.from_config(load_config(ROOT / "config/smoke.yaml"))
    assert smoke.env["VLLM_CPU_KVCACHE_SPACE"] == "1" and smoke.gpu_memory_utilization <= 0.2
    assert "--reasoning-parser" not in smoke.flags()  # the tiny model does not think
    one_gpu = server_command("vllm", "/m", host="h", port=1, gpus=1, settings=smoke)
    assert "--tensor-parallel-size" not in one_gpu
    with pytest.raises(ValueError, match="vllm serve"):
        server_command("transformers", "/m", host="h", port=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="both"):
        server_command("vllm", "/m", host="h", port=1, settings=smoke, seed=3)


def test_vllm_settings_name_a_missing_key():
    cfg = load_config(ROOT / "config/smoke.yaml")
    del cfg["serving"]["vllm"]["max_model_len"]
    with pytest.raises(ConfigError, match="max_model_len"):
        VLLMSettings.from_config(cfg)
    del cfg["serving"]
    with pytest.raises(ConfigError, match="serving.vllm"):
        VLLMSettings.from_config(cfg)


def test_check_model_path(tmp_path):
    check_model_path("Qwen/Qwen3-8B")  # a Hugging Face id: vLLM fetches it
    with pytest.raises(ModelPathError, match="does not exist") as info:
        check_model_path("/does/not/exist")
    assert "\n" not in str(info.value)
    empty = tmp_path / "global_step_4" / "actor" / "huggingface"
    empty.mkdir(parents=True)
    (empty / "config.json").write_text("{}")
    with pytest.raises(ModelPathError, match="(?s)has no weight files.*hf_model.*save_contents") as info:
        check_model_path(empty)
    assert str(empty) in str(info.value)
    (empty / "model.safetensors").write_bytes(b"")
    check_model_path(empty)
    (empty / "model.safetensors").unlink()
    (empty / "pytorch_model-00001-of-00002.bin").write_bytes(b"")
    check_model_path(empty)


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_server_health_backend_and_group_shutdown(tmp_path):
    pidfile = tmp_path / "child.pid"
    server = Server("vllm", "fake", command=[sys.executable, FAKE, "{port}", str(pidfile)], ready_timeout=30,
                    log_path=tmp_path / "s.log")
    with server:
        assert server.poll() is None and server.base_url.startswith("http://127.0.0.1:")
        assert server.ready_s is not None and server.launches == 1
        vllm = VLLMCompletionsBackend(server.base_url, "fake", server=server, seed=0)
        ids, logprobs = asyncio.run(vllm.generate([1, 2, 3], {"max_tokens": 5, "temperature": 0.6}))
        assert ids == [7, 8, 2] and logprobs == [-0.5, -0.5, -0.5]
        child = int(pidfile.read_text())
        assert _alive(child) and server.watchdog_proc is not None and server.watchdog_proc.poll() is None
        watchdog = server.watchdog_proc.pid
        server.proc.kill()  # the server dies mid-run
        server.proc.wait()
        with pytest.raises(BackendError, match="exited with code"):
            asyncio.run(vllm.generate([1], {"max_tokens": 1}))
    assert _wait_gone([child, watchdog], 10) == []


def test_sample_forks_are_seeded_by_sample_not_by_order():
    backend = VLLMCompletionsBackend("http://127.0.0.1:1/v1", "m", seed=3)
    a, b = backend.for_sample("t1", 0), backend.for_sample("t1", 1)
    assert a.seed == sample_seed(3, "t1", 0) != b.seed
    first = a._body({"max_tokens": 1})["seed"]
    assert a._body({"max_tokens": 1})["seed"] == first + 1  # the fork counts its own requests
    assert backend.for_sample("t1", 0)._body({})["seed"] == first and backend.requests == 0
    assert a._body({"seed": 11})["seed"] == 11  # an explicit request seed wins


def test_exit_code_waits_for_a_killed_server(tmp_path):
    server = Server("vllm", "m", command=[sys.executable, "-c", "import time; time.sleep(60)"],
                    log_path=tmp_path / "s.log", watchdog=False)
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
    assert server.launches == 2  # relaunched once on a new port


def test_server_never_healthy_times_out(tmp_path):
    server = Server("vllm", "x", command=[sys.executable, "-c", "import time; time.sleep(60)"],
                    ready_timeout=1, log_path=tmp_path / "y.log")
    t0 = time.time()
    with pytest.raises(ServerError, match="not healthy"):
        server.start()
    assert time.time() - t0 < 20 and server.proc is None


PARENT = textwrap.dedent(
    """
    import json, sys, time
    from envace.serve.vllm_server import Server
    fake, pidfile, ignore_term = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    cmd = [sys.executable, fake, "{port}", pidfile]
    if ignore_term:  # a server that ignores SIGTERM: the watchdog must escalate to SIGKILL
        code = ("import runpy, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
        cmd = [sys.executable, "-c", code, fake, "{port}", pidfile]
    srv = Server("vllm", "fake", command=cmd, ready_timeout=30, stop_timeout=2).start()
    print(json.dumps({"server": srv.proc.pid, "watchdog": srv.watchdog_proc.pid}), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("ignore_term", [False, True],
                         ids=["server-exits-on-sigterm", "server-ignores-sigterm"])
def test_servers_die_with_a_parent_killed_by_sigkill(tmp_path, ignore_term):
    """kill -9 of the process that started a server: the parent-death signal and the watchdog take the
    server and its child (as vLLM's engine core) down; nothing is left with parent pid 1."""
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, FAKE, str(pidfile), "1" if ignore_term else "0"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        pids = json.loads(parent.stdout.readline())
        child = int(pidfile.read_text())
        group = [pids["server"], child, pids["watchdog"]]
        assert all(_alive(p) for p in group)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert _wait_gone(group, 15) == [], "a server process outlived its kill -9'd parent"
    finally:
        parent.kill()
        for pid in (locals().get("group") or []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
