"""Tests for envace.serve.tiny_model and a full rehearsal rollout driven by the tiny model."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envace.core.rollout import RolloutConfig, Termination, run_rollout
from envace.core.tools import ToolCall, assistant_message, render_chat, render_tool_call, tool_message
from envace.serve.tiny_model import (
    SPECIAL_TOKENS,
    HFGenerateBackend,
    build_tiny_model,
    tiny_model_and_tokenizer,
)
from tests.fixtures import WEATHER_TOOL_WITH_UNIT as WEATHER_TOOL  # as before: with the unit enum


def test_builds_fast_and_small() -> None:
    start = time.perf_counter()
    model, tok = tiny_model_and_tokenizer(seed=0)
    assert time.perf_counter() - start < 1.0
    n_params = sum(p.numel() for p in model.parameters())
    assert 150_000 < n_params < 300_000
    assert len(tok) == model.config.vocab_size == 2048
    for special in SPECIAL_TOKENS:
        assert len(tok.encode(special, add_special_tokens=False)) == 1
    assert tok.eos_token == "<|im_end|>"
    other, _ = tiny_model_and_tokenizer(seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters(), strict=True))


def test_save_and_load_with_auto_classes(tmp_path) -> None:
    out = build_tiny_model(tmp_path / "tiny", seed=1)
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ref_model, ref_tok = tiny_model_and_tokenizer(seed=1)
    msgs = [{"role": "user", "content": "hi"}]
    ids = render_chat(tok, msgs, [WEATHER_TOOL], add_generation_prompt=True, tokenize=True)
    assert ids == render_chat(ref_tok, msgs, [WEATHER_TOOL], add_generation_prompt=True, tokenize=True)
    with torch.no_grad():
        a = model(input_ids=torch.tensor([ids])).logits
        b = ref_model(input_ids=torch.tensor([ids])).logits
    torch.testing.assert_close(a, b)
    # as in Qwen3, tool tags survive a server's skip_special_tokens decode; chat markers do not
    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    reply = tok.encode(call + "<|im_end|>", add_special_tokens=False)
    assert tok.decode(reply, skip_special_tokens=True) == call


def test_chat_template_qwen3_style(tokenizer) -> None:
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        assistant_message("<think>plan</think>\n\npre", [ToolCall("f", {"a": 1}), ToolCall("g", {})]),
        tool_message("r1"),
        tool_message("r2"),
        assistant_message("final"),
    ]
    text = render_chat(tokenizer, msgs, [WEATHER_TOOL])
    assert text.startswith("<|im_start|>system\nS\n\n# Tools")
    assert '"get_weather"' in text.split("</tools>")[0]
    calls = render_tool_call(ToolCall("f", {"a": 1})) + "\n" + render_tool_call(ToolCall("g", {}))
    assert "<|im_start|>assistant\n<think>\nplan\n</think>\n\npre\n" + calls + "<|im_end|>\n" in text
    assert "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>" \
        "<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nfinal<|im_end|>\n")
    # Reasoning before the last user query is dropped, as in Qwen3.
    later = render_chat(tokenizer, msgs[:3] + [{"role": "user", "content": "again"}])
    assert "plan" not in later
    gen = render_chat(tokenizer, msgs[:2], add_generation_prompt=True, enable_thinking=False)
    assert gen.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_backend_seeded_and_logprobs_match_trainer() -> None:
    model, tok = tiny_model_and_tokenizer(seed=0)
    prompt = tok.encode("hello there", add_special_tokens=False)
    params = {"max_tokens": 24, "temperature": 1.0}
    ids_a, lp_a = asyncio.run(HFGenerateBackend(model, [tok.eos_token_id], seed=3).generate(prompt, params))
    ids_b, lp_b = asyncio.run(HFGenerateBackend(model, [tok.eos_token_id], seed=3).generate(prompt, params))
    assert ids_a == ids_b and lp_a == lp_b and len(ids_a) == len(lp_a) > 0
    # Log-probs recomputed by a full forward pass (as a trainer would) equal the rollout's.
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids_a])).logits[0, len(prompt) - 1: -1]
    recomputed = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids_a)[:, None])[:, 0]
    torch.testing.assert_close(recomputed, torch.tensor(lp_a), atol=1e-4, rtol=0)
    greedy = HFGenerateBackend(model, [tok.eos_token_id])
    g1, _ = asyncio.run(greedy.generate(prompt, {"max_tokens": 8, "temperature": 0}))
    assert g1[0] == int(logits[0].argmax())
    nucleus, _ = asyncio.run(greedy.generate(prompt, {"max_tokens": 8, "temperature": 1.0, "top_p": 1e-6}))
    assert nucleus == g1  # top_p -> 0 keeps only the most likely token


class _Replay:
    """Scripted backend used once to produce the target trajectory."""

    def __init__(self, tok, texts: list[str]) -> None:
        self.tok, self.texts = tok, list(texts)

    async def generate(self, prompt_ids, sampling_params):
        ids = self.tok.encode(self.texts.pop(0), add_special_tokens=False) + [self.tok.eos_token_id]
        return ids, [0.0] * len(ids)


def _response_logits(model, g) -> torch.Tensor:
    """Logits predicting each response token of generation ``g``, shape ``(T, V)``."""
    return model(input_ids=torch.tensor([g.prompt_ids + g.response_ids])).logits[0, g.prompt_len - 1: -1]


def _overfit(model, generations, max_steps: int = 200, margin: float = 2.0) -> None:
    """Teacher-force the model on the generations until each target token wins by ``margin`` logits."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(max_steps):
        loss, ok = torch.zeros(()), True
        for g in generations:
            logits = _response_logits(model, g)
            target = torch.tensor(g.response_ids)
            loss = loss + torch.nn.functional.cross_entropy(logits, target)
            top = logits.gather(1, target[:, None])[:, 0]
            rest = logits.scatter(1, target[:, None], float("-inf")).max(-1).values
            ok = ok and bool((top - rest > margin).all())
        if ok:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def test_tiny_model_full_multi_turn_rehearsal_rollout() -> None:
    """The tiny model, taught one scripted trajectory, rolls it out itself: ACT calls, REHEARSE replies
    from the same weights, three turns, final answer; its ACT context and REHEARSE prompts are token-exact
    and its log-probs agree with a trainer-side recomputation."""
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer(seed=0)
    task = [{"role": "user", "content": "Weather in Oslo?"}]
    call = render_tool_call(ToolCall("get_weather", {"city": "Oslo"}))
    result = '<execution_result>{"temp": 4}</execution_result>'
    config = RolloutConfig(act_sampling={"temperature": 0, "max_tokens": 48},
                           rehearse_sampling={"temperature": 0, "max_tokens": 48})
    target = asyncio.run(run_rollout(_Replay(tok, [call, result, call, result, "It is 4."]), tok, task,
                                     [WEATHER_TOOL], config))
    _overfit(model, target.generations)

    traj = asyncio.run(run_rollout(HFGenerateBackend(model, [tok.eos_token_id]), tok, task, [WEATHER_TOOL],
                                   config))
    assert traj.termination == Termination.FINAL_ANSWER and traj.final_answer == "It is 4."
    assert [g.role for g in traj.generations] == ["act", "rehearse", "act", "rehearse", "act"]
    assert traj.act_ids == target.act_ids
    reh = [g for g in traj.generations if g.role == "rehearse"]
    first = reh[0].prompt_ids + reh[0].response_ids
    assert reh[1].prompt_ids[: len(first)] == first
    with torch.no_grad():
        for g in traj.generations:
            logp = torch.log_softmax(_response_logits(model, g), -1)
            lp = logp.gather(1, torch.tensor(g.response_ids)[:, None])[:, 0]
            torch.testing.assert_close(lp, torch.tensor(g.logprobs), atol=1e-4, rtol=0)


def test_build_cache_hits_on_the_same_key_and_misses_on_another(tmp_path) -> None:
    """``envace tiny-model --cache``: the second build with the same inputs copies the first (same weight
    bytes, ``cache.hit``); a different warm-start setting is another key and trains again."""
    from envace.cli.main import main

    data = str(Path(__file__).resolve().parents[1] / "data" / "cm2_fixture.jsonl")
    cache = tmp_path / "cache"

    def build(name: str, lr: str) -> dict:
        out = tmp_path / name
        stages = json.dumps([{"data": data, "steps": 1, "lr": float(lr)}])
        assert main(["tiny-model", "--out", str(out), "--cache", str(cache), "--warmstart", stages,
                     "--seed", "0"]) == 0
        return json.loads((out / "done.json").read_text())

    first, again, other = build("a", "0.01"), build("b", "0.01"), build("c", "0.02")
    assert first["cache"]["hit"] is False and again["cache"]["hit"] is True
    assert again["cache"]["key"] == first["cache"]["key"] != other["cache"]["key"]
    assert other["cache"]["hit"] is False
    assert again["warmstart"][0]["loss_first"] == first["warmstart"][0]["loss_first"]
    weights = [(tmp_path / n / "model.safetensors").read_bytes() for n in "abc"]
    assert weights[0] == weights[1] != weights[2]
    assert sorted(p.name for p in cache.iterdir() if p.suffix != ".lock") == sorted(
        f"tiny-{d['cache']['key']}" for d in (first, other))  # no half-written folder left behind


def test_two_builds_of_one_key_at_once_train_it_once(tmp_path) -> None:
    """Two ``envace tiny-model --cache`` processes started together with the same inputs (the test
    suite's parallel workers): one trains, the other waits for the key's lock and copies its build."""
    data = str(Path(__file__).resolve().parents[1] / "data" / "cm2_fixture.jsonl")
    stages = json.dumps([{"data": data, "steps": 2, "lr": 0.01}])
    envace = str(Path(sys.executable).parent / "envace")
    argv = [envace, "tiny-model", "--cache", str(tmp_path / "c"), "--warmstart", stages, "--seed", "0"]
    procs = [subprocess.Popen([*argv, "--out", str(tmp_path / n)], stdout=subprocess.PIPE, text=True)
             for n in "ab"]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    hits = sorted(json.loads((tmp_path / n / "done.json").read_text())["cache"]["hit"] for n in "ab")
    assert hits == [False, True], logs
    weights = [(tmp_path / n / "model.safetensors").read_bytes() for n in "ab"]
    assert weights[0] == weights[1]


def test_build_key_hashes_the_mix_data_bytes_not_their_paths(tmp_path) -> None:
    """The same records under another path (a stage's data and its mix parts' alike) are the same key: a
    moved data folder does not train again; changed bytes do."""
    import argparse
    import shutil

    from envace.cli.tiny_model import build_key
    from envace.train.warmstart import Stage

    data = Path(__file__).resolve().parents[1] / "data" / "cm2_fixture.jsonl"
    copy = tmp_path / "elsewhere" / "records.jsonl"
    copy.parent.mkdir()
    shutil.copy(data, copy)

    def key(main_data: Path, mix_data: Path) -> str:
        stage = Stage.parse({"data": str(main_data), "steps": 1, "lr": 0.01,
                             "mix": [{"data": str(mix_data), "behaviours": ["rehearse"]}]}, "stage")
        return build_key(argparse.Namespace(seed=0, stages=[stage], threads=2))

    assert key(data, data) == key(copy, copy)
    copy.write_text(data.read_text().splitlines()[0] + "\n")
    assert key(data, data) != key(data, copy)


def test_ledger_names_are_one_token_alike_in_question_and_call(tokenizer) -> None:
    """Every ledger account is one token, the same one where a question quotes it and where a call's
    JSON does (what lets the smoke model learn to copy it)."""
    from envace.bench.ledger import ACCOUNT_POOL

    for name in ACCOUNT_POOL:
        question = tokenizer.encode(f'What is the balance of "{name}"?', add_special_tokens=False)
        call = tokenizer.encode(f'{{"account": "{name}"}}', add_special_tokens=False)
        (token,) = tokenizer.encode(name, add_special_tokens=False)
        assert token in question and token in call, name
