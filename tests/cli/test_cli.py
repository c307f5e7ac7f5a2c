"""The `envace` CLI: commands run; every command the workflow calls exists; every option has a help text;
`envace --help` documents the exit codes; bad config exits 1."""

import argparse
import json
import re
from pathlib import Path

import pytest

from envace.cli.main import build_parser, main
from tests.fixtures import WEATHER_TOOL


def test_tiny_model_command_builds_a_loadable_model(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "tiny"
    assert main(["tiny-model", "--out", str(out), "--done", str(tmp_path / "done.json"), "--seed", "0",
                 "--warmstart", "[]"]) == 0
    done = json.loads((tmp_path / "done.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert done["parameters"] == sum(p.numel() for p in model.parameters()) > 0
    assert "<tool_call>" in tok.get_vocab()
    assert "parameters" in capsys.readouterr().out


def test_every_command_the_workflow_calls_exists(repo_root):
    """Each `envace <command>` in a Snakemake rule is a registered subcommand (no stubs left)."""
    called = set()
    for rules in (repo_root / "workflow/rules").glob("*.smk"):
        called |= set(re.findall(r'"envace ([a-z-]+) ', rules.read_text()))
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert called and called <= set(subparsers.choices), called - set(subparsers.choices)


def test_bad_config_exits_1_naming_the_key(tmp_path, repo_root, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((repo_root / "config/smoke.yaml").read_text().replace("seeds: [0, 1]", "seeds: zero"))
    out, summary = tmp_path / "x.parquet", tmp_path / "y.json"
    assert main(["data", "--config", str(bad), "--out", str(out), "--summary", str(summary)]) == 1
    assert not out.exists()
    assert "'seeds'" in capsys.readouterr().err


def _walk(parser: argparse.ArgumentParser, path: str):
    """``(command path, action)`` of every argument of ``parser`` and of its subcommands, recursively;
    each subcommand also appears as a pseudo-action (its entry in the parent's command list)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield path, listed.get(name, argparse.Action([], name))
                yield from _walk(sub, f"{path} {name}")
        else:
            yield path, action


def test_every_option_has_help():
    """Every option and positional argument of every subcommand, and every subcommand itself, has a help
    text (none missing, empty or suppressed)."""
    seen, missing = 0, []
    for path, action in _walk(build_parser(), "envace"):
        seen += 1
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            missing.append(f"{path}: {'/'.join(action.option_strings) or action.dest}")
    assert seen > 100, seen  # the walk reached the subcommands
    assert not missing, "options without a help text:\n" + "\n".join(missing)


def test_help_documents_the_exit_codes(capsys):
    """`envace --help` ends with the exit codes (docs/user_guide.md, "Exit codes"); `envace` alone prints
    it and exits 2."""
    text = build_parser().format_help()
    codes = re.findall(r"^  (\d+(?:\+N)?) ", text.split("exit codes:", 1)[1], re.M)
    assert codes == ["0", "1", "2", "3", "4", "128+N"], codes
    guide = (Path(__file__).resolve().parents[2] / "docs" / "user_guide.md").read_text()
    table = guide.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| (\d+(?:\+N)?) \|", table, re.M) == codes  # the guide lists the same codes
    assert main([]) == 2  # no command: the help, exit 2
    assert "exit codes:" in capsys.readouterr().out


def test_an_unavailable_resource_exits_3(monkeypatch, tmp_path, capsys):
    """Exit 3, distinct from a failure (1) and a usage error (2): a self-check whose benchmark package
    is missing, and a model server that cannot start (reported by main for any command)."""
    import envace.cli.fidelity as fidelity_cmd
    import envace.cli.selfcheck as selfcheck_cmd
    from envace.common.results import write_results
    from envace.serve.tiny_model import build_tiny_model
    from envace.serve.vllm_server import ServerError

    monkeypatch.setitem(selfcheck_cmd.CHECKS, "tau2", "envace_no_such_module:check")
    assert main(["selfcheck", "tau2"]) == 3
    assert "tau2 is not available" in capsys.readouterr().err

    def no_server(*args, **kwargs):
        raise ServerError("vllm server of /m exited with code 1 before it was ready")

    monkeypatch.setattr(fidelity_cmd, "_predict_served", no_server)
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    chat = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": '{"t": 18}'}, {"role": "assistant", "content": "18"}]
    line = {"benchmark": "bfcl_multi_turn", "split": "base", "seed": 0, "score": 1.0, "subscores": {},
            "status": "ok", "reason": None, "task_id": "t1", "sample": 0,
            "trajectory": {"messages": chat, "tools": [WEATHER_TOOL]}}
    results = write_results(tmp_path / "seed0.jsonl", [line], model="qwen3_8b", benchmark="bfcl_multi_turn",
                            seed=0, scale="smoke", config_hash="0123456789abcdef", git_commit="abc",
                            package_versions={})
    model = build_tiny_model(tmp_path / "tiny")
    assert main(["fidelity", "--config", "config/smoke.yaml", "--results", str(results), "--model-path",
                 str(model), "--label", "tiny", "--out", str(tmp_path / "f.json")]) == 3
    assert "exited with code 1 before it was ready" in capsys.readouterr().err


def test_tiny_model_settings_come_from_the_config(tmp_path):
    """No flag: the seed and warm-start stages from the config's tiny_model block; a missing one is named;
    a flag replaces the config's value; a malformed stage is refused with its key."""
    from envace.cli.tiny_model import resolve_settings
    from envace.common.config import ConfigError

    def args(**kw):
        return argparse.Namespace(**{"config": "config/smoke.yaml", "seed": None, "warmstart": None, **kw})

    a = args()
    resolve_settings(a)
    [stage] = a.stages
    assert (a.seed, stage.steps, stage.lr, stage.batch_rows) == (0, 120, 1.0e-2, None)
    assert stage.data == ("tests/data/cm2_fixture.jsonl",)
    assert stage.behaviours == ("act", "answer", "user", "rehearse")
    assert stage.renderings == ("plain", "no_thinking")
    b = args(seed=7, warmstart=[
        {"data": "x.jsonl", "steps": 3, "lr": 0.5, "behaviours": ["act"], "renderings": ["plain"],
         "omit_tool_list": True},
        {"data": ["x.jsonl", "y.jsonl"], "steps": 1, "lr": 1}])
    resolve_settings(b)
    assert b.seed == 7 and [(s.data, s.steps, s.behaviours, s.omit_tool_list) for s in b.stages] == [
        (("x.jsonl",), 3, ("act",), True),
        (("x.jsonl", "y.jsonl"), 1, ("act", "answer", "user", "rehearse"), False)]
    c = args(warmstart=[])
    resolve_settings(c)
    assert c.stages == []
    with pytest.raises(ConfigError, match="tiny_model.seed is not set"):
        resolve_settings(args(config="config/config.yaml"))
    for stage, key in [({"steps": 1, "lr": 1}, r"warmstart\[0\]: 'data' is a required property"),
                       ({"data": "x", "steps": 0, "lr": 1}, r"warmstart\[0\]\.steps: 0 is less than"),
                       ({"data": "x", "steps": 1, "lr": 1, "behaviours": ["dance"]},
                        r"\.behaviours\.0: 'dance' is not one of"),
                       ({"data": "x", "steps": 1, "lr": 1, "renderings": []},
                        r"\.renderings: \[\] should be non-empty"),
                       ({"data": "x", "steps": 1, "lr": 1, "omit_tool_list": "yes"},
                        r"\.omit_tool_list: 'yes' is not"),
                       ({"data": "x", "steps": 1, "lr": 1, "epochs": 2}, r"'epochs' was unexpected"),
                       ("x.jsonl", r"warmstart\[0\]: 'x.jsonl' is not of type 'object'")]:
        with pytest.raises(ConfigError, match=key):
            resolve_settings(args(warmstart=[stage]))
