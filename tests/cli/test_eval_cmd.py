"""``envace eval`` / ``serve`` / ``selfcheck`` command lines (``--backend hf``: the tiny model in-process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from envace.cli.main import main
from envace.common.config import eval_hash, load_config
from envace.common.results import read_results
from envace.serve.checkpoints import resolve_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from envace.serve.tiny_model import build_tiny_model

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
    # a TTS run commits with its suite's actor (tts.actor), not another model
    assert main(base + ["--benchmark", "tau2", "--tts-setting", "no_tts"]) == 1
    assert "commits with its suite's actor" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, setting",
    [
        (["--tts-setting", "sequential_n2_base"], "sequential_n2_base"),
        (["--tts", "parallel", "--n", "1", "--rehearser", "qwen3_8b"], "parallel_n1_base"),
    ],
)
def test_eval_with_test_time_scaling(tiny_dir, fast_config, tmp_path, flags, setting):
    """TTS through the real eval path: rehearsals by the rehearser, one commit, stored as a TTS result."""
    from envace.common.config import tts_hash

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
    smoke = str(ROOT / "config/smoke.yaml")
    assert main(["serve", "--config", smoke, "--model-path", "./no/such/model"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_eval_refuses_a_missing_path_in_one_line(fast_config, tmp_path, capsys):
    argv = ["eval", "--config", str(fast_config), "--model", "qwen3_8b", "--model-path", "/does/not/exist",
            "--benchmark", "finmcp", "--seed", "0", "--out", str(tmp_path / "o.jsonl")]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err == "envace eval: error: model path /does/not/exist does not exist"


def test_eval_refuses_a_checkpoint_without_weights(fast_config, tmp_path, capsys):
    """A verl checkpoint saved without 'hf_model': actor/huggingface/ holds config and tokenizer only."""
    hf = tmp_path / "ckpt" / "global_step_4" / "actor" / "huggingface"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "tokenizer.json").write_text("{}")
    argv = ["eval", "--config", str(fast_config), "--model", "envace_8b", "--checkpoint-dir",
            str(tmp_path / "ckpt"), "--benchmark", "finmcp", "--seed", "0", "--out",
            str(tmp_path / "o.jsonl")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert str(hf) in err and "no weight files" in err and "save_contents" in err
    assert len(err.splitlines()) == 1


def test_eval_job_runs_every_benchmark_and_seed_and_restores_finished_runs(tiny_dir, fast_config, tmp_path,
                                                                           capsys):
    """One job, several runs (--out template); a run finished by a job that failed later is restored from
    its kept link (Snakemake deletes a failed job's outputs), not run again."""
    from envace.common.results import manifest_path

    cfg = yaml.safe_load(fast_config.read_text())
    cfg["benchmarks"]["finmcp"]["limit"] = 1
    cfg["benchmarks"]["bfcl_multi_turn"]["limit"] = 1
    fast_config.write_text(yaml.safe_dump(cfg))
    template = str(tmp_path / "eval/qwen3_8b/{benchmark}/seed{seed}.jsonl")
    argv = ["eval", "--config", str(fast_config), "--model", "qwen3_8b", "--model-path", str(tiny_dir),
            "--benchmark", "finmcp", "bfcl_multi_turn", "--seed", "0", "1", "--out", template,
            "--backend", "hf", "--no-progress"]
    assert main(argv) == 0
    files = [tmp_path / f"eval/qwen3_8b/{b}/seed{s}.jsonl"
             for b in ("finmcp", "bfcl_multi_turn") for s in (0, 1)]
    loaded = load_config(fast_config)
    for path in files:
        res = read_results(path, expected_hash=eval_hash(loaded, "qwen3_8b", path.parent.name))
        assert res.manifest["seed"] == int(path.stem[-1]) and "serving" in res.manifest
    assert not list(tmp_path.rglob(".done"))
    first_manifest = manifest_path(files[0]).read_text()

    # a job that finished finmcp seed0 and then failed: Snakemake removed every output, the link stays
    kept = files[0].parent / ".done"
    kept.mkdir()
    for f in (files[0], manifest_path(files[0])):
        os.link(f, kept / f.name)
    for f in files:
        f.unlink()
        manifest_path(f).unlink()
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"{files[0]}: restored" in err and "3 runs" in err
    assert manifest_path(files[0]).read_text() == first_manifest and all(f.exists() for f in files)
    assert not kept.exists()

    collide = [a if a != template else str(tmp_path / "one.jsonl") for a in argv]
    assert main(collide) == 1
    assert "same file" in capsys.readouterr().err


def test_gpu_split_helpers(monkeypatch):
    from envace.serve.eval_plan import model_size
    from envace.serve.job import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5")
    assert visible_gpus() == ["2", "3", "5"]
    cfg = load_config(ROOT / "config/config.yaml")
    assert model_size(cfg, "awm_14b") == "14B"
    assert model_size(cfg, "envace_1p7b-step0050") == "1.7B"


def _plan(tmp_path: Path, items: list) -> str:
    import json

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(items))
    return str(path)


def test_a_plan_runs_several_models_in_one_job(tiny_dir, fast_config, tmp_path, capsys):
    """Several models in one job; the same evaluation of the same weights under a second model id (AWM-8B
    is the tiny model too) runs once and is copied, a different seed is not."""
    cfg = yaml.safe_load(fast_config.read_text())
    cfg["benchmarks"]["finmcp"]["limit"] = 1
    fast_config.write_text(yaml.safe_dump(cfg))
    template = str(tmp_path / "eval/{model}/{benchmark}/seed{seed}.jsonl")
    items = [{"model": m, "model_path": str(tiny_dir), "benchmark": ["finmcp"], "seed": seeds,
              "out": template} for m, seeds in (("qwen3_8b", [0]), ("awm_8b", [0, 1]))]
    argv = ["eval", "--config", str(fast_config), "--plan", _plan(tmp_path, items), "--backend", "hf",
            "--no-progress"]
    assert main(argv) == 0
    assert "2 runs" in capsys.readouterr().err.splitlines()[-1]
    loaded = load_config(fast_config)
    res = {}
    for m, seed in (("qwen3_8b", 0), ("awm_8b", 0), ("awm_8b", 1)):
        res[m, seed] = read_results(tmp_path / f"eval/{m}/finmcp/seed{seed}.jsonl",
                                    expected_hash=eval_hash(loaded, m, "finmcp"))
        assert res[m, seed].manifest["model"] == m
    source = tmp_path / "eval/qwen3_8b/finmcp/seed0.jsonl"
    copy = res["awm_8b", 0].manifest
    assert copy["copied_from"] == str(source) and "timing" not in copy
    assert (tmp_path / "eval/awm_8b/finmcp/seed0.jsonl").read_bytes() == source.read_bytes()
    assert "copied_from" not in res["awm_8b", 1].manifest and "timing" in res["awm_8b", 1].manifest

    # an attempt that finished the two evaluations and failed before the copy: Snakemake removed every
    # output, the kept links stay; the retry restores both and copies the source
    from envace.common.results import manifest_path

    for f in (source, tmp_path / "eval/awm_8b/finmcp/seed1.jsonl"):
        (f.parent / ".done").mkdir(exist_ok=True)
        for g in (f, manifest_path(f)):
            os.link(g, f.parent / ".done" / g.name)
    for f in tmp_path.glob("eval/*/finmcp/seed*"):
        f.unlink()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "all 2 evaluations were already finished; 1 copied" in err and "(awm_8b)" in err
    assert read_results(tmp_path / "eval/awm_8b/finmcp/seed0.jsonl").manifest["copied_from"] == str(source)


@pytest.mark.parametrize("items, message", [
    ([], "non-empty JSON list"),
    ([{"model": "qwen3_8b", "benchmark": ["finmcp"], "seed": [0], "out": "o.jsonl"}],
     "item 0: give exactly one of 'model_path' and 'checkpoint_dir'"),
    ([{"model": "qwen3_8b", "model_path": "x", "benchmark": "finmcp", "seed": [0], "out": "o.jsonl"}],
     "item 0: 'benchmark' must be a list"),
    ([{"model": "qwen3_8b", "model_path": "x", "benchmark": ["finmcp"], "seed": [0], "out": "o.jsonl",
       "gpu": 1}], "item 0: unknown key(s) ['gpu']"),
    ([{"model": "qwen3_8b", "model_path": "x", "fidelity_results": ["r.jsonl"], "seed": [0],
       "out": "f.json"}],
     "item 0: a fidelity item has no ['seed']"),
])
def test_a_malformed_plan_is_refused_naming_the_item_and_key(fast_config, tmp_path, capsys, items, message):
    argv = ["eval", "--config", str(fast_config), "--plan", _plan(tmp_path, items)]
    assert main(argv) == 1
    assert message in capsys.readouterr().err


def test_a_plan_with_single_evaluation_flags_is_refused(fast_config, tmp_path, capsys):
    argv = ["eval", "--config", str(fast_config), "--plan", _plan(tmp_path, [{}]), "--model", "qwen3_8b"]
    assert main(argv) == 1
    assert "--plan replaces the single evaluation's flags: drop --model" in capsys.readouterr().err


def test_a_plan_serves_each_path_once_and_stops_it_after_its_last_use(tiny_dir, fast_config, tmp_path,
                                                                      monkeypatch):
    """Three models, two weight folders, each on tau2 (whose user simulator is the first folder): the
    helper path runs through the whole job, each model's own path only while its items run."""
    import shutil

    from envace.cli import eval as eval_cmd
    from envace.serve import vllm_server

    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    cfg = yaml.safe_load(fast_config.read_text())
    cfg["benchmarks"]["tau2"]["user_simulator"] = str(tiny_dir)
    fast_config.write_text(yaml.safe_dump(cfg))
    events: list[tuple[str, str]] = []

    class FakeServer:
        def __init__(self, kind, path, **kw):
            self.model_path, self.kind, self.ready_s, self.launches = path, kind, None, 0
            self.base_url = "http://127.0.0.1:1/v1"

        def launch(self):
            events.append(("launch", self.model_path))
            self.launches += 1
            return self

        def wait_ready(self):
            events.append(("ready", self.model_path))
            self.ready_s = 0.0
            return self

        def cpu_seconds(self):
            return 1.0

        def stop(self):
            events.append(("stop", self.model_path))

    def fake_evaluate(job, args, entry, todo, needs):
        job.launch(needs, todo[0].out)
        job.wait(needs)
        events.append(("evaluate", entry.model))
        return 0

    monkeypatch.setattr(vllm_server, "Server", FakeServer)
    monkeypatch.setattr(eval_cmd, "evaluate_entry", fake_evaluate)
    template = str(tmp_path / "eval/{model}/{benchmark}/seed{seed}.jsonl")
    # envscaler_8b at another seed: at seed 0 it would be qwen3_8b's evaluation again (copied, not run)
    items = [{"model": m, "model_path": str(p), "benchmark": ["tau2"], "seed": [seed], "out": template}
             for m, p, seed in (("qwen3_8b", tiny_dir, 0), ("awm_8b", other, 0),
                                ("envscaler_8b", tiny_dir, 1))]
    argv = ["eval", "--config", str(fast_config), "--plan", _plan(tmp_path, items), "--no-progress"]
    assert main(argv) == 0
    # a kept server is not waited for again (its start-up time stays the one it took)
    assert events == [("launch", str(tiny_dir)), ("ready", str(tiny_dir)), ("evaluate", "qwen3_8b"),
                      ("launch", str(other)), ("ready", str(other)), ("evaluate", "awm_8b"),
                      ("stop", str(other)), ("evaluate", "envscaler_8b"), ("stop", str(tiny_dir))]


def test_a_plan_fidelity_item_reads_the_results_an_earlier_item_wrote(tiny_dir, fast_config, tmp_path):
    import json

    cfg = yaml.safe_load(fast_config.read_text())
    cfg["benchmarks"]["bfcl_multi_turn"]["limit"] = 1
    fast_config.write_text(yaml.safe_dump(cfg))
    results = tmp_path / "eval/qwen3_8b/bfcl_multi_turn/seed0.jsonl"
    fid = tmp_path / "fidelity/qwen3_8b/bfcl_multi_turn.json"
    items = [{"model": "qwen3_8b", "model_path": str(tiny_dir), "benchmark": ["bfcl_multi_turn"], "seed": [0],
              "out": str(results)},
             {"model": "qwen3_8b", "model_path": str(tiny_dir), "fidelity_results": [str(results)],
              "out": str(fid)}]
    argv = ["eval", "--config", str(fast_config), "--plan", _plan(tmp_path, items), "--backend", "hf",
            "--no-progress"]
    assert main(argv) == 0
    doc = json.loads(fid.read_text())
    assert doc["model"] == "qwen3_8b" and doc["benchmark"] == "bfcl_multi_turn"
    assert doc["sources"][0]["path"] == str(results)
