"""The episode driver and resumable result writing (envace.bench.runner)."""

from __future__ import annotations

import asyncio
import json

import pytest

from envace.bench.runner import PartialResults, run_samples
from envace.bench.scripted import CharTokenizer, ScriptedBackend
from envace.common.results import read_results
from envace.core.environment import Services
from envace.core.rollout import BackendError, Mode
from envace.core.tools import ToolCall, render_tool_call
from tests.fixtures import eval_rules

HASH = "0123456789abcdef"
CFG = eval_rules(mode=Mode.REAL, max_turns=10, max_prompt_tokens=10**6, max_response_tokens=10**6,
                    act_sampling={"max_tokens": 10**6})
PING = render_tool_call(ToolCall("ping", {}))


def _run(adapter, out, script, samples=1, backend_for=None, config=CFG):
    tok = CharTokenizer()
    tasks = adapter.load_tasks(["s"], None)
    return asyncio.run(run_samples(
        adapter=adapter, tasks=tasks, samples=samples, seed=3, services=Services(),
        backend_for=backend_for or (lambda t, s: ScriptedBackend(script, tok)), tokenizer=tok, config=config,
        out=out, manifest={"model": "m", "scale": "smoke", "config_hash": HASH, "git_commit": "x",
                           "package_versions": {}}, progress=False))


def test_episode_runs_user_turns_and_scores(toy, tmp_path):
    path, stats = _run(toy, tmp_path / "r.jsonl", [PING, "first", PING, "second"], samples=2)
    res = read_results(path, expected_hash=HASH)
    keys = [(x["task_id"], x["sample"]) for x in res.lines]
    assert keys == [(f"t{i}", s) for i in range(3) for s in (0, 1)]
    assert all(x["status"] == "ok" and x["score"] == 1.0 for x in res.lines)
    msgs = res.lines[0]["trajectory"]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "user",
                                         "assistant", "tool", "assistant"]
    assert stats.samples == 6 and not (tmp_path / "r.jsonl.partial.jsonl").exists()
    timing = res.manifest["timing"]
    assert timing["samples"] == 6 and 0 <= timing["model_s"] <= timing["wall_s"]


def test_garbage_and_endless_output_become_failed_samples(toy, tmp_path):
    path, _ = _run(toy, tmp_path / "g.jsonl", ["<tool_call>{not json</tool_call>"])
    lines = read_results(path).lines
    assert all(x["status"] == "failed" and x["score"] == 0 for x in lines)
    assert all("act_parse_error" in x["reason"] for x in lines)
    endless = eval_rules(mode=Mode.REAL, max_turns=10, max_prompt_tokens=10**6, max_response_tokens=20,
                            act_sampling={"max_tokens": 20})
    path, _ = _run(toy, tmp_path / "e.jsonl", ["x" * 100], config=endless)
    assert all("context_limit" in x["reason"] for x in read_results(path).lines)
    path, _ = _run(toy, tmp_path / "m.jsonl", [PING] * 50)  # never stops calling tools
    assert all("max_turns" in x["reason"] for x in read_results(path).lines)


def test_unknown_tool_is_an_observation_not_a_failure(toy, tmp_path):
    bad = render_tool_call(ToolCall("nope", {"a": 1}))
    path, _ = _run(toy, tmp_path / "u.jsonl", [bad, "a", "b"])
    line = read_results(path).lines[0]
    assert line["status"] == "ok" and line["score"] == 0.0
    assert line["trajectory"]["messages"][3]["content"] == "error: unknown tool nope"


def test_episode_exception_is_a_failed_sample(toy_cls, tmp_path):
    adapter = toy_cls(fail={"t1": "step"})
    path, _ = _run(adapter, tmp_path / "x.jsonl", [PING, "a", PING, "b"])
    by_id = {x["task_id"]: x for x in read_results(path).lines}
    assert by_id["t1"]["status"] == "failed" and "environment exploded" in by_id["t1"]["reason"]
    assert by_id["t0"]["status"] == "ok" and by_id["t2"]["score"] == 1.0


class _DyingBackend:
    """Works for ``ok`` calls, then raises like a dead server."""

    def __init__(self, ok: int) -> None:
        self.left = ok
        self.inner = ScriptedBackend([PING, "a", PING, "b"] * 10)

    async def generate(self, prompt_ids, params):
        if self.left <= 0:
            raise BackendError("model server died")
        self.left -= 1
        return await self.inner.generate(prompt_ids, params)


def test_server_death_stops_the_run_and_resume_completes_it(toy, tmp_path):
    out = tmp_path / "d.jsonl"
    dying = _DyingBackend(ok=4 * 2)  # two samples' worth of generations
    with pytest.raises(BackendError):
        _run(toy, out, None, backend_for=lambda t, s: dying)
    partial = out.with_name(out.name + ".partial.jsonl")
    kept = [json.loads(x) for x in partial.read_text().splitlines()]
    assert [x["task_id"] for x in kept] == ["t0", "t1"] and not out.exists()
    # a crash mid-write leaves a truncated line: it is dropped on resume
    with open(partial, "a") as fh:
        fh.write('{"benchmark": "toy", "task_')
    toy.episodes.clear()
    path, stats = _run(toy, out, [PING, "a", PING, "b"])
    lines = read_results(path, expected_hash=HASH).lines
    assert [x["task_id"] for x in lines] == ["t0", "t1", "t2"]
    assert toy.episodes == [("t2", 0)] and stats.samples == 1


def test_partial_results_of_another_config_are_discarded(tmp_path):
    out = tmp_path / "p.jsonl"
    first = PartialResults(out, HASH)
    first.append({"benchmark": "toy", "split": "s", "task_id": "a", "sample": 0, "seed": 3, "score": 1.0,
                  "subscores": {}, "status": "ok", "reason": None})
    assert PartialResults(out, HASH).lines.keys() == {("a", 0)}
    assert PartialResults(out, "f" * 16).lines == {}


def test_new_episode_failure_is_a_failed_sample(toy, tmp_path, monkeypatch):
    real = toy.new_episode

    def flaky(task, sample, seed, services):
        if task.task_id == "t0":
            raise KeyError("scenario missing")
        return real(task, sample, seed, services)

    monkeypatch.setattr(toy, "new_episode", flaky)
    path, _ = _run(toy, tmp_path / "n.jsonl", [PING, "a", PING, "b"])
    lines = read_results(path).lines
    assert lines[0]["status"] == "failed" and "scenario missing" in lines[0]["reason"]
    assert [x["status"] for x in lines[1:]] == ["ok", "ok"]
