"""The `envace` CLI: implemented commands run; pending ones say so with exit 2; bad config exits 1."""

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


def test_pending_command_exits_2_and_names_its_issue(repo_root, capsys):
    rc = main(["data", "--config", str(repo_root / "config/smoke.yaml"), "--out", "x", "--summary", "y"])
    assert rc == 2
    assert "not implemented" in capsys.readouterr().err


def test_bad_config_exits_1_naming_the_key(tmp_path, repo_root, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((repo_root / "config/smoke.yaml").read_text().replace("seeds: [0, 1]", "seeds: zero"))
    assert main(["data", "--config", str(bad), "--out", "x", "--summary", "y"]) == 1
    assert "'seeds'" in capsys.readouterr().err
