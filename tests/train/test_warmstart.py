"""The tiny model's SFT warm start (envace.warmstart) and `envace tiny-model --warmstart-data`."""

import json

import torch

from envace.cli import main
from envace.data import convert
from envace.tiny_model import tiny_model_and_tokenizer
from envace.warmstart import GREETING, USER_SYSTEM, sft, sft_sequences

FIXTURE = "tests/data/cm2_fixture.jsonl"


def _examples(repo_root):
    _, tok = tiny_model_and_tokenizer()
    return convert(str(repo_root / FIXTURE), tok, max_prompt_tokens=10**9)[0]


def test_sequences_teach_calls_with_tools_and_text_without(repo_root):
    _, tok = tiny_model_and_tokenizer()
    examples = _examples(repo_root)
    rows = sft_sequences(examples, tok)
    with_calls = sum(bool(ex.reference_calls) for ex in examples)
    assert len(rows) == 2 * (with_calls + len(examples))  # two template variants per behaviour
    texts = [(tok.decode(ids[:p]), tok.decode(ids[p:])) for ids, p in rows]
    acting = [(prompt, answer) for prompt, answer in texts if "<tools>" in prompt]
    user = [(prompt, answer) for prompt, answer in texts if USER_SYSTEM in prompt]
    assert len(acting) == 2 * with_calls and len(user) == 2 * len(examples)
    assert all(answer.startswith("<tool_call>") and answer.endswith(tok.eos_token) for _, answer in acting)
    assert all("<tool_call>" not in answer and GREETING in prompt for prompt, answer in user)
    assert all(ids[-1] == tok.eos_token_id and 0 < p < len(ids) for ids, p in rows)


def test_sft_lowers_the_loss_and_changes_only_the_model(repo_root):
    model, tok = tiny_model_and_tokenizer(seed=0)
    rows = sft_sequences(_examples(repo_root)[:3], tok)
    before = [p.detach().clone() for p in model.parameters()]
    torch.manual_seed(0)
    losses = sft(model, rows, steps=8, lr=1e-2, pad_id=tok.pad_token_id)
    assert len(losses) == 8 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.7 * losses[0]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not model.training
    assert sft(model, [], steps=3, lr=1e-2, pad_id=0) == [] and sft(model, rows, 0, 1e-2, 0) == []


def test_tiny_model_command_warm_starts_and_records_it(repo_root, tmp_path, capsys):
    done = tmp_path / "done.json"
    argv = ["tiny-model", "--out", str(tmp_path / "tiny"), "--done", str(done),
            "--warmstart-data", str(repo_root / FIXTURE), "--warmstart-steps", "3", "--warmstart-lr", "1e-2"]
    assert main(argv) == 0
    info = json.loads(done.read_text())["warmstart"]
    assert info["steps"] == 3 and info["rows"] > 0 and info["loss_last"] < info["loss_first"]
    assert "warm start" in capsys.readouterr().out
