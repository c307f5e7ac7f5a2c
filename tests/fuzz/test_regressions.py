"""One regression test per case of the issue "Bad input never ends a run" (items 4 and 5, serving, are
tested with the server code). Each of these failed before the fix: a crash, a hang of minutes, a silent
plan or a silent resume."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from envace.bench.runner import PartialResults, run_samples
from envace.bench.scripted import CharTokenizer, ScriptedBackend
from envace.cli.main import run
from envace.common.results import ResultsError, eval_path, read_results
from envace.core.environment import Score, Services, Task
from envace.core.rehearsal import (
    CallCandidate,
    OutcomeKind,
    RehearsalError,
    ToolRegistry,
    parse_rehearsal_output,
    precheck_call,
)
from envace.core.rollout import Mode, RolloutConfig
from envace.core.tools import ParseError, ToolCall, parse_tool_calls, render_tool_call
from envace.core.tts import parse_evaluation

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
EXAMPLE_CONFIG = DATA / "example_config.yaml"
HASH = "0123456789abcdef"
CFG = RolloutConfig(mode=Mode.REAL, max_turns=10, max_prompt_tokens=10**6, max_response_tokens=10**6,
                    act_sampling={"max_tokens": 10**6})
PING = render_tool_call(ToolCall("ping", {}))
SURROGATE_CALL = '<tool_call>{"name": "ping", "arguments": {"x": "\\ud800"}}</tool_call>'  # six characters


# ---------------------------------------------------------------- a toy benchmark
class _Episode:
    """Answers ``pong``, or raises with ``fail`` as the message; the scorer's details hold ``echo``
    (e.g. a file name decoded with ``surrogateescape``)."""

    def __init__(self, echo: str, fail: str | None, subscores: dict[str, Any]) -> None:
        self.echo = echo
        self.fail = fail
        self.subscores = subscores
        self.replies = 0

    def step(self, call: ToolCall) -> str:
        if self.fail is not None:
            raise RuntimeError(self.fail)
        return "pong"

    def user_reply(self, assistant_text: str) -> str | None:
        self.replies += 1
        return None

    def score(self) -> Score:
        return Score(score=1.0, subscores=self.subscores, extra={"echo": self.echo})


class _Adapter:
    name = "toy"

    def __init__(self, echo: str = "pong", fail: str | None = None,
                 subscores: dict[str, Any] | None = None) -> None:
        self.echo = echo
        self.fail = fail
        self.subscores = subscores or {}

    def versions(self) -> dict[str, str]:
        return {}

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        tools = [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}]
        return [Task(f"t{i}", "s", "sys", "hello", tools) for i in range(3)]

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Any:
        return _Episode(self.echo, self.fail, self.subscores)


def _run(adapter: _Adapter, out: Path, script: list[str], config: RolloutConfig = CFG) -> Path:
    tok = CharTokenizer()
    path, _ = asyncio.run(run_samples(
        adapter=adapter, tasks=adapter.load_tasks(["s"], None), samples=1, seed=0, services=Services(),
        backend_for=lambda t, s: ScriptedBackend(script, tok), tokenizer=tok, config=config, out=out,
        manifest={"model": "m", "scale": "smoke", "config_hash": HASH, "git_commit": "x",
                  "package_versions": {}},
        progress=False))
    return path


# ---------------------------------------------------------------- 1. a lone surrogate ends the run
def test_1_a_lone_surrogate_in_a_tool_call_is_a_failed_sample_not_an_aborted_run(tmp_path: Path) -> None:
    assert parse_tool_calls(SURROGATE_CALL).error == ParseError.INVALID_UNICODE
    lines = read_results(_run(_Adapter(), tmp_path / "r.jsonl", [SURROGATE_CALL, "done"])).lines
    assert [x["task_id"] for x in lines] == ["t0", "t1", "t2"]
    assert all(x["status"] == "failed" and "act_parse_error" in x["reason"] for x in lines)
    observed = dataclasses.replace(CFG, on_act_parse_error="observe")
    lines = read_results(_run(_Adapter(), tmp_path / "o.jsonl", [SURROGATE_CALL, "done"], observed)).lines
    tool = [m for m in lines[0]["trajectory"]["messages"] if m["role"] == "tool"]
    assert lines[0]["status"] == "ok" and "INVALID_UNICODE" in tool[0]["content"]


def test_1_the_writer_replaces_and_records_what_utf8_cannot_carry(tmp_path: Path) -> None:
    lines = read_results(_run(_Adapter(echo="caf\udce9"), tmp_path / "r.jsonl", [PING, "done"])).lines
    assert len(lines) == 3 and all(x["status"] == "ok" for x in lines)
    assert lines[0]["json_repairs"] == {"lone_surrogates": 1} and lines[0]["extra"]["echo"] == "caf\ufffd"
    failing = _Adapter(fail="no file caf\udce9 or \udc80")  # an exception message is the failure reason
    res = read_results(_run(failing, tmp_path / "f.jsonl", [PING, "done"]))
    lines = res.lines
    assert [x["status"] for x in lines] == ["failed"] * 3
    assert lines[0]["reason"] == "episode: RuntimeError: no file caf\ufffd or \ufffd"
    assert lines[0]["extra"] == {"exception": {"type": "RuntimeError", "where": "episode"}}
    assert res.manifest["counts"] == {"failed": 3, "exceptions": 3}  # told apart from a model's failures
    assert lines[0]["json_repairs"] == {"lone_surrogates": 2}
    for bad in (float("nan"), 1.5, "high"):  # a scorer's bad sub-score: a failed sample, the run goes on
        out = tmp_path / f"s{bad}.jsonl"
        lines = read_results(_run(_Adapter(subscores={"a": bad}), out, [PING, "done"])).lines
        assert [x["status"] for x in lines] == ["failed"] * 3
        assert "sub-scores out of range" in lines[0]["reason"]
    partial = PartialResults(tmp_path / "p.jsonl", HASH)
    stored = partial.append({"task_id": "a", "sample": 0, "trajectory": [float("nan"), b"\x00", "\ud800"]})
    assert stored["trajectory"] == ["NaN", "b'\\x00'", "\ufffd"]
    assert stored["json_repairs"] == {"lone_surrogates": 1, "non_finite_numbers": 1, "unserializable": 1}


# ---------------------------------------------------------------- 2. an unhashable "error" value
@pytest.mark.parametrize("error", ["{}", "[]", "[1]", "null", "3"])
def test_2_an_unhashable_error_field_is_a_result(error: str) -> None:
    out = parse_rehearsal_output(f'<execution_result>{{"error": {error}}}</execution_result>')
    assert out.kind == OutcomeKind.RESULT and out.result == {"error": json.loads(error)}


# ---------------------------------------------------------------- 3. quadratic parsing
LIMIT_S = 5.0  # before the fix: 50 s, 142 s; now milliseconds (generous for a loaded 2-core machine)


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_tool_calls, "<think>" * 30000),
        (parse_tool_calls, "<think></think>" * 15000 + "<think>" * 15000),
        (parse_rehearsal_output, "<execution_result>" * 30000),
        (parse_rehearsal_output, "</think>" + "<execution_result>" * 30000),
        (parse_evaluation, "<evaluation>" * 30000),
    ],
    ids=["think", "closed-then-open-think", "execution_result", "after-think", "evaluation"],
)
def test_3_repeated_tags_parse_in_linear_time(parse: Any, text: str) -> None:
    t0 = time.perf_counter()
    parse(text)
    assert time.perf_counter() - t0 < LIMIT_S


# ---------------------------------------------------------------- 6. invalid UTF-8 in a result file


@pytest.fixture
def broken_results(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the example results whose envace_8b/tau2 seed-0 file has a 0xff byte in line 2."""
    results = tmp_path / "results"
    shutil.copytree(DATA / "example_results", results)
    path = eval_path(results, "envace_8b", "tau2", 0)
    rows = path.read_bytes().split(b"\n")
    rows[1] = rows[1].replace(b'"task_id": "', b'"task_id": "\xff', 1)
    path.write_bytes(b"\n".join(rows))
    return results, path


def test_6_invalid_utf8_names_the_file_the_line_and_the_byte(broken_results: tuple[Path, Path]) -> None:
    _, path = broken_results
    with pytest.raises(ResultsError, match=rf"{path}: line 2: not valid UTF-8: .*byte 0xff"):
        read_results(path)


@pytest.mark.parametrize("command", ["tables", "aggregate", "diff"])
def test_6_report_commands_report_invalid_utf8_as_an_error(
    broken_results: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    results, path = broken_results
    base = ["--config", str(EXAMPLE_CONFIG), "--resamples", "50", "--results-dir", str(results)]
    argv = {
        "tables": ["tables", "table1", *base, "--out-dir", str(tmp_path / "t")],
        "aggregate": ["aggregate", *base, "--model", "envace_8b", "--benchmark", "tau2",
                      "--out", str(tmp_path / "a.json")],
        "diff": ["diff", *base, "--out-md", str(tmp_path / "d.md"), "--out-json", str(tmp_path / "d.json")],
    }[command]
    assert run(argv) == 4
    assert f"{path}: line 2: not valid UTF-8" in capsys.readouterr().err


# ---------------------------------------------------------------- 7. missing folders and files plan cleanly
@pytest.mark.parametrize("command", ["tables", "diff"])
def test_7_a_results_dir_that_does_not_exist_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    missing = tmp_path / "no-such-results"
    base = ["--config", str(EXAMPLE_CONFIG), "--results-dir", str(missing)]
    argv = (["tables", "table1", *base, "--out-dir", str(tmp_path / "t")] if command == "tables" else
            ["diff", *base, "--out-md", str(tmp_path / "d.md"), "--out-json", str(tmp_path / "d.json")])
    assert run(argv) == 4
    assert f"results directory {missing} (--results-dir) does not exist" in capsys.readouterr().err
    assert not any(tmp_path.glob("t/*")) and not (tmp_path / "d.md").exists()


def test_7_a_missing_training_data_file_fails_the_plan(tmp_path: Path) -> None:
    cfg = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    cfg["training"]["data"]["source"] = "tests/data/no_such_cm2.jsonl"
    configfile = tmp_path / "smoke_missing_data.yaml"
    configfile.write_text(yaml.safe_dump(cfg))
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    proc = subprocess.run([snakemake, "all", "-n", "--quiet", "rules", "--configfile", str(configfile)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "training.data.source" in out and "tests/data/no_such_cm2.jsonl" in out and "does not exist" in out


# ---------------------------------------------------------------- 8. a self-referencing tool schema
NODE_TOOL = {"name": "tree", "parameters": {
    "type": "object", "properties": {"node": {"$ref": "#/$defs/node"}},
    "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}}}}


def test_8_deep_arguments_against_a_recursive_schema_are_invalid_parameters() -> None:
    node: dict = {}
    for _ in range(3000):
        node = {"child": node}
    call = CallCandidate(ToolCall("tree", {"node": node}), "raw")
    out = precheck_call(call, ToolRegistry([NODE_TOOL]), "schema")
    assert out is not None and out.error == RehearsalError.INVALID_PARAMETERS
    assert "nested too deeply" in json.loads(out.observation)["message"]
    deep = '{"child": ' * 3000 + "{}" + "}" * 3000
    text = f'<tool_call>{{"name": "tree", "arguments": {{"node": {deep}}}}}</tool_call>'
    assert parse_tool_calls(text).error == ParseError.JSON_TOO_DEEP


# ---------------------------------------------------------------- a torn last line is redone, and said so
def test_a_resumed_run_says_it_drops_a_torn_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.jsonl"
    partial = PartialResults(out, HASH)
    line = {"benchmark": "toy", "split": "s", "task_id": "t0", "sample": 0, "seed": 0, "score": 1.0,
            "subscores": {}, "status": "ok", "reason": None}
    partial.append(line)
    partial.append({**line, "task_id": "t1"})
    with open(partial.path, "ab") as fh:
        torn = '{"benchmark": "toy", "task_id": "t2", "reason": "caf\u00e9'.encode()[:-1]  # cut inside "é"
        fh.write(torn)
    resumed = PartialResults(out, HASH)
    assert list(resumed.lines) == [("t0", 0), ("t1", 0)]
    err = capsys.readouterr().err
    assert f"{partial.path}: line 3 is torn or unreadable" in err and "2 finished samples kept" in err
