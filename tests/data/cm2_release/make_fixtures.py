"""Write the hand-made CM2 release fixtures beside this script (run from anywhere; deterministic).

The records are hand-made dialogues in CM2's labelled layout (``{uuid, messages, tools, checklists}``, as
``pipeline/4_checklist_labeling/checklist_labeling_v3.py`` of ``namezhenzhang/CM2-RLCR-Tool-Agent``
writes it: every message has ``tool_calls``; tool messages have no ``tool_call_id``; checklists are
``[annotation][user turn][item]`` with CM2's item fields). They are then shaped as CM2's converters shape
them (our own code, written from reading theirs):

- ``cm2_forverl.json``: as ``pipeline/5_rl_training/convert_checklist_for_verl.py`` writes it (a JSON list,
  indent 2): ``messages`` cut after the first user message; ``extra_info`` = ``{messages (full), tools
  (json.dumps of the OpenAI tools), interaction_kwargs: {name: "checklist", checklist_list},
  need_tools_kwargs: true, original_index: uuid}``; top-level ``tools`` removed, top-level ``checklists``
  left in place (their converter deletes a key ``checklist``).
- ``cm2_forverl.parquet``: that list with ``data_source`` set (``nvidia_nemotron_checklist``) and written
  with ``datasets.Dataset.from_list(...).to_parquet``, as
  ``pipeline/5_rl_training/convert_checklist_to_parquet.py`` does. The smoke config trains on it
  (``config/smoke.yaml`` ``training.data.source``).

Records whose uuid starts with ``bad-`` are each rejected by ``envace.train.data`` for one reason.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SYSTEM = "You are a helpful assistant. Use the tools when they help."


def tool(name, description, props, required):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required}}}


WEATHER = tool("get_weather", "Current weather in a city",
               {"city": {"type": "string", "description": "City name"}}, ["city"])
ADD = tool("add", "Add two numbers", {"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"])
ORDER = tool("order_status", "Status of an order by id", {"order_id": {"type": "string"}}, ["order_id"])
CANCEL = tool("cancel_order", "Cancel an order by id", {"order_id": {"type": "string"}}, ["order_id"])


def user(text):
    return {"role": "user", "content": text, "tool_calls": []}


def system(text=SYSTEM):
    return {"role": "system", "content": text, "tool_calls": []}


def say(text):
    return {"role": "assistant", "content": text, "tool_calls": []}


def call(cid, *calls, content=""):
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"{cid}-{k}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for k, (n, a) in enumerate(calls)]}


def result(obj):
    return {"role": "tool", "content": json.dumps(obj), "tool_calls": []}


def item(cid, turn, step, source, snippet, question, weight, required=True, dependence=()):
    return {"id": cid, "evidence": [{"turn": turn, "step": step, "from": source, "snippet": snippet}],
            "focus_on": source, "question": question,
            "pass_condition": f"Passes if the answer is yes: {question}",
            "failure_examples": ["No tool call observed", "The reply contradicts the tool result"],
            "required_for_next_turn": required, "dependence": list(dependence), "weight": weight,
            "extra_info": {"price_usd": 0.0}}


def weather(uid, city, temp):
    args = json.dumps({"city": city})
    return {"uuid": uid, "messages": [
        system(), user(f"What is the weather in {city}?"),
        call(uid, ("get_weather", {"city": city})),
        result({"city": city, "temperature": temp, "unit": "celsius"}),
        say(f"It is {temp} degrees celsius in {city}.")],
        "tools": [WEATHER, ADD], "checklists": [[[
            item("C0", 0, 1, "assistant.tool_calls",
                 f'"name": "get_weather", "arguments": {json.dumps(args)}',
                 f"Did the assistant call get_weather with city {city}?", 0.7),
            item("C1", 0, 2, "assistant.content.user_visible_reply", f"{temp} degrees",
                 f"Does the final reply state the temperature {temp}?", 0.3, required=False,
                 dependence=["C0"])]]]}


def add(uid, a, b):
    return {"uuid": uid, "messages": [
        user(f"Add {a} and {b}."), call(uid, ("add", {"a": a, "b": b})), result({"result": a + b}),
        say(f"The sum is {a + b}.")],
        "tools": [ADD, WEATHER], "checklists": [[[
            item("C0", 0, 1, "assistant.tool_calls", '"name": "add"',
                 f"Did the assistant call add with a={a} and b={b}?", 0.6),
            item("C1", 0, 2, "assistant.content.user_visible_reply", str(a + b),
                 f"Does the final reply say {a + b}?", 0.4, required=False)]]]}


def order(uid, oid):
    """Three user turns, one checklist per turn; tool calls in turns 0 and 2."""
    return {"uuid": uid, "messages": [
        system(), user(f"Where is my order {oid}?"),
        call(uid + "a", ("order_status", {"order_id": oid}),
             content="<think>\nThe user wants the order status.\n</think>"),
        result({"order_id": oid, "status": "processing"}),
        say(f"Order {oid} is still processing."),
        user("And the weather in Paris?"),
        say("I can only help with orders."),
        user(f"Then please cancel order {oid}."),
        call(uid + "b", ("cancel_order", {"order_id": oid})),
        result({"order_id": oid, "cancelled": True}),
        say(f"Order {oid} is cancelled.")],
        "tools": [ORDER, CANCEL], "checklists": [[
            [item("C0", 0, 1, "assistant.tool_calls", f'"order_id": "{oid}"',
                  f"Did the assistant call order_status with order_id {oid}?", 0.5),
             item("C1", 0, 3, "assistant.content.user_visible_reply", "processing",
                  "Does the reply say the order is processing?", 0.5, dependence=["C0"])],
            [item("C0", 1, 1, "assistant.content.user_visible_reply", "only help with orders",
                  "Does the reply say it cannot check the weather?", 1.0, required=False)],
            [item("C0", 2, 1, "assistant.tool_calls", '"name": "cancel_order"',
                  f"Did the assistant call cancel_order with order_id {oid}?", 0.75),
             item("C1", 2, 3, "assistant.content.user_visible_reply", "cancelled",
                  "Does the reply confirm the cancellation?", 0.25, required=False, dependence=["C0"])],
        ]]}


def parallel(uid):
    return {"uuid": uid, "messages": [
        system(), user("Weather in Paris and in Rome?"),
        call(uid, ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})),
        result({"city": "Paris", "temperature": 18}), result({"city": "Rome", "temperature": 25}),
        say("Paris 18, Rome 25.")],
        "tools": [WEATHER], "checklists": [[[
            item("C0", 0, 1, "assistant.tool_calls", '"city": "Paris"',
                 "Did it call get_weather for Paris?", 0.5),
            item("C1", 0, 1, "assistant.tool_calls", '"city": "Rome"',
                 "Did it call get_weather for Rome?", 0.5)]]]}


def good() -> list[dict]:
    return [weather("cm2-weather-0", "Paris", 20), weather("cm2-weather-1", "Berlin", 21),
            add("cm2-add-0", 2, 3), add("cm2-add-1", 7, 8), order("cm2-order-0", "12345"),
            parallel("cm2-weather-par"), weather("cm2-weather-2", "Tokyo", 22), add("cm2-add-2", 4, 5),
            order("cm2-order-1", "777")]


def bad() -> list[dict]:
    """Labelled records each broken one way (the shaping below may break the row instead)."""
    out = []

    def broken(uid, base, edit):
        rec = copy.deepcopy(base)
        rec["uuid"] = uid
        edit(rec)
        out.append(rec)

    w = weather("x", "Oslo", 5)
    broken("bad-weights-zero", w, lambda r: [it.update(weight=0.0) for it in r["checklists"][0][0]])
    broken("bad-weight-negative", w, lambda r: r["checklists"][0][0][0].update(weight=-0.5))
    broken("bad-no-question", w, lambda r: r["checklists"][0][0][1].update(question=None))
    broken("bad-empty-turn", w, lambda r: r["checklists"][0].__setitem__(0, []))
    broken("bad-more-turns", w, lambda r: r["checklists"][0].append(r["checklists"][0][0]))
    broken("bad-no-user", w, lambda r: r.update(messages=[m for m in r["messages"] if m["role"] != "user"]))
    broken("bad-empty-user", w, lambda r: r["messages"][1].update(content=" "))
    broken("bad-args-not-json", w, lambda r: r["messages"][2]["tool_calls"][0]["function"].update(
        arguments="{city: Oslo"))
    broken("bad-orphan-tool", w, lambda r: r["messages"].insert(2, result({"x": 1})))
    broken("bad-tool-schema", w, lambda r: r.update(tools=[tool("get_weather", "w", {"city": {}}, ["city"])]))
    o = order("x", "1")
    broken("bad-empty-later-user", o, lambda r: r["messages"][5].update(content=""))
    broken("cm2-add-0", add("x", 1, 1), lambda r: None)  # duplicate uuid
    return out


def for_verl(rec: dict) -> dict:
    """Shape a labelled record as CM2's ``convert_checklist_for_verl`` does (see the module docstring)."""
    row = dict(rec)
    messages = row["messages"]
    first = next((k for k, m in enumerate(messages) if m["role"] == "user"), None)
    row["messages"] = [] if first is None else messages[: first + 1]
    tools = row.pop("tools")
    row["extra_info"] = {"messages": messages, "tools": json.dumps(tools),
                         "interaction_kwargs": {"name": "checklist", "checklist_list": row["checklists"]},
                         "need_tools_kwargs": True, "original_index": row["uuid"]}
    return row


def rows() -> list[dict]:
    out = [for_verl(r) for r in good() + bad()]
    # broken only after shaping: the prompt and the full dialogue disagree; tools not JSON; no extra_info
    mismatch = for_verl(weather("bad-prompt-mismatch", "Rome", 9))
    mismatch["messages"] = [user("Something else?")]
    not_json = for_verl(weather("bad-tools-not-json", "Rome", 9))
    not_json["extra_info"]["tools"] = "[{"
    no_info = for_verl(weather("bad-no-extra-info", "Rome", 9))
    no_info["extra_info"] = None
    return out + [mismatch, not_json, no_info]


def main() -> None:
    records = rows()
    (HERE / "cm2_forverl.json").write_text(json.dumps(records, ensure_ascii=False, indent=2) + "\n",
                                           encoding="utf-8")
    import datasets

    for r in records:
        r.setdefault("data_source", "nvidia_nemotron_checklist")
    datasets.Dataset.from_list(records).to_parquet(str(HERE / "cm2_forverl.parquet"))


if __name__ == "__main__":
    main()
