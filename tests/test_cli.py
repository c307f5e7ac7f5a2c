"""The `envace` CLI: commands run; every command the workflow calls exists; bad config exits 1."""

import json

from envace.cli import main


def test_tiny_model_command_builds_a_loadable_model(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "tiny"
    assert main(["tiny-model", "--out", str(out), "--done", str(tmp_path / "done.json")]) == 0
    done = json.loads((tmp_path / "done.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert done["parameters"] == sum(p.numel() for p in model.parameters()) > 0
    assert "<tool_call>" in tok.get_vocab()
    assert "parameters" in capsys.readouterr().out


def test_every_command_the_workflow_calls_exists(repo_root):
    """Each `envace <command>` in a Snakemake rule is a registered subcommand (no stubs left)."""
    import re

    from envace.cli import build_parser

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
