"""CM2 training data: loading, normalisation, filtering, and the parquet the trainers read.

Input layout (default): **CM2's release rows**, i.e. the records as CM2's own converters write them
(repository ``namezhenzhang/CM2-RLCR-Tool-Agent``: ``pipeline/5_rl_training/convert_checklist_for_verl.py``
writes a JSON list, ``pipeline/5_rl_training/convert_checklist_to_parquet.py`` turns it into parquet with
``datasets.Dataset.from_list``; their input is the labelled ``{uuid, messages, tools, checklists}`` of
``pipeline/4_checklist_labeling/checklist_labeling_v3.py``), and as the EnvACE authors' ``ChecklistDataset``
(``Within-yao/EnvACE``: ``agent_system/dataset/checklist_dataset.py``, run with ``data.prompt_key=messages``)
reads them. One row:

- ``uuid``: the dialogue id (also ``extra_info.original_index``); ``data_source``
  (``"nvidia_nemotron_checklist"``, added by the parquet converter);
- ``messages``: the prompt, i.e. the reference dialogue cut after its first user message (any system
  message before it kept);
- ``checklists``: left at top level by CM2's converter (it deletes a key ``checklist``), same value as
  ``extra_info.interaction_kwargs.checklist_list``; not read here;
- ``extra_info``: ``messages`` (the full reference dialogue: ``role`` / ``content`` / ``tool_calls``;
  assistant ``tool_calls`` items ``{id, type, function: {name, arguments: <JSON string>}}``; tool messages
  answer the calls in order, without ``tool_call_id``), ``tools`` (a JSON string of OpenAI tools
  ``{"type": "function", "function": {...}}``), ``interaction_kwargs`` (``{"name": "checklist",
  "checklist_list": [...]}``), ``need_tools_kwargs`` (true) and ``original_index`` (the uuid).

``checklist_list`` is nested ``[annotation][user turn][item]`` (the authors' ``envs.py``: "num_checklists
x num_turns x num_standards_per_turn"); CM2's labelling run writes one annotation (``--num_checklists 1``)
and the authors' scripts keep one (``data.max_num_checklist=1``), so annotation 0 is used. Items keep
CM2's own fields unchanged (``id``, ``evidence`` ``[{turn, step, from, snippet}]``, ``focus_on``,
``question``, ``pass_condition``, ``failure_examples``, ``required_for_next_turn``, ``dependence``,
``weight``, ``extra_info``); only ``weight`` is rescaled (below). In a parquet, Arrow's struct typing gives
every item / message the union of the keys, ``None`` where a record lacked one.

Also read: CM2's labelled records before conversion (top-level ``uuid``, ``messages``, ``tools`` and
``checklists`` nested as above; the prompt is cut the same way) and, for the hand-written fixture
``tests/data/cm2_fixture.jsonl``, our former reading of the paper (top-level ``id``, ``tools``,
``messages`` and ``checklists`` as ``[user turn][item]`` or ``[{"turn", "items"}]``, items with at least
``question``). The layout is told apart per record: key ``extra_info`` present = CM2 release row; top-level
``checklists`` whose turns are lists of lists = CM2 labelled record; otherwise the former layout.

Normalisation (:func:`normalize_record`) produces a :class:`TrainingExample` with exactly what the agent
loop and the reward need:

- ``prompt``: the initial chat (the system message, if any, and the first user message), ``role`` and
  ``content`` only.
- ``user_turns``: the contents of the later user messages (turns 1..n-1), replayed by the agent loop; as
  in the authors' ``interaction.py`` the number of turns is the number of checklist turns, so user
  messages past the last checklist turn are dropped, and a replayed user message may not be empty.
- ``references``: ``{"call", "response"}`` pairs from the record's own assistant tool calls and the tool
  messages answering them (matched by ``tool_call_id`` when present, else in order). Privileged: they go
  only into the rehearsal prompt, never into the ACT context.
- ``reference_calls``: the reference calls of the first user turn (for the verifiable rewards).
- ``reference_answer``: the content of the last assistant message of the first user turn that calls no
  tool (the reference final answer; ``""`` when there is none), for ``reward: reference_outcome``.
- ``checklists``: per user turn, items with weights rescaled to sum to 1 (the paper: weights sum to 1 per
  turn; CM2's labels already do, the authors' code uses them raw); a turn whose weights sum to 0 is a bad
  record.

Bad records (reported with their index and reason, skipped, counted in the summary; a bad record never
stops the conversion) include tools that fail verl's ``OpenAIFunctionToolSchema`` (the authors'
``_filter_invalid_tool_schemas`` drops them). Filtering: prompts (chat template with tools and generation
prompt) longer than ``training.data.max_prompt_tokens_filter`` tokens are dropped (authors: ``doc2len <=
max_prompt_length - 500`` with ``max_prompt_length=4000``, i.e. 3,500).

Parquet layout (one row per example; verl's ``RLHFDataset`` reads ``prompt``, ``data_source``,
``reward_model`` and ``extra_info``): ``data_source`` ("cm2"), ``prompt`` (list of ``{role, content}``),
``uid``, ``reward_model`` (``{"style": "checklist", "ground_truth": <checklists JSON>}``) and
``extra_info`` (``index``, ``uid``, ``prompt_tokens`` and JSON strings ``tools``, ``references``,
``reference_calls``, ``checklists``, ``user_turns``; the string ``reference_answer``). JSON strings keep
heterogeneous tool schemas out of parquet's struct typing. :func:`read_training_parquet` turns rows back
into :class:`TrainingExample` (a row without ``user_turns`` reads as single-turn, one without
``reference_answer`` as having none).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envace.common.atomic import atomic_write
from envace.core.tools import render_chat

__all__ = [
    "BadRecord",
    "TrainingExample",
    "iter_source_records",
    "local_source_path",
    "normalize_record",
    "record_layout",
    "count_prompt_tokens",
    "convert",
    "write_training_parquet",
    "read_training_parquet",
    "DataSummary",
]

_LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet")


class BadRecord(ValueError):
    """A record that cannot be used; the message is the reason."""


@dataclass
class TrainingExample:
    """One normalised CM2 example (see the module docstring)."""

    uid: str
    index: int
    prompt: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    references: list[dict[str, Any]]
    reference_calls: list[dict[str, Any]]
    checklists: list[list[dict[str, Any]]]
    prompt_tokens: int = 0
    user_turns: list[str] = field(default_factory=list)
    reference_answer: str = ""

    def to_row(self) -> dict[str, Any]:
        """The parquet row (see the module docstring)."""
        checklists = json.dumps(self.checklists, ensure_ascii=False)
        return {
            "data_source": "cm2",
            "prompt": [{"role": m["role"], "content": m["content"]} for m in self.prompt],
            "uid": self.uid,
            "reward_model": {"style": "checklist", "ground_truth": checklists},
            "extra_info": {
                "index": self.index,
                "uid": self.uid,
                "prompt_tokens": self.prompt_tokens,
                "tools": json.dumps(self.tools, ensure_ascii=False),
                "references": json.dumps(self.references, ensure_ascii=False),
                "reference_calls": json.dumps(self.reference_calls, ensure_ascii=False),
                "checklists": checklists,
                "user_turns": json.dumps(self.user_turns, ensure_ascii=False),
                "reference_answer": self.reference_answer,
            },
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TrainingExample:
        """Inverse of :meth:`to_row`."""
        info = row["extra_info"]
        return cls(
            uid=str(info["uid"]),
            index=int(info["index"]),
            prompt=[{"role": str(m["role"]), "content": str(m["content"])} for m in row["prompt"]],
            tools=json.loads(info["tools"]),
            references=json.loads(info["references"]),
            reference_calls=json.loads(info["reference_calls"]),
            checklists=json.loads(info["checklists"]),
            prompt_tokens=int(info["prompt_tokens"]),
            user_turns=[str(u) for u in json.loads(info.get("user_turns") or "[]")],
            reference_answer=str(info.get("reference_answer") or ""),
        )


@dataclass
class DataSummary:
    """Counts of a conversion; ``bad`` lists ``{"index", "reason"}``, ``filtered`` the too-long ones."""

    source: str
    total: int = 0
    kept: int = 0
    bad: list[dict[str, Any]] = field(default_factory=list)
    filtered: list[dict[str, Any]] = field(default_factory=list)
    max_prompt_tokens_filter: int = 0
    prompt_tokens_max: int = 0
    prompt_tokens_mean: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["n_bad"] = len(self.bad)
        out["n_filtered"] = len(self.filtered)
        return out


def _maybe_json(value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise BadRecord(f"{what} is a string but not JSON") from exc
    return value


def local_source_path(source: str) -> Path | None:
    """The local file ``source`` names, or ``None`` when it is a Hugging Face dataset id.

    Local: a known suffix (``.json``, ``.jsonl``, ``.parquet``), an absolute path or one starting with
    ``./`` / ``../`` (whether or not it exists), or any existing path. The workflow uses this at planning
    time so a missing local source fails before any job runs.
    """
    path = Path(source)
    if path.suffix in _LOCAL_SUFFIXES or path.is_absolute() or source.startswith(("./", "../")):
        return path
    return path if path.exists() else None


def iter_source_records(source: str) -> Iterator[tuple[int, dict[str, Any] | BadRecord]]:
    """Yield ``(index, record)`` from a local JSON / JSONL / parquet file or a Hugging Face dataset id.

    A line of a JSONL file that is not a JSON object is yielded as a :class:`BadRecord` (not raised), so
    the caller can report it by index. The ``datasets`` library is imported only for a non-local source.

    Raises:
        FileNotFoundError: a local path (:func:`local_source_path`) that is not a file.
        ValueError: a JSON file whose top level is not a list of records.
    """
    path = local_source_path(source)
    if path is not None:
        if not path.is_file():
            raise FileNotFoundError(f"training data source not found: {source}")
        if path.suffix == ".jsonl":
            with path.open(encoding="utf-8") as fh:
                for i, line in enumerate(fh):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except ValueError as exc:
                        yield i, BadRecord(f"line is not JSON: {exc}")
                        continue
                    yield i, rec if isinstance(rec, dict) else BadRecord("line is not a JSON object")
        elif path.suffix == ".parquet":
            import pyarrow.parquet as pq

            for i, rec in enumerate(pq.read_table(path).to_pylist()):
                yield i, rec
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, list):
                raise ValueError(f"{source}: a JSON source must hold a list of records")
            for i, rec in enumerate(data):
                yield i, rec if isinstance(rec, dict) else BadRecord("record is not a JSON object")
        return
    import datasets  # only for a Hugging Face dataset id

    name, _, split = source.partition(":")
    for i, rec in enumerate(datasets.load_dataset(name, split=split or "train")):
        yield i, dict(rec)


def _call_of(item: Any) -> dict[str, Any]:
    """``{"name", "arguments"}`` of one assistant ``tool_calls`` item (arguments decoded to a dict)."""
    if not isinstance(item, dict):
        raise BadRecord("a tool_calls item is not an object")
    fn = item.get("function", item)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise BadRecord("a tool call has no name")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as exc:
            raise BadRecord(f"tool call {fn['name']!r} has arguments that are not JSON") from exc
    if not isinstance(args, dict):
        raise BadRecord(f"tool call {fn['name']!r} has arguments that are not an object")
    return {"name": fn["name"], "arguments": args}


def _tools(raw: Any) -> list[dict[str, Any]]:
    tools = _maybe_json(raw, "tools")
    if not isinstance(tools, list) or not tools:
        raise BadRecord("tools must be a non-empty list")
    out = []
    for tool in tools:
        spec = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise BadRecord("a tool has no function name")
        out.append({"type": "function", "function": spec})
    return out


def _tool_schema_error(tool: dict[str, Any]) -> str | None:
    """Why ``tool`` fails verl's ``OpenAIFunctionToolSchema`` (``Within-yao/EnvACE``:
    ``verl/tools/schemas.py``; pydantic, extra keys ignored), or ``None``.

    Function: ``name`` and ``description`` strings, ``parameters`` with a string ``type``, a ``properties``
    object whose values each have a string ``type`` (optional ``description`` string, ``enum`` list of
    strings) and a ``required`` list of strings; ``strict`` a boolean when given.
    """
    fn = tool["function"]
    if not isinstance(tool.get("type"), str):
        return "no type"
    if not isinstance(fn.get("description"), str):
        return "no description"
    params = fn.get("parameters")
    if not isinstance(params, dict) or not isinstance(params.get("type"), str):
        return "parameters without a type"
    props = params.get("properties")
    if not isinstance(props, dict):
        return "parameters without properties"
    for key, prop in props.items():
        if not isinstance(prop, dict) or not isinstance(prop.get("type"), str):
            return f"property {key!r} has no string type"
        if prop.get("description") is not None and not isinstance(prop["description"], str):
            return f"property {key!r} has a description that is not a string"
        enum = prop.get("enum")
        if enum is not None and not (isinstance(enum, list) and all(isinstance(e, str) for e in enum)):
            return f"property {key!r} has an enum that is not a list of strings"
    required = params.get("required")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return "parameters without a required list of strings"
    if "strict" in fn and fn["strict"] is not None and not isinstance(fn["strict"], bool):
        return "strict is not a boolean"
    return None


def _check_tool_schemas(tools: list[dict[str, Any]]) -> None:
    for tool in tools:
        why = _tool_schema_error(tool)
        if why:
            raise BadRecord(f"tool {tool['function']['name']!r} fails verl's OpenAIFunctionToolSchema "
                            f"({why}; the authors' dataset drops such records)")


def _checklists(raw: Any, n_user_turns: int) -> list[list[dict[str, Any]]]:
    """Per-turn checklists with weights rescaled to sum to 1; items keep their own fields."""
    raw = _maybe_json(raw, "checklists")
    if not isinstance(raw, list) or not raw:
        raise BadRecord("checklists must be a non-empty list (one entry per user turn)")
    turns: list[list[dict[str, Any]]] = []
    for t, entry in enumerate(raw):
        items = entry.get("items") if isinstance(entry, dict) else entry
        if not isinstance(items, list) or not items:
            raise BadRecord(f"checklist of turn {t} has no items")
        clean = []
        for j, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("question"), str):
                raise BadRecord(f"checklist item {t}.{j} has no question")
            weight = item.get("weight", 1.0)
            if not isinstance(weight, int | float) or isinstance(weight, bool) or weight < 0:
                raise BadRecord(f"checklist item {t}.{j} has an invalid weight {weight!r}")
            clean.append({**item, "id": str(item.get("id") or f"{t}.{j}"), "weight": float(weight)})
        total = sum(item["weight"] for item in clean)
        if total <= 0:
            raise BadRecord(f"checklist weights of turn {t} sum to 0")
        for item in clean:
            item["weight"] = item["weight"] / total
        turns.append(clean)
    if len(turns) > n_user_turns:
        raise BadRecord(f"{len(turns)} checklists for {n_user_turns} user turns")
    return turns


def _first_annotation(raw: Any, what: str) -> Any:
    """Annotation 0 of a CM2 ``[annotation][user turn][item]`` list (authors: ``max_num_checklist=1``)."""
    raw = _maybe_json(raw, what)
    if not isinstance(raw, list) or not raw or not isinstance(raw[0], list):
        raise BadRecord(f"{what} must be a non-empty list of annotations, each a list of user turns")
    return raw[0]


def _is_cm2_labelled(record: dict[str, Any]) -> bool:
    """A CM2 labelled record (input of ``convert_checklist_for_verl``): ``[annotation][turn][item]``."""
    raw = record.get("checklists")
    return (isinstance(raw, list) and bool(raw) and isinstance(raw[0], list) and bool(raw[0])
            and isinstance(raw[0][0], list))


def _messages(raw: Any, what: str) -> list[dict[str, Any]]:
    messages = _maybe_json(raw, what)
    if not isinstance(messages, list) or not messages:
        raise BadRecord(f"{what} must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise BadRecord(f"a message of {what} has no valid role")
    return messages


def _split_prompt(messages: list[dict[str, Any]]) -> int:
    """Index of the first user message; everything before it must be system messages."""
    first = next((k for k, m in enumerate(messages) if m["role"] == "user"), None)
    if first is None or any(m["role"] != "system" for m in messages[:first]):
        raise BadRecord("the first non-system message must be a user message")
    if not str(messages[first].get("content") or "").strip():
        raise BadRecord("the first user message is empty")
    return first


def _chat(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": str(m.get("content") or "")} for m in messages]


def _walk(messages: list[dict[str, Any]]
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str], str]:
    """References, first-turn reference calls, later user turns and the first turn's final answer of the
    dialogue after its first user message."""
    references: list[dict[str, Any]] = []
    reference_calls: list[dict[str, Any]] = []
    user_turns: list[str] = []
    answer = ""
    pending: list[tuple[str | None, dict[str, Any]]] = []  # calls awaiting their tool message
    for m in messages:
        if m["role"] == "user":
            user_turns.append(str(m.get("content") or ""))
        elif m["role"] == "assistant":
            items = _maybe_json(m.get("tool_calls") or [], "tool_calls")
            if not isinstance(items, list):
                raise BadRecord("tool_calls is not a list")
            for item in items:
                call = _call_of(item)
                pending.append((item.get("id"), call))
                if not user_turns:
                    reference_calls.append(call)
            if not items and not user_turns:
                answer = str(m.get("content") or "")
        elif m["role"] == "tool":
            if not pending:
                raise BadRecord("a tool message answers no call")
            pos = next((k for k, (cid, _) in enumerate(pending)
                        if m.get("tool_call_id") is not None and cid == m.get("tool_call_id")), 0)
            _, call = pending.pop(pos)
            content = m.get("content")
            try:
                response = json.loads(content) if isinstance(content, str) else content
            except ValueError:
                response = content
            references.append({"call": call, "response": response})
    return references, reference_calls, user_turns, answer


def _example(uid: str, index: int, messages: list[dict[str, Any]], prompt_end: int,
             tools: list[dict[str, Any]], raw_checklists: Any) -> TrainingExample:
    references, reference_calls, later, answer = _walk(messages[prompt_end + 1:])
    checklists = _checklists(raw_checklists, len(later) + 1)
    user_turns = later[: len(checklists) - 1]  # authors: the number of turns is the number of checklist turns
    for k, text in enumerate(user_turns, start=1):
        if not text.strip():
            raise BadRecord(f"user turn {k} is empty")
    _check_tool_schemas(tools)
    return TrainingExample(uid, index, _chat(messages[: prompt_end + 1]), tools, references, reference_calls,
                           checklists, user_turns=user_turns, reference_answer=answer)


def _normalize_cm2_row(record: dict[str, Any], index: int) -> TrainingExample:
    """A row as CM2's ``convert_checklist_for_verl`` / ``convert_checklist_to_parquet`` write it."""
    info = _maybe_json(record.get("extra_info"), "extra_info")
    if not isinstance(info, dict):
        raise BadRecord("extra_info is not an object")
    messages = _messages(info.get("messages"), "extra_info.messages")
    first = _split_prompt(messages)
    prompt = _messages(record.get("messages"), "messages")
    if _chat(prompt) != _chat(messages[: first + 1]):
        raise BadRecord("messages is not extra_info.messages cut after its first user message")
    tools = _tools(info.get("tools"))
    kwargs = _maybe_json(info.get("interaction_kwargs"), "extra_info.interaction_kwargs")
    if not isinstance(kwargs, dict):
        raise BadRecord("extra_info.interaction_kwargs is not an object")
    turns = _first_annotation(kwargs.get("checklist_list"), "interaction_kwargs.checklist_list")
    uid = record.get("uuid") or info.get("original_index")
    return _example(str(index if uid is None else uid), index, messages, first, tools, turns)


def _normalize_cm2_labelled(record: dict[str, Any], index: int) -> TrainingExample:
    """CM2's labelled record ``{uuid, messages, tools, checklists}`` (before the verl converter)."""
    messages = _messages(record.get("messages"), "messages")
    first = _split_prompt(messages)
    tools = _tools(record.get("tools"))
    turns = _first_annotation(record.get("checklists"), "checklists")
    uid = record.get("uuid")
    return _example(str(index if uid is None else uid), index, messages, first, tools, turns)


def _normalize_v0(record: dict[str, Any], index: int) -> TrainingExample:
    """Our former reading of the paper (the hand-written ``tests/data/cm2_fixture.jsonl``)."""
    messages = _messages(record.get("messages"), "messages")
    tools = _tools(record.get("tools"))
    first = _split_prompt(messages)
    return _example(str(record.get("id", index)), index, messages, first, tools, record.get("checklists"))


def record_layout(record: dict[str, Any]) -> str:
    """``"cm2"`` (CM2 release row), ``"cm2_labelled"`` or ``"v0"`` (our former layout); see the module
    docstring."""
    if "extra_info" in record:  # every CM2 release row has it (a parquet column: null if a row lacks it)
        return "cm2"
    return "cm2_labelled" if _is_cm2_labelled(record) else "v0"


def normalize_record(record: dict[str, Any], index: int) -> TrainingExample:
    """Normalise one record (see the module docstring). Raises :class:`BadRecord` with the reason."""
    layout = record_layout(record)
    if layout == "cm2":
        return _normalize_cm2_row(record, index)
    if layout == "cm2_labelled":
        return _normalize_cm2_labelled(record, index)
    return _normalize_v0(record, index)


def count_prompt_tokens(tokenizer: Any, example: TrainingExample) -> int:
    """Tokens of the initial ACT prompt (chat template with tools and the generation prompt)."""
    return len(render_chat(tokenizer, example.prompt, example.tools, add_generation_prompt=True,
                           tokenize=True))


def convert(source: str, tokenizer: Any, max_prompt_tokens: int,
            log: Callable[[str], None] | None = None) -> tuple[list[TrainingExample], DataSummary]:
    """Load, normalise and filter every record of ``source``.

    Args:
        source: local JSON / JSONL / parquet path or a Hugging Face dataset id (``name`` or ``name:split``).
        tokenizer: chat-template tokenizer of the run's base model (for the length filter).
        max_prompt_tokens: drop prompts longer than this (authors' script: 3,500).
        log: called with one line per bad or filtered record.
    """
    summary = DataSummary(source=source, max_prompt_tokens_filter=max_prompt_tokens)
    kept: list[TrainingExample] = []
    seen: set[str] = set()
    for index, record in iter_source_records(source):
        summary.total += 1
        try:
            if isinstance(record, BadRecord):
                raise record
            example = normalize_record(record, index)
            if example.uid in seen:
                raise BadRecord(f"duplicate id {example.uid!r}")
        except BadRecord as exc:
            summary.bad.append({"index": index, "reason": str(exc)})
            if log:
                log(f"record {index}: skipped: {exc}")
            continue
        seen.add(example.uid)
        example.prompt_tokens = count_prompt_tokens(tokenizer, example)
        if example.prompt_tokens > max_prompt_tokens:
            summary.filtered.append({"index": index, "uid": example.uid,
                                     "prompt_tokens": example.prompt_tokens})
            if log:
                log(f"record {index}: filtered: {example.prompt_tokens} prompt tokens > {max_prompt_tokens}")
            continue
        kept.append(example)
    summary.kept = len(kept)
    if kept:
        lengths = [e.prompt_tokens for e in kept]
        summary.prompt_tokens_max = max(lengths)
        summary.prompt_tokens_mean = sum(lengths) / len(lengths)
    return kept, summary


def write_training_parquet(examples: list[TrainingExample], path: str | Path) -> None:
    """Write the examples' rows to ``path`` atomically (temp file + rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([e.to_row() for e in examples])
    atomic_write(path, lambda tmp: pq.write_table(table, tmp), parents=True)


def read_training_parquet(path: str | Path) -> list[TrainingExample]:
    """Read the examples back from a parquet written by :func:`write_training_parquet`."""
    import pyarrow.parquet as pq

    return [TrainingExample.from_row(row) for row in pq.read_table(path).to_pylist()]
