"""``envace eval`` / ``serve`` / ``selfcheck`` command lines (``--backend hf``: the tiny model in-process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from envace.cli import main
from envace.commands.eval import resolve_checkpoint
from envace.config import eval_hash, load_config
from envace.results import read_results

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from envace.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def fast_config(tmp_path) -> Path:
    cfg = yaml.safe_load((ROOT / "config/smoke.yaml").read_text())
    cfg["evaluation"]["sampling"].update(max_tokens=12, max_turns=2)
    cfg["benchmarks"]["finmcp"]["data"] = str(ROOT / "tests/data/finmcp/fixture.json")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_eval_hf_backend_writes_results_and_manifest(tiny_dir, fast_config, tmp_path, capsys):
    out = tmp_path / "eval/qwen3_8b/finmcp/seed1.jsonl"
    argv = [
        "eval",
        "--config",
        str(fast_config),
        "--model",
        "qwen3_8b",
        "--model-path",
        str(tiny_dir),
        "--benchmark",
        "finmcp",
        "--seed",
        "1",
        "--out",
        str(out),
        "--backend",
        "hf",
        "--no-progress",
    ]
    assert main(argv) == 0
    cfg = load_config(fast_config)
    res = read_results(out, expected_hash=eval_hash(cfg, "qwen3_8b", "finmcp"))
    assert [x["task_id"] for x in res.lines] == ["1", "2", "3"] and res.manifest["seed"] == 1
    assert res.manifest["package_versions"]["finmcp-data"].startswith("fixture.json@sha256:")
    for line in res.lines:  # an untrained model: whatever it emits becomes a scored or failed sample
        assert line["status"] in ("ok", "failed") and (line["status"] == "ok") == (line["reason"] is None)
        assert set(line["subscores"]) <= {"tp", "tr", "tf1"}
    assert not out.with_name(out.name + ".partial.jsonl").exists()
    assert "outside the model" in capsys.readouterr().err


def test_eval_rejects_unknown_tts_setting_and_benchmark(fast_config, tmp_path, capsys):
    base = [
        "eval",
        "--config",
        str(fast_config),
        "--model",
        "qwen3_8b",
        "--model-path",
        "x",
        "--seed",
        "0",
        "--out",
        str(tmp_path / "o.jsonl"),
    ]
    assert main(base + ["--benchmark", "tau2", "--tts-setting", "parallel_n9_envace"]) == 1
    assert "unknown TTS setting" in capsys.readouterr().err
    assert main(base + ["--benchmark", "tau2", "--tts", "parallel", "--n", "2", "--rehearser", "nope"]) == 1
    assert "tts.rehearsers" in capsys.readouterr().err
    assert main(base + ["--benchmark", "nope"]) == 1
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, setting",
    [
        (["--tts-setting", "sequential_n2_base"], "sequential_n2_base"),
        (["--tts", "parallel", "--n", "1", "--rehearser", "qwen3_8b"], "parallel_n1_base"),
    ],
)
def test_eval_with_test_time_scaling(tiny_dir, fast_config, tmp_path, flags, setting):
    """TTS through the real eval path: rehearsals by the rehearser, one commit, stored as a TTS result."""
    from envace.config import tts_hash

    cfg = yaml.safe_load(fast_config.read_text())
    cfg["benchmarks"]["finmcp"]["limit"] = 1
    cfg["models"]["qwen3_8b"]["path"] = str(tiny_dir)
    cfg["tts"].update(attempt_max_tokens=16, memory_max_tokens=16)
    fast_config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / f"tts/{setting}/finmcp/seed0.jsonl"
    argv = [
        "eval",
        "--config",
        str(fast_config),
        "--model",
        "envace_8b",
        "--model-path",
        str(tiny_dir),
        "--benchmark",
        "finmcp",
        "--seed",
        "0",
        "--out",
        str(out),
        "--backend",
        "hf",
        "--no-progress",
    ]
    assert main(argv + flags) == 0
    res = read_results(out, expected_hash=tts_hash(load_config(fast_config), setting, "finmcp"))
    assert res.manifest["model"] == setting
    assert len(res.lines) == 1
    record = res.lines[0]["extra"]["tts"]  # kept for failed commits too
    assert len(record["attempts"]) == int(setting.split("_")[1][1:])


def test_resolve_checkpoint(tmp_path):
    for name in ("global_step_50", "global_step_100"):
        (tmp_path / name / "actor/huggingface").mkdir(parents=True)
        (tmp_path / name / "actor/huggingface/config.json").write_text("{}")
    assert resolve_checkpoint(tmp_path, None) == tmp_path / "global_step_100/actor/huggingface"
    assert resolve_checkpoint(tmp_path, 50) == tmp_path / "global_step_50/actor/huggingface"
    with pytest.raises(FileNotFoundError, match="step 7"):
        resolve_checkpoint(tmp_path, 7)
    with pytest.raises(FileNotFoundError):
        resolve_checkpoint(tmp_path / "missing", None)


def test_selfcheck_command_prints_passed_over_total(capsys):
    assert main(["selfcheck", "bfcl_multi_turn", "--limit", "2"]) == 0
    assert capsys.readouterr().out.strip() == "8/8"


def test_serve_rejects_a_missing_local_model(capsys):
    assert main(["serve", "--model-path", "./no/such/model", "--device", "cpu"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_gpu_split_helpers(monkeypatch):
    from envace.commands.eval import _model_size, _visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5")
    assert _visible_gpus() == ["2", "3", "5"]
    cfg = load_config(ROOT / "config/config.yaml")
    assert _model_size(cfg, "awm_14b") == "14B"
    assert _model_size(cfg, "envace_1p7b-step0050") == "1.7B"


def test_tts_episode_turns_episode_errors_into_failed_samples():
    """An exception from the episode during TTS (e.g. the simulated user's opening) fails the sample."""
    import asyncio
    from types import SimpleNamespace

    from envace.commands.eval import _tts_episode_fn
    from envace.rollout import RolloutConfig

    class BrokenOpening:
        def first_user_message(self) -> str:
            raise RuntimeError("user simulator returned nothing")

    cfg = {"tts": {"attempt_max_tokens": 8, "memory_max_tokens": 8}}
    fn = _tts_episode_fn(cfg, "parallel_n1_base", rehearser=None, rehearser_tokenizer=None)
    task = SimpleNamespace(system=None, first_user="", tools=[])
    fields = asyncio.run(fn(task, BrokenOpening(), None, None, RolloutConfig()))
    assert fields["status"] == "failed" and "user simulator returned nothing" in fields["reason"]
