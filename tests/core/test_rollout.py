"""Tests for envace.core.rollout with a scripted backend: every termination reason, every error code, and the
token bookkeeping of the ACT and REHEARSE contexts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.rollout import (
    Mode,
    RolloutConfig,
    Termination,
    TokenRole,
    act_context_roles,
    generation_roles,
    run_rollout,
)
from envace.core.tools import (
    ChatTokens,
    ToolCall,
    assistant_message,
    render_chat,
    render_tool_call,
    tool_message,
)
from tests.fixtures import WEATHER_TOOL_WITH_UNIT as WEATHER_TOOL  # as before: with the unit enum
from tests.fixtures import eval_rules

TASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}]
CALL = render_tool_call(ToolCall("get_weather", {"city": "Oslo"}))
RESULT = '<execution_result>{"temp": 4}</execution_result>'
REFS = [{"call": {"name": "get_weather", "arguments": {"city": "Rome"}}, "response": "PRIVILEGED-REF"}]


def roll(policy: Any, tokenizer: Any, config: RolloutConfig | None = None, **kwargs: Any):
    return asyncio.run(run_rollout(policy, tokenizer, TASK, [WEATHER_TOOL], config or eval_rules(), **kwargs))


def observations(traj) -> list[dict]:
    return [json.loads(m["content"]) for m in traj.messages if m["role"] == "tool"]


def test_final_answer_multi_turn_and_token_bookkeeping(tokenizer, scripted) -> None:
    backend = scripted([CALL, RESULT, CALL, RESULT, "It is 4 degrees."])
    traj = roll(backend, tokenizer, references=REFS)
    assert traj.termination == Termination.FINAL_ANSWER and traj.final_answer == "It is 4 degrees."
    assert traj.num_turns == 3
    assert [g.role for g in traj.generations] == ["act", "rehearse", "act", "rehearse", "act"]
    assert [g.turn for g in traj.generations] == [0, 0, 1, 1, 2]
    assert observations(traj) == [{"temp": 4}, {"temp": 4}]

    # ACT context = prompt + generated tokens + observation deltas, nothing re-encoded.
    act_gens = [g for g in traj.generations if g.role == "act"]
    prompt = render_chat(tokenizer, TASK, [WEATHER_TOOL], add_generation_prompt=True, tokenize=True)
    act, obs = TokenRole.ACT, TokenRole.OBSERVATION
    assert [r for r, _ in traj.act_segments] == [TokenRole.PROMPT, act, obs, act, obs, act]
    assert sum(n for _, n in traj.act_segments) == len(traj.act_ids)
    assert traj.act_ids[: len(prompt)] == prompt
    for g in act_gens:  # each ACT prompt is the context up to that turn; the response follows it
        assert traj.act_ids[: g.prompt_len] == g.prompt_ids == backend.prompt_ids[traj.generations.index(g)]
        assert traj.act_ids[g.prompt_len: g.prompt_len + len(g.response_ids)] == g.response_ids
    deltas = [traj.act_ids[act_gens[i].prompt_len + len(act_gens[i].response_ids): act_gens[i + 1].prompt_len]
              for i in range(2)]
    expected = prompt + act_gens[0].response_ids + deltas[0] + act_gens[1].response_ids + deltas[1] \
        + act_gens[2].response_ids
    assert traj.act_ids == expected
    assert traj.encoded_tokens["act"] == len(prompt) + sum(len(d) for d in deltas)

    # The observation delta equals the chat template's own rendering of the conversation at that point.
    after_turn1 = traj.messages[:4]  # system, user, assistant(call), tool
    assert render_chat(tokenizer, after_turn1, [WEATHER_TOOL], add_generation_prompt=True, tokenize=True) \
        == traj.act_ids[: act_gens[1].prompt_len]

    roles = act_context_roles(traj)
    assert roles.shape == (len(traj.act_ids),)
    assert (roles == TokenRole.ACT).sum() == sum(len(g.response_ids) for g in act_gens)
    assert (roles == TokenRole.PROMPT).sum() == len(prompt)
    assert (roles == TokenRole.OBSERVATION).sum() == sum(len(d) for d in deltas)

    # REHEARSE prompts: separate context, prefix-stable across turns, references only there.
    reh = [g for g in traj.generations if g.role == "rehearse"]
    assert reh[1].prompt_ids[: reh[0].prompt_len + len(reh[0].response_ids)] == \
        reh[0].prompt_ids + reh[0].response_ids
    assert "PRIVILEGED-REF" in tokenizer.decode(reh[0].prompt_ids)
    assert "PRIVILEGED-REF" not in tokenizer.decode(traj.act_ids)
    assert traj.encoded_tokens["rehearse"] == reh[1].prompt_len - len(reh[0].response_ids)
    gr = generation_roles(reh[0])
    assert gr.shape == (reh[0].prompt_len + len(reh[0].response_ids),)
    assert set(np.unique(gr)) == {TokenRole.PROMPT, TokenRole.REHEARSE}


def test_parallel_calls_rehearsed_in_order(tokenizer, scripted) -> None:
    two = CALL + "\n" + render_tool_call(ToolCall("get_weather", {"city": "Bergen"}))
    backend = scripted([two, RESULT, '<execution_result>{"temp": 9}</execution_result>', "Done."])
    traj = roll(backend, tokenizer)
    assert traj.termination == Termination.FINAL_ANSWER
    assert observations(traj) == [{"temp": 4}, {"temp": 9}]
    assert [c["function"]["arguments"]["city"] for c in traj.messages[2]["tool_calls"]] == ["Oslo", "Bergen"]
    r0, r1 = [g for g in traj.generations if g.role == "rehearse"]
    assert r1.prompt_ids[: r0.prompt_len] == r0.prompt_ids and '"Bergen"' in tokenizer.decode(r1.prompt_ids)
    assert tokenizer.decode(traj.act_ids).count("<tool_response>") == 2


def test_act_parse_error_terminates(tokenizer, scripted) -> None:
    traj = roll(scripted(["<tool_call>{broken"]), tokenizer)
    assert traj.termination == Termination.ACT_PARSE_ERROR and traj.num_turns == 1
    assert len(traj.generations) == 1


@pytest.mark.parametrize(
    ("act_text", "precheck", "code"),
    [
        ("<tool_call>{broken", "format", "INVALID_TOOL_CALL_FORMAT"),
        (render_tool_call(ToolCall("nope", {})), "schema", "TOOL_NOT_AVAILABLE"),
        (render_tool_call(ToolCall("get_weather", {"town": "x"})), "schema", "INVALID_PARAMETERS"),
    ],
)
def test_precheck_error_codes_skip_rehearsal(tokenizer, scripted, act_text, precheck, code) -> None:
    config = eval_rules(precheck=precheck, on_act_parse_error="observe",
                           terminate_on_rehearsal_error=False)  # ours before; the default ends it
    backend = scripted([act_text, "Sorry."])
    traj = roll(backend, tokenizer, config)
    assert traj.termination == Termination.FINAL_ANSWER
    assert [g.role for g in traj.generations] == ["act", "act"]  # no rehearsal tokens spent
    assert observations(traj)[0]["error"] == code


@pytest.mark.parametrize("code", ["INVALID_TOOL_CALL_FORMAT", "TOOL_NOT_AVAILABLE", "INVALID_PARAMETERS"])
def test_model_error_codes_faithful(tokenizer, scripted, code) -> None:
    act = "<tool_call>{broken" if code == "INVALID_TOOL_CALL_FORMAT" else CALL
    reply = f'<execution_result>{{"error": "{code}", "message": "m"}}</execution_result>'
    backend = scripted([act, reply, "Sorry."])
    old = eval_rules(on_act_parse_error="observe", terminate_on_rehearsal_error=False)  # ours before
    traj = roll(backend, tokenizer, old)
    assert traj.termination == Termination.FINAL_ANSWER
    assert observations(traj) == [{"error": code, "message": "m"}]
    if code == "INVALID_TOOL_CALL_FORMAT":
        assert "# Call to execute\nnull" in tokenizer.decode(backend.prompt_ids[1])


def test_rehearsal_error_can_terminate(tokenizer, scripted) -> None:
    reply = '<execution_result>{"error": "INVALID_PARAMETERS", "message": "m"}</execution_result>'
    traj = roll(scripted([CALL, reply]), tokenizer, eval_rules(terminate_on_rehearsal_error=True))
    assert traj.termination == Termination.REHEARSAL_ERROR
    assert traj.messages[-1]["role"] == "tool"
    assert traj.act_segments[-1][0] == TokenRole.ACT  # nothing appended after the last ACT turn


def test_rehearsal_malformed(tokenizer, scripted) -> None:
    traj = roll(scripted([CALL, "I think it is sunny."]), tokenizer)
    assert traj.termination == Termination.REHEARSAL_MALFORMED
    lenient = roll(scripted([CALL, "sunny", "ok"]), tokenizer,
                   eval_rules(terminate_on_rehearsal_malformed=False))
    assert lenient.termination == Termination.FINAL_ANSWER
    assert observations(lenient)[0]["error"] == "REHEARSAL_FAILED"


def test_max_turns(tokenizer, scripted) -> None:
    traj = roll(scripted([CALL, RESULT] * 4), tokenizer, eval_rules(max_turns=4))
    assert traj.termination == Termination.MAX_TURNS and traj.num_turns == 4
    assert len(traj.generations) == 8
    assert (act_context_roles(traj) == TokenRole.ACT).sum() == 4 * len(traj.generations[0].response_ids)


def test_context_limits(tokenizer, scripted) -> None:
    prompt_len = len(render_chat(tokenizer, TASK, [WEATHER_TOOL], add_generation_prompt=True, tokenize=True))
    too_long = roll(scripted([]), tokenizer, eval_rules(max_prompt_tokens=prompt_len - 1))
    assert too_long.termination == Termination.CONTEXT_LIMIT and too_long.generations == []

    # Budget exhausted inside a generation: max_tokens is capped, the turn has no turn end.
    backend = scripted(["x" * 200])
    cut = roll(backend, tokenizer, eval_rules(max_response_tokens=10))
    assert cut.termination == Termination.CONTEXT_LIMIT and backend.params[0]["max_tokens"] == 10
    assert len(cut.act_ids) == prompt_len + 10

    # Budget exhausted by an observation.
    call_len = len(tokenizer.encode(CALL)) + 1
    obs = roll(scripted([CALL, RESULT]), tokenizer, eval_rules(max_response_tokens=call_len + 5))
    assert obs.termination == Termination.CONTEXT_LIMIT and obs.num_turns == 1

    # REHEARSE context over its own limit.
    reh = roll(scripted([CALL]), tokenizer, eval_rules(max_rehearse_context_tokens=50))
    assert reh.termination == Termination.CONTEXT_LIMIT and [g.role for g in reh.generations] == ["act"]


def test_a_rehearse_context_over_the_prompt_limit_is_cut_from_the_left(tokenizer, scripted) -> None:
    """The authors' rollout_truncation=left: REHEARSE answers a context over max_prompt_tokens from its
    last max_prompt_tokens ids (the row's prompt is the cut one) with its full reply cap; 'none' (ours
    before) ends the episode at the context limit instead."""
    full = roll(scripted([CALL, RESULT, "Done."]), tokenizer, eval_rules(), references=REFS)
    rehearse_len = full.generations[1].prompt_len
    limit = rehearse_len - 70  # the context ends 70 ids past the limit: 'none' has no room for a reply
    cfg = {"context_budget": "per_generation", "max_prompt_tokens": limit, "max_response_tokens": 64,
           "max_rehearse_context_tokens": limit + 64}
    backend = scripted([CALL, RESULT, "Done."])
    cut = roll(backend, tokenizer, eval_rules(rehearse_truncation="left", **cfg), references=REFS)
    assert cut.termination == Termination.FINAL_ANSWER and observations(cut) == [{"temp": 4}]
    rehearse = cut.generations[1]
    assert rehearse.role == "rehearse" and rehearse.prompt_len == limit
    assert rehearse.prompt_ids == full.generations[1].prompt_ids[70:] == backend.prompt_ids[1]
    assert backend.params[1]["max_tokens"] == min(64, RolloutConfig().rehearse_sampling["max_tokens"])

    kept = roll(scripted([CALL, RESULT, "Done."]), tokenizer, eval_rules(rehearse_truncation="none", **cfg),
                references=REFS)
    assert kept.termination == Termination.CONTEXT_LIMIT and [g.role for g in kept.generations] == ["act"]


def test_truncated_turn_gets_turn_end_in_delta(tokenizer, scripted) -> None:
    backend = scripted([(CALL, False), RESULT, "Done."])
    traj = roll(backend, tokenizer, eval_rules(act_sampling={"max_tokens": 1000}))
    assert traj.termination == Termination.FINAL_ANSWER
    first = traj.generations[0]
    end = first.prompt_len + len(first.response_ids)
    assert first.response_ids[-1] != tokenizer.eos_token_id
    assert traj.act_ids[end] == tokenizer.eos_token_id  # added by the observation delta


def test_enable_thinking_false_generation_prompt(tokenizer, scripted) -> None:
    config = eval_rules(template_kwargs={"enable_thinking": False})
    backend = scripted(["<think>\n\n</think>\n\n" + CALL, RESULT, "Done."])
    traj = roll(backend, tokenizer, config)
    assert traj.termination == Termination.FINAL_ANSWER
    assert tokenizer.decode(backend.prompt_ids[2]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tokenizer.decode(backend.prompt_ids[1]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_external_simulator_mode(tokenizer, scripted) -> None:
    policy = scripted([CALL, "Done."])
    simulator = scripted([RESULT])
    traj = roll(policy, tokenizer, eval_rules(mode=Mode.EXTERNAL_SIMULATOR), simulator=simulator)
    assert traj.termination == Termination.FINAL_ANSWER
    assert len(simulator.prompt_ids) == 1 and len(policy.prompt_ids) == 2
    reh = [g for g in traj.generations if g.role == "rehearse"]
    assert len(reh) == 1 and not reh[0].trainable
    with pytest.raises(ValueError, match="simulator"):
        roll(policy, tokenizer, eval_rules(mode=Mode.EXTERNAL_SIMULATOR))


class CountingTokenizer:
    """Delegates to a tokenizer and counts chat-template renders (a stand-in for a simulator's own)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.renders = inner, 0
        self.eos_token = inner.eos_token

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        self.renders += 1
        return self.inner.apply_chat_template(conversation, **kwargs)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.inner.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: list[int], **kwargs: Any) -> str:
        return self.inner.decode(token_ids, **kwargs)


def test_external_simulator_uses_its_own_tokenizer(tokenizer, scripted) -> None:
    sim_tok = CountingTokenizer(tokenizer)
    traj = roll(scripted([CALL, CALL, "Done."]), tokenizer, eval_rules(mode=Mode.EXTERNAL_SIMULATOR),
                simulator=scripted([RESULT, RESULT]), simulator_tokenizer=sim_tok)
    assert traj.termination == Termination.FINAL_ANSWER
    assert sim_tok.renders == 2  # the first REHEARSE prompt and one delta, both through its template


class RecordingEnv:
    def __init__(self) -> None:
        self.calls: list[ToolCall] = []

    def step(self, call: ToolCall) -> str:
        self.calls.append(call)
        return json.dumps({"real": call.arguments["city"]})


def test_real_mode_env_gets_parsed_calls_only(tokenizer, scripted) -> None:
    env = RecordingEnv()
    backend = scripted([CALL, "<tool_call>{broken", "Done."])
    config = eval_rules(mode=Mode.REAL, on_act_parse_error="observe")
    traj = roll(backend, tokenizer, config, environment=env)
    assert traj.termination == Termination.FINAL_ANSWER
    assert env.calls == [ToolCall("get_weather", {"city": "Oslo"})]
    assert observations(traj)[0] == {"real": "Oslo"}
    assert observations(traj)[1]["error"] == "INVALID_TOOL_CALL_FORMAT"
    assert all(g.role == "act" for g in traj.generations)
    with pytest.raises(ValueError, match="environment"):
        roll(backend, tokenizer, eval_rules(mode=Mode.REAL))


def test_chat_tokens_requires_turn_end() -> None:
    class NoEos:
        eos_token = None

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return []

    with pytest.raises(ValueError, match="turn_end"):
        ChatTokens(NoEos(), [])  # type: ignore[arg-type]


text_st = st.text(alphabet=st.characters(exclude_characters="<\r", exclude_categories=("Cs",)), max_size=30)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(text_st, st.lists(text_st, min_size=1, max_size=3)), min_size=1, max_size=4))
def test_incremental_context_equals_full_render(tokenizer, turns) -> None:
    """Model tokens appended as generated + template deltas == one render of the whole conversation, for
    canonical assistant text (Qwen3-style template: last-turn think handling, grouped tool responses)."""
    messages = list(TASK)
    ctx = ChatTokens(tokenizer, messages, [WEATHER_TOOL])
    for preamble, observations in turns:
        calls = [ToolCall("get_weather", {"city": o}) for o in observations]
        generated = preamble + ("\n" if preamble else "") + "\n".join(render_tool_call(c) for c in calls)
        ctx.append_generated(tokenizer.encode(generated, add_special_tokens=False) + [tokenizer.eos_token_id])
        new = [tool_message(o) for o in observations]
        ctx.append_messages(new)
        messages += [assistant_message(preamble, calls), *new]
    full = render_chat(tokenizer, messages, [WEATHER_TOOL], add_generation_prompt=True, tokenize=True)
    assert ctx.ids == full


# ---------------------------------------------------------------- the authors' episode rules
ERROR_REPLY = '<execution_result>{"error": "INVALID_PARAMETERS", "message": "m"}</execution_result>'


def test_rehearsal_error_ends_the_episode_by_default(tokenizer, scripted) -> None:
    traj = roll(scripted([CALL, ERROR_REPLY]), tokenizer)  # default config
    assert traj.termination == Termination.REHEARSAL_ERROR and traj.num_turns == 1
    assert observations(traj) == [{"error": "INVALID_PARAMETERS", "message": "m"}]
    # a precheck's error ends it too (the authors' harness-side schema checks do)
    nope = render_tool_call(ToolCall("nope", {}))
    pre = roll(scripted([nope]), tokenizer, eval_rules(precheck="schema"))
    assert pre.termination == Termination.REHEARSAL_ERROR and [g.role for g in pre.generations] == ["act"]
    # the old value: observed, ACT goes on
    old = roll(scripted([CALL, ERROR_REPLY, "Sorry."]), tokenizer,
               eval_rules(terminate_on_rehearsal_error=False))
    assert old.termination == Termination.FINAL_ANSWER and old.num_turns == 2


def test_two_user_turn_example_replays_the_second_turn(tokenizer, scripted) -> None:
    # user turn 0: call, result, answer; user turn 1 (replayed): answer. 3 ACT turns in all.
    backend = scripted([CALL, RESULT, "It is 4 degrees.", "You are welcome."])
    traj = roll(backend, tokenizer, user_turns=["Thanks!"])
    assert traj.termination == Termination.FINAL_ANSWER and traj.final_answer == "You are welcome."
    assert traj.num_turns == 3 and traj.user_turns == 2
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant", "user",
                                                  "assistant"]
    assert traj.messages[5] == {"role": "user", "content": "Thanks!"}
    assert [(g.role, g.turn, g.user_turn) for g in traj.generations] == [
        ("act", 0, 0), ("rehearse", 0, 0), ("act", 1, 0), ("act", 2, 1)]
    # the last ACT prompt is the chat template's own rendering of the whole dialogue so far
    last = traj.generations[-1]
    assert last.prompt_ids == render_chat(tokenizer, traj.messages[:6], [WEATHER_TOOL],
                                          add_generation_prompt=True, tokenize=True)
    assert [r for r, _ in traj.act_segments] == [TokenRole.PROMPT, TokenRole.ACT, TokenRole.OBSERVATION,
                                                 TokenRole.ACT, TokenRole.OBSERVATION, TokenRole.ACT]
    assert "Thanks!" in tokenizer.decode(traj.act_ids[: last.prompt_len])
    # the old value (and no user_turns): the episode ends at the first final answer
    for kwargs, cfg in (({"user_turns": ["Thanks!"]}, eval_rules(replay_user_turns=False)), ({}, None),
                        ({"user_turns": []}, None)):
        single = roll(scripted([CALL, RESULT, "It is 4 degrees."]), tokenizer, cfg, **kwargs)
        assert single.termination == Termination.FINAL_ANSWER and single.num_turns == 2
        assert single.user_turns == 1


def test_replay_counts_max_turns_over_the_dialogue(tokenizer, scripted) -> None:
    # max_turns=2: turn 0 answers user turn 0, turn 1 answers user turn 1; user turn 2 is never injected.
    traj = roll(scripted(["A.", "B."]), tokenizer, eval_rules(max_turns=2), user_turns=["u1", "u2"])
    assert traj.termination == Termination.MAX_TURNS and traj.num_turns == 2 and traj.user_turns == 2
    assert [m["content"] for m in traj.messages if m["role"] == "user"][1:] == ["u1"]
    capped = roll(scripted(["A."]), tokenizer, eval_rules(max_user_turns=1), user_turns=["u1"])
    assert capped.termination == Termination.MAX_TURNS and capped.num_turns == 1


def test_authors_turn_cap_is_checked_where_a_user_turn_ends(tokenizer, scripted) -> None:
    """turn_cap="user_turn_end" (the authors'): ACT calls tools past max_turns inside a user turn; the cap
    decides only whether the next user turn starts; max_env_steps bounds the episode. The default
    ("every_turn") ends the same episode at max_turns."""
    script = [CALL, RESULT, CALL, RESULT, CALL, RESULT, "It is 4 degrees."]
    authors = eval_rules(max_turns=2, turn_cap="user_turn_end")
    traj = roll(scripted(script), tokenizer, authors, user_turns=["u1"])
    assert traj.termination == Termination.MAX_TURNS and traj.num_turns == 4 and traj.user_turns == 1
    assert [m["role"] for m in traj.messages].count("tool") == 3  # three calls inside user turn 0
    ours = roll(scripted(script), tokenizer, eval_rules(max_turns=2), user_turns=["u1"])
    assert ours.termination == Termination.MAX_TURNS and ours.num_turns == 2
    # under the cap at the turn's end: the next user turn starts
    goes_on = roll(scripted(script + ["B."]), tokenizer, eval_rules(max_turns=5, turn_cap="user_turn_end"),
                   user_turns=["u1"])
    assert goes_on.termination == Termination.FINAL_ANSWER and goes_on.user_turns == 2
    bounded = roll(scripted([CALL, RESULT] * 5), tokenizer,
                   eval_rules(max_turns=2, turn_cap="user_turn_end", max_env_steps=3))
    assert bounded.termination == Termination.MAX_TURNS and bounded.num_turns == 3
    with pytest.raises(ValueError, match="turn_cap"):
        roll(scripted(["A."]), tokenizer, eval_rules(turn_cap="sometimes"))  # type: ignore[arg-type]


def test_continue_dialogue_hook(tokenizer, scripted) -> None:
    asked = []

    async def gate(messages, user_turn):
        asked.append((len(messages), user_turn))
        return False

    traj = asyncio.run(run_rollout(scripted(["A."]), tokenizer, TASK, [WEATHER_TOOL], None, user_turns=["u1"],
                                   continue_dialogue=gate))
    assert traj.termination == Termination.DIALOGUE_STOPPED and asked == [(3, 0)]


def test_replayed_turn_reaches_a_later_first_rehearsal(tokenizer, scripted) -> None:
    backend = scripted(["A.", CALL, RESULT, "Done."])
    traj = roll(backend, tokenizer, user_turns=["And in Bergen-XYZ?"])
    assert traj.termination == Termination.FINAL_ANSWER and traj.user_turns == 2
    reh = next(g for g in traj.generations if g.role == "rehearse")
    assert "Bergen-XYZ" in tokenizer.decode(reh.prompt_ids)


def test_per_generation_context_budget(tokenizer, scripted) -> None:
    """The authors' budget: each generation from a context of <= max_prompt_tokens, each up to
    max_response_tokens; ours ('episode'): the initial prompt + max_response_tokens in all."""
    prompt_len = len(render_chat(tokenizer, TASK, [WEATHER_TOOL], add_generation_prompt=True, tokenize=True))
    call_len = len(tokenizer.encode(CALL)) + 1
    texts = [CALL, RESULT, CALL, RESULT, "Done."]
    cfg = eval_rules(context_budget="per_generation", max_prompt_tokens=10**6,
                        max_response_tokens=call_len)
    backend = scripted(list(texts))
    traj = roll(backend, tokenizer, cfg)
    assert traj.termination == Termination.FINAL_ANSWER and traj.num_turns == 3
    assert [p["max_tokens"] for p in backend.params[::2]] == [call_len] * 3  # never reduced by what was used
    assert len(traj.act_ids) > prompt_len + call_len  # more than the 'episode' budget allows
    episode = roll(scripted(list(texts)), tokenizer, eval_rules(max_prompt_tokens=10**6,
                                                                    max_response_tokens=call_len))
    assert episode.termination == Termination.CONTEXT_LIMIT and episode.num_turns == 1

    # the context of the second ACT turn is over max_prompt_tokens: no second generation
    second_len = traj.generations[2].prompt_len
    tight = roll(scripted(list(texts)), tokenizer, eval_rules(context_budget="per_generation",
                                                                 max_prompt_tokens=second_len - 1))
    assert tight.termination == Termination.CONTEXT_LIMIT and tight.num_turns == 1
    assert [g.role for g in tight.generations] == ["act", "rehearse"]

    # a generation cut at max_response_tokens is parsed like any other (here: a final answer)
    cut = roll(scripted(["x" * 200]), tokenizer, eval_rules(context_budget="per_generation",
                                                               max_response_tokens=10))
    assert cut.termination == Termination.FINAL_ANSWER and len(cut.generations[0].response_ids) == 10
    with pytest.raises(ValueError, match="context_budget"):
        roll(scripted(["A."]), tokenizer, eval_rules(context_budget="total"))  # type: ignore[arg-type]


def test_replayed_user_turn_reaches_every_later_rehearsal(tokenizer, scripted) -> None:
    """Two user turns, a rehearsal in each: the second REHEARSE prompt holds the first final answer and
    the second user message (rehearsal_v2, default), extends the first one, and the references stay out
    of the ACT context. rehearsal_v1 (ours before): the second user message never reached it."""
    texts = [CALL, RESULT, "It is 4 degrees.", CALL, RESULT, "Also 4."]
    for name in ("rehearsal_v2", "rehearsal_v1"):
        cfg = None if name == "rehearsal_v2" else eval_rules(prompt_name=name)
        traj = roll(scripted(list(texts)), tokenizer, cfg, references=REFS, user_turns=["And in Bergen-XYZ?"])
        assert traj.termination == Termination.FINAL_ANSWER and traj.user_turns == 2
        reh = [g for g in traj.generations if g.role == "rehearse"]
        assert [g.user_turn for g in reh] == [0, 1]
        assert reh[1].prompt_ids[: reh[0].prompt_len + len(reh[0].response_ids)] == \
            reh[0].prompt_ids + reh[0].response_ids  # one growing chat
        first, second = tokenizer.decode(reh[0].prompt_ids), tokenizer.decode(reh[1].prompt_ids)
        assert "Bergen-XYZ" not in first and "PRIVILEGED-REF" in first
        seen = "Bergen-XYZ" in second and "It is 4 degrees." in second
        assert seen == (name == "rehearsal_v2")
        assert "PRIVILEGED-REF" not in tokenizer.decode(traj.act_ids)
        assert "Bergen-XYZ" in tokenizer.decode(traj.act_ids)


def test_a_parsed_step_keeps_its_reasoning_beside_the_reply(tokenizer, scripted) -> None:
    """The ACT message holds the visible reply and the calls; the think block's text goes to
    envace_reasoning (the judge's step view), and only where the output had one."""
    traj = roll(scripted(["<think>\nCall the tool.\n</think>\n\n" + CALL, RESULT, "It is 4."]), tokenizer)
    first, last = [m for m in traj.messages if m["role"] == "assistant"]
    assert first["envace_reasoning"] == "Call the tool." and "<think>" not in first["content"]
    assert first["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "envace_reasoning" not in last and last["content"] == "It is 4."
