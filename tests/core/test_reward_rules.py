"""The reward rules of ``training.reward_rules``: the authors' behaviour by default, each switch's
old value reproducing our earlier rule. Hand-computed, with a fake judge (no server)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import envace.train.reward_fn as rw
from envace.core.reward import (
    RewardRules,
    checklist_reward,
    is_error_tool_call,
    reference_grounded_reward,
    reference_match_reward,
    reference_outcome_reward,
    reward_rules_env,
    reward_rules_from_env,
    row_penalties,
    turn_passes_required,
)
from envace.train.judge import ChecklistJudge, JudgeConfig, judge_config_from_env


def _call(name, **args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


USER = {"role": "user", "content": "weather in Paris"}
STEP1 = {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", city="Paris")]}
OBS_OK = {"role": "tool", "content": json.dumps({"temperature": 20})}
OBS_RESULT_ERROR = {"role": "tool", "content": json.dumps({"temperature": None, "error": "sensor offline"})}
OBS_PROTOCOL_ERROR = {"role": "tool", "content": json.dumps({"error": "INVALID_PARAMETERS", "message": "x"})}
OBS_AUTHORS_ERROR = {"role": "tool",
                     "content": json.dumps({"error_tool_call": {"code": "TOOL_NOT_AVAILABLE"}})}
FINAL = {"role": "assistant", "content": "It is 20 degrees."}
ITEMS = [{"id": "a", "question": "called get_weather?", "focus_on": "assistant.tool_calls", "weight": 0.6},
         {"id": "b", "question": "stated the temperature?", "focus_on": "assistant.content", "weight": 0.4}]
OLD = RewardRules.ours()


class _Completions:
    """``client.chat.completions`` stand-in: item a passes at a step with a get_weather call, item b at a
    step that says '20 degrees'. Records the (step, question) pairs asked."""

    def __init__(self):
        self.asked: list[tuple[str, str]] = []
        self.last = None

    def create(self, **kw):
        self.last = kw
        user = kw["messages"][1]["content"]
        step = user.split("(the step to judge)")[1].split("# Checklist item")[0]
        question = user.split("Question: ")[1].split("\n")[0]
        self.asked.append((step, question))
        ok = ("get_weather" in step) if "get_weather" in question else ("20 degrees" in step)
        content = json.dumps({"passed": ok, "reason": "rule"})
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=content))])


def _judge(prompt_name="checklist_judge_v3"):
    completions = _Completions()
    client = SimpleNamespace(chat=SimpleNamespace(completions=completions))
    config = JudgeConfig(base_url="http://unused", model="judge", max_concurrency=1, prompt_name=prompt_name)
    return ChecklistJudge(config, client=client, sleep=lambda s: None), completions


# ------------------------------------------------------------------------- 1. terminated episodes
STEP_SAYS = {"role": "assistant", "content": "20 degrees so far",
             "tool_calls": [_call("get_weather", city="Rome")]}
CUT = {"role": "assistant", "content": "It is 20 degrees <tool_call>{"}
MID_TURN = [USER, STEP1, OBS_OK, STEP_SAYS, OBS_OK]  # a turn cap / context limit hit inside the turn


@pytest.mark.parametrize("reason, chat", [
    ("max_turns", MID_TURN),
    ("context_limit", MID_TURN),
    ("context_limit", [USER, STEP1, OBS_OK, CUT]),
    ("act_parse_error", [USER, STEP1, OBS_OK, CUT]),
    ("rehearsal_malformed", [USER, STEP1, OBS_OK, STEP_SAYS,
                             {"role": "tool", "content": json.dumps({"error": "REHEARSAL_FAILED"})}]),
])
def test_terminated_episode_scores_zero_without_the_judge(reason, chat):
    judge, completions = _judge()
    res = checklist_reward(chat, [ITEMS], judge, termination=reason)
    assert res.reward == 0.0 and res.turn_scores == [0.0]
    assert completions.asked == []
    # judge_terminated=true (ours before): judged as any turn (a at step 1, b at step 2), unless zeroed
    judge, completions = _judge()
    old = RewardRules(judge_terminated=True, zero_turn_on="any_error", auto_false_on_error_tool_call=False)
    res = checklist_reward(chat, [ITEMS], judge, old, termination=reason)
    assert res.reward == pytest.approx(0.0 if reason == "rehearsal_malformed" else 1.0)
    assert len(completions.asked) == 4


@pytest.mark.parametrize("reason", ["final_answer", "dialogue_stopped", "max_turns", None])
def test_a_turn_that_ended_in_a_final_answer_is_judged(reason):
    """max_turns right after a final answer (the authors check their cap after the judged turn)."""
    judge, completions = _judge()
    res = checklist_reward([USER, STEP1, OBS_OK, FINAL], [ITEMS], judge, termination=reason)
    assert res.reward == pytest.approx(1.0) and len(completions.asked) == 4


def test_context_limit_after_a_final_answer_zeroes_the_new_unanswered_turn():
    judge, _ = _judge()
    chat = [USER, STEP1, OBS_OK, FINAL, {"role": "user", "content": "and Rome?"}]
    res = checklist_reward(chat, [ITEMS, ITEMS], judge, termination="context_limit")
    assert res.turn_scores == pytest.approx([1.0, 0.0]) and res.reward == pytest.approx(0.5)


def test_only_the_terminated_turn_is_unjudged():
    """Turn 0 ends in a final answer (1.0); turn 1 runs out of turns: 0, unjudged; R = (1 + 0) / 2."""
    judge, completions = _judge()
    chat = [USER, STEP1, OBS_OK, FINAL, {"role": "user", "content": "and Rome?"}, STEP1]
    res = checklist_reward(chat, [ITEMS, ITEMS], judge, termination="max_turns")
    assert res.turn_scores == pytest.approx([1.0, 0.0]) and res.reward == pytest.approx(0.5)
    assert len(completions.asked) == 4  # turn 0 only: 2 steps x 2 items


def test_reference_outcome_averages_the_call_f1_with_the_answer_check():
    ref = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    wrong_call = {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", city="Rome")]}
    done = "final_answer"
    episode = [USER, STEP1, OBS_OK, FINAL]
    assert reference_outcome_reward(episode, ref, "It is 20.", termination=done).reward == 1.0
    assert reference_outcome_reward(episode, ref, "It is 21.", termination=done).reward == 0.5
    # the right answer after a call with the right name only: (0.5 + 1) / 2
    assert reference_outcome_reward([USER, wrong_call, OBS_OK, FINAL], ref, "20",
                                    termination=done).reward == 0.75
    # the answer's last number counts: "20 or 21" is not 20
    guess = {"role": "assistant", "content": "20 or 21"}
    assert reference_outcome_reward([USER, STEP1, OBS_OK, guess], ref, "20", termination=done).reward == 0.5
    # a reference answer without a number leaves reference_match's F1; termination rules as reference_match
    assert reference_outcome_reward([USER, wrong_call, OBS_OK, FINAL], ref, "Done.",
                                    termination=done).reward == 0.5
    assert reference_outcome_reward([USER, STEP1, OBS_OK], ref, "20", termination="max_turns").reward == 0.0


def test_reference_grounded_checks_the_answer_against_the_last_observation():
    ref = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    done = "final_answer"
    rehearsed = {"role": "tool", "content": '{"temp": 17}'}  # a rehearsal that is not the real 20
    says = {"role": "assistant", "content": "It is 17 degrees."}
    # the answer restates its observation: full reward, whatever the reference answer's number
    assert reference_grounded_reward([USER, STEP1, rehearsed, says], ref, "It is 20.",
                                     termination=done).reward == 1.0
    # the reference's number not observed in this episode is not grounded
    assert reference_grounded_reward([USER, STEP1, rehearsed, FINAL], ref, "It is 20.",
                                     termination=done).reward == 0.5
    # no observation at all: nothing to restate; the last number counts, as for reference_outcome
    assert reference_grounded_reward([USER, says], ref, "20", termination=done).reward == 0.0
    assert reference_grounded_reward([USER, STEP1, rehearsed, {"role": "assistant", "content": "17 or 3"}],
                                     ref, "20", termination=done).reward == 0.5
    # a reference answer without a number, and the termination rules: as reference_match
    assert reference_grounded_reward([USER, STEP1, rehearsed, FINAL], ref, "Done.",
                                     termination=done).reward == 1.0
    unfinished = reference_grounded_reward([USER, STEP1, rehearsed], ref, "20", termination="max_turns")
    assert unfinished.reward == 0.0


def test_reference_grounded_through_verls_entry_point(monkeypatch):
    monkeypatch.setenv("ENVACE_REWARD", "reference_grounded")
    extra = {"messages": [USER, STEP1, {"role": "tool", "content": '{"temp": 17}'},
                          {"role": "assistant", "content": "17"}], "termination": "final_answer",
             "reference_calls": json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}]),
             "reference_answer": "20 degrees"}
    assert rw.compute_score("cm2", "", None, extra)["score"] == 1.0
    assert rw.dialogue_continues(extra["messages"], 0, None, extra)  # no judge to ask


def test_reference_outcome_through_verls_entry_point(monkeypatch):
    monkeypatch.setenv("ENVACE_REWARD", "reference_outcome")
    extra = {"messages": [USER, STEP1, OBS_OK, FINAL], "termination": "final_answer",
             "reference_calls": json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}]),
             "reference_answer": "20 degrees"}
    assert rw.compute_score("cm2", "", None, extra)["score"] == 1.0
    extra["reference_answer"] = "19 degrees"
    assert rw.compute_score("cm2", "", None, extra)["score"] == 0.5
    assert rw.dialogue_continues([USER, STEP1, OBS_OK, FINAL], 0, None, extra) is True  # no judge


def test_reference_match_terminated_first_turn_scores_zero():
    ref = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert reference_match_reward([USER, STEP1, OBS_OK], ref, termination="max_turns").reward == 0.0
    assert reference_match_reward([USER, STEP1, OBS_OK, FINAL], ref, termination="final_answer").reward == 1.0
    old = reference_match_reward([USER, STEP1, OBS_OK], ref, RewardRules(judge_terminated=True),
                                 termination="max_turns")
    assert old.reward == 1.0


# ---------------------------------------------------------------------- 6. multi-turn normaliser
def test_two_user_turns_with_three_checklist_turns():
    """Turn 0: a + b = 1.0; turn 1 (answer only, says '20 degrees'): b = 0.4; turn 2 never reached: 0.
    checklist_turns: (1.0 + 0.4) / 3; reached_turns (ours before): (1.0 + 0.4) / 2."""
    chat = [USER, STEP1, OBS_OK, FINAL, {"role": "user", "content": "again?"},
            {"role": "assistant", "content": "Still 20 degrees."}]
    judge, _ = _judge()
    res = checklist_reward(chat, [ITEMS, ITEMS, ITEMS], judge, termination="final_answer")
    assert res.turn_scores == pytest.approx([1.0, 0.4])
    assert res.reward == pytest.approx(1.4 / 3)
    judge, _ = _judge()
    old = checklist_reward(chat, [ITEMS, ITEMS, ITEMS], judge, RewardRules(turn_normaliser="reached_turns"),
                           termination="final_answer")
    assert old.reward == pytest.approx(0.7)


# ------------------------------------------------------------------------- 2. error tool calls
def test_error_field_in_a_rehearsed_result_no_longer_zeroes_the_turn():
    judge, _ = _judge()
    res = checklist_reward([USER, STEP1, OBS_RESULT_ERROR, FINAL], [ITEMS], judge)
    assert res.reward == pytest.approx(1.0)
    judge, _ = _judge()
    old = checklist_reward([USER, STEP1, OBS_RESULT_ERROR, FINAL], [ITEMS], judge,
                           RewardRules(zero_turn_on="any_error"))
    assert old.reward == 0.0


@pytest.mark.parametrize("obs", [OBS_PROTOCOL_ERROR, OBS_AUTHORS_ERROR,
                                 {"role": "tool", "name": "error_tool_call", "content": "{}"}])
def test_error_tool_call_zeroes_the_turn(obs):
    assert is_error_tool_call(obs)
    judge, _ = _judge()
    assert checklist_reward([USER, STEP1, obs, FINAL], [ITEMS], judge).reward == 0.0
    # ours before: only an "error" key zeroes the turn (the authors' payload had none), no auto-False
    judge, _ = _judge()
    old = RewardRules(zero_turn_on="any_error", auto_false_on_error_tool_call=False)
    res = checklist_reward([USER, STEP1, obs, FINAL], [ITEMS], judge, old)
    assert res.reward == (0.0 if '"error"' in obs["content"] else pytest.approx(1.0))


def test_is_error_tool_call_edge_cases():
    assert not is_error_tool_call(OBS_RESULT_ERROR)
    assert not is_error_tool_call({"role": "tool", "content": "not json"})
    assert not is_error_tool_call({"role": "assistant", "content": OBS_PROTOCOL_ERROR["content"]})
    malformed = json.dumps({"error": "REHEARSAL_FAILED", "message": ""})
    assert is_error_tool_call({"role": "tool", "content": malformed})


def test_tool_focused_items_are_false_without_a_judge_call_after_an_error_tool_call():
    """Step 1 is followed by an error tool call: item a (focus_on assistant.tool_calls) is False there
    without a call; b is judged at step 1; both at step 2 -> 3 calls (4 with the switch off)."""
    judge, completions = _judge()
    res = checklist_reward([USER, STEP1, OBS_PROTOCOL_ERROR, FINAL], [ITEMS], judge)
    assert [q for _, q in completions.asked] == ["stated the temperature?", "called get_weather?",
                                                 "stated the temperature?"]
    assert res.detail["auto_false"] == 1 and res.reward == 0.0  # and the turn is zeroed anyway
    judge, completions = _judge()
    checklist_reward([USER, STEP1, OBS_PROTOCOL_ERROR, FINAL], [ITEMS], judge,
                     RewardRules(auto_false_on_error_tool_call=False))
    assert len(completions.asked) == 4


def test_tool_content_focus_is_also_false_without_a_judge_call():
    """focus_on "tool.content" counts like "assistant.tool_calls" (authors' interaction.py)."""
    judge, completions = _judge()
    items = [dict(ITEMS[0], focus_on="tool.content"), ITEMS[1]]
    res = checklist_reward([USER, STEP1, OBS_AUTHORS_ERROR], [items], judge)
    assert [q for _, q in completions.asked] == ["stated the temperature?"]
    assert res.reward == 0.0


# ---------------------------------------------------------------------------- 4. judge inputs
def test_v2_prompt_renders_the_authors_fields():
    judge, completions = _judge()
    item = {"question": "called get_weather?", "focus_on": "assistant.tool_calls", "pass_condition": "P",
            "failure_examples": ["F1"], "required_for_next_turn": True,
            "evidence": [{"snippet": "SNIP-1", "source": "x"}, {"snippet": "SNIP-2"}], "weight": 1.0}
    earlier = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "FIRST"},
               {"role": "assistant", "content": "OLD ANSWER"}]
    checklist_reward([*earlier, USER, STEP1, OBS_OK, FINAL], [[item], [item]], judge)
    user = completions.last["messages"][1]["content"]
    assert "Focus on: assistant.tool_calls" in user and "Pass condition: P" in user
    assert 'Reference snippets: ["SNIP-1", "SNIP-2"]' in user and '"source"' not in user
    assert "required_for_next_turn" not in user and "True" not in user.split("# Checklist item")[1]
    previous, current = user.split("# Current turn before the step")
    assert "OLD ANSWER" in previous and "weather in Paris" not in previous
    assert "weather in Paris" in current and "get_weather" in current  # the turn's earlier step
    assert judge.prompt["version"] == "checklist_judge_v3"


def test_v3_shows_each_step_as_its_reasoning_visible_reply_and_calls() -> None:
    """The authors' judge view (get_messages_str_v2): a thinking step's reasoning, kept by the rollout as
    envace_reasoning, is shown beside its visible reply and its calls; v2 shows the reply and calls only."""
    item = {"question": "Q?", "focus_on": "assistant.tool_calls", "pass_condition": "P", "weight": 1.0}
    step = {**STEP1, "content": "Let me check.", "envace_reasoning": "The user wants Paris weather."}
    v3, c3 = _judge()
    checklist_reward([USER, step, OBS_OK, FINAL], [[item]], v3)
    shown = c3.last["messages"][1]["content"]
    assert "reasoning: The user wants Paris weather.\nvisible reply: Let me check.\ntool calls: [{" in shown
    assert "reasoning: None\nvisible reply: " in shown  # the final answer: no think block
    v2, c2 = _judge("checklist_judge_v2")
    checklist_reward([USER, step, OBS_OK, FINAL], [[item]], v2)
    assert "Paris weather" not in c2.last["messages"][1]["content"]


def test_v1_prompt_and_cache_key_by_version():
    j1, c1 = _judge("checklist_judge_v1")
    j2, _ = _judge()
    checklist_reward([USER, STEP1, OBS_OK, FINAL], [ITEMS], j1)
    assert "Focus: assistant.content" in c1.last["messages"][1]["content"]  # v1 falls back to focus_on
    msgs = [{"role": "user", "content": "x"}]
    assert j1._key(msgs) != j2._key(msgs)


def test_old_focus_key_is_accepted():
    judge, completions = _judge()
    item = {"question": "q?", "focus": "assistant.content", "weight": 1.0}
    checklist_reward([USER, FINAL], [[item]], judge)
    assert "Focus on: assistant.content" in completions.last["messages"][1]["content"]


# -------------------------------------------------------------------------- 5. empty responses
def test_empty_response_penalty_is_per_row():
    rows = ["<tool_call>\n{}\n</tool_call>", "", "  \n", "<think>x</think>", {"role": "rehearse", "text": ""}]
    per_row = RewardRules(empty_response_penalty="per_row")  # the authors' rule, the default
    assert row_penalties(rows, per_row) == row_penalties(rows) == [0.0, -0.1, -0.1, 0.0, -0.1]
    assert row_penalties(rows, RewardRules(empty_response_penalty="episode")) == [0.0] * 5
    # the episode reward itself is computed as usual: an empty ACT output is a parse error -> 0, unjudged;
    # its row then gets 0 - 0.1 (authors: reward at the row's last token minus 0.1)
    judge, completions = _judge()
    res = checklist_reward([USER, {"role": "assistant", "content": ""}], [ITEMS], judge, per_row,
                           termination="act_parse_error")
    assert res.reward == 0.0 and completions.asked == []
    # ours before: -0.1 replaces the episode reward (rows all get it)
    judge, _ = _judge()
    old = checklist_reward([USER, {"role": "assistant", "content": ""}], [ITEMS], judge,
                           RewardRules(empty_response_penalty="episode"))
    assert old.reward == -0.1


def test_compute_score_rules_from_env(monkeypatch):
    """ENVACE_REWARD_RULES reaches compute_score; rows give row_penalties; old values = old rewards."""
    monkeypatch.setenv("ENVACE_REWARD", "reference_match")
    monkeypatch.setenv("ENVACE_REWARD_RULES", json.dumps({"empty_response_penalty": "per_row"}))
    ref = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}])
    extra = {"messages": [USER, STEP1, OBS_OK], "reference_calls": ref, "termination": "max_turns",
             "rows": json.dumps(["<tool_call>..</tool_call>", "<execution_result>{}</execution_result>", ""])}
    out = rw.compute_score("cm2", "", None, extra)
    assert out == {"score": 0.0, "judge_failures": 0, "judge_verdicts": 0, "dropped": False,
                   "row_penalties": [0.0, 0.0, -0.1]}
    monkeypatch.setenv("ENVACE_REWARD_RULES", json.dumps({"judge_terminated": True,
                                                          "empty_response_penalty": "episode"}))
    out = rw.compute_score("cm2", "", None, extra)
    assert out["score"] == 1.0 and out["row_penalties"] == [0.0, 0.0, 0.0]
    empty = {"messages": [USER, {"role": "assistant", "content": ""}], "reference_calls": ref}
    assert rw.compute_score("cm2", "", None, empty) == {"score": -0.1, "judge_failures": 0,
                                                        "judge_verdicts": 0, "dropped": False}


def test_rules_config_round_trip_and_validation(repo_root):
    from envace.common.config import load_config

    assert reward_rules_from_env(reward_rules_env(load_config(repo_root / "config" / "config.yaml"))) \
        == RewardRules()
    # the smoke config's one difference: the judge's step view without its reasoning field (the smoke
    # model does not think, so v3's reasoning would always be "None")
    smoke = reward_rules_from_env(reward_rules_env(load_config(repo_root / "config" / "smoke.yaml")))
    assert smoke == RewardRules(judge_prompt="checklist_judge_v2")
    assert reward_rules_from_env({}) == RewardRules()
    assert reward_rules_from_env({"ENVACE_REWARD_RULES": json.dumps({"turn_normaliser": "reached_turns"})}) \
        == RewardRules(turn_normaliser="reached_turns")
    with pytest.raises(ValueError, match="unknown reward_rules"):
        RewardRules.from_mapping({"bogus": 1})
    with pytest.raises(ValueError, match="zero_turn_on"):
        RewardRules(zero_turn_on="all")
    env = {"ENVACE_JUDGE_BASE_URL": "u", "ENVACE_JUDGE_MODEL": "m",
           "ENVACE_REWARD_RULES": json.dumps({"judge_prompt": "checklist_judge_v1"})}
    assert judge_config_from_env(env).prompt_name == "checklist_judge_v1"


def test_all_old_values_reproduce_the_old_rewards():
    """RewardRules.ours(): the scenarios above give the pre-issue-12 values."""
    two_turns = [USER, STEP1, OBS_OK, FINAL, {"role": "user", "content": "again?"},
                 {"role": "assistant", "content": "Still 20 degrees."}]
    cases = [([USER, STEP1, OBS_OK, FINAL], [ITEMS], "max_turns", 1.0),
             ([USER, STEP1, OBS_RESULT_ERROR, FINAL], [ITEMS], "final_answer", 0.0),
             (two_turns, [ITEMS, ITEMS, ITEMS], "final_answer", 0.7),
             ([USER, {"role": "assistant", "content": " "}], [ITEMS], "act_parse_error", -0.1)]
    for chat, checklists, termination, expected in cases:
        judge, _ = _judge("checklist_judge_v1")
        assert checklist_reward(chat, checklists, judge, OLD, termination).reward == pytest.approx(expected)


# ------------------------------------------------------------------------- required_for_next_turn
REQUIRED = [dict(ITEMS[0]), dict(ITEMS[1], required_for_next_turn=True)]  # b: "stated the temperature?"
NOT_SAID = {"role": "assistant", "content": "Done."}


def test_required_item_failing_stops_the_dialogue_and_later_turns_score_zero():
    """Turn 0: a passes (step 1), required b at no step -> stop before turn 1. The episode reward reuses
    the 4 verdicts (2 steps x 2 items, none asked again): (0.6 + 0) / 2 checklist turns = 0.3."""
    judge, completions = _judge()
    chat = [USER, STEP1, OBS_OK, NOT_SAID]
    assert turn_passes_required(chat, [REQUIRED, ITEMS], 0, judge) is False
    assert len(completions.asked) == 4
    res = checklist_reward(chat, [REQUIRED, ITEMS], judge, termination="dialogue_stopped")
    assert res.turn_scores == pytest.approx([0.6]) and res.reward == pytest.approx(0.3)
    assert len(completions.asked) == 4 and judge.metrics.cache_hits == 4
    assert len(set(completions.asked)) == 4  # each (step, item) once
    # b said at the final answer: the dialogue goes on; b not required: it goes on too
    judge, _ = _judge()
    assert turn_passes_required([USER, STEP1, OBS_OK, FINAL], [REQUIRED, ITEMS], 0, judge) is True
    assert turn_passes_required(chat, [ITEMS, ITEMS], 0, judge) is True
    # the switch false (ours before): never stopped, no judge call
    judge, completions = _judge()
    off = RewardRules(stop_on_required_failed=False)
    assert turn_passes_required(chat, [REQUIRED, ITEMS], 0, judge, off) is True
    assert completions.asked == []
    assert RewardRules.ours().stop_on_required_failed is False
    # a turn past the checklists or the chat: nothing to check
    assert turn_passes_required(chat, [REQUIRED], 1, judge) is True


def test_required_item_judged_at_a_later_turn_of_the_dialogue():
    """Turn 1's items are judged on turn 1's steps only (turn 0's verdicts come from the cache)."""
    judge, completions = _judge()
    chat = [USER, STEP1, OBS_OK, FINAL, {"role": "user", "content": "and Rome?"}, NOT_SAID]
    assert turn_passes_required(chat, [ITEMS, REQUIRED, ITEMS], 1, judge) is False
    assert len(completions.asked) == 2  # one step x two items
    res = checklist_reward(chat, [ITEMS, REQUIRED, ITEMS], judge, termination="dialogue_stopped")
    assert res.turn_scores == pytest.approx([1.0, 0.0]) and res.reward == pytest.approx(1 / 3)
    assert len(completions.asked) == 2 + 4  # turn 0 was new, turn 1 came from the cache


class _Malformed(_Completions):
    """Item b's verdicts are never valid JSON."""

    def create(self, **kw):
        reply = super().create(**kw)
        if "temperature" in self.asked[-1][1]:
            reply.choices[0].message.content = "not json"
        return reply


def test_a_failed_judge_call_stops_the_dialogue_and_is_not_asked_again():
    """Authors: an API failure or a malformed verdict of any item (b is not required here) ends the
    dialogue. Each failed verdict took 1 + max_retries (3) requests once; the episode reward gets the
    failures without asking again (failure_policy fail: b not passed)."""
    completions = _Malformed()
    client = SimpleNamespace(chat=SimpleNamespace(completions=completions))
    config = JudgeConfig(base_url="http://unused", model="judge", max_concurrency=1, max_retries=3)
    judge = ChecklistJudge(config, client=client, sleep=lambda s: None)
    chat = [USER, STEP1, OBS_OK, FINAL]
    assert turn_passes_required(chat, [ITEMS, ITEMS], 0, judge) is False
    assert len(completions.asked) == 2 + 2 * 4 and judge.metrics.failures == 2
    res = checklist_reward(chat, [ITEMS, ITEMS], judge, termination="dialogue_stopped")
    assert len(completions.asked) == 10 and judge.metrics.failures == 2
    assert res.failures == 2 and res.turn_scores == pytest.approx([0.6]) and res.reward == pytest.approx(0.3)
    # remembered for one reuse only: a third request of the same chat asks again
    checklist_reward(chat, [ITEMS, ITEMS], judge, termination="dialogue_stopped")
    assert len(completions.asked) == 10 + 2 * 4


def test_dialogue_continues_from_env(monkeypatch):
    """The verl hook: checklists from ground_truth (JSON), rules from ENVACE_REWARD_RULES, the process's
    judge; reference_match has no judge and never stops."""
    judge, completions = _judge()
    monkeypatch.setattr(rw, "_PROCESS_JUDGE", judge)
    monkeypatch.delenv("ENVACE_REWARD_RULES", raising=False)
    chat = [USER, STEP1, OBS_OK, NOT_SAID]
    truth = json.dumps([REQUIRED, ITEMS])
    monkeypatch.setenv("ENVACE_REWARD", "checklist")
    assert rw.dialogue_continues(chat, 0, truth, {}) is False and len(completions.asked) == 4
    assert rw.dialogue_continues(chat, 0, None, {"checklists": truth}) is False
    assert len(completions.asked) == 4  # cached
    monkeypatch.setenv("ENVACE_REWARD_RULES", json.dumps({"stop_on_required_failed": False}))
    assert rw.dialogue_continues(chat, 0, truth, {}) is True
    monkeypatch.delenv("ENVACE_REWARD_RULES")
    monkeypatch.setenv("ENVACE_REWARD", "reference_match")
    monkeypatch.setattr(rw, "_PROCESS_JUDGE", None)  # no judge is built
    assert rw.dialogue_continues(chat, 0, truth, {}) is True
