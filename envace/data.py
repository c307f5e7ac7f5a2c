"""CM2 training data: loading, normalisation, filtering, and the parquet the trainers read.

CM2 (arXiv 2602.12268) records are multi-turn tool-use dialogues with OpenAI-style ``tools``, a reference
``messages`` list and per-user-turn ``checklists``. We could not read the dataset card from this machine,
so the accepted record layout is our reading of the paper's description (documented here, tested on the
hand-written fixture ``tests/data/cm2_fixture.jsonl``):

- ``id`` (optional; the record index is used otherwise);
- ``tools``: a list of OpenAI tools (``{"type": "function", "function": {...}}``) or bare function specs;
  a JSON string holding that list is accepted too;
- ``messages``: OpenAI chat; an optional leading ``system`` message, then ``user`` / ``assistant`` /
  ``tool`` messages; assistant ``tool_calls`` items are ``{"function": {"name", "arguments"}}`` (arguments
  an object or a JSON string) or bare ``{"name", "arguments"}``; a JSON string holding the list is accepted;
- ``checklists``: one entry per user turn, each a list of items or ``{"turn": i, "items": [...]}``; an item
  has ``question`` (required), ``focus``, ``pass_condition``, ``failure_examples``, ``evidence`` and a
  non-negative ``weight`` (a JSON string holding the list is accepted).

Normalisation (:func:`normalize_record`) produces a :class:`TrainingExample` with exactly what the agent
loop and the reward need:

- ``prompt``: the initial chat, i.e. the system message (if any) and the first user message. Training
  episodes start from the first user turn; later user turns of the dialogue are not replayed (ours).
- ``references``: ``{"call", "response"}`` pairs from the record's own assistant tool calls and the tool
  messages answering them (matched by ``tool_call_id`` when present, else in order). Privileged: they go
  only into the rehearsal prompt, never into the ACT context.
- ``reference_calls``: the reference calls of the first user turn (for the verifiable reward).
- ``checklists``: per user turn, items with weights rescaled to sum to 1 (the paper: weights sum to 1 per
  turn); a turn whose weights sum to 0 is a bad record.

Filtering: prompts (chat template with tools and generation prompt) longer than
``training.data.max_prompt_tokens_filter`` tokens are dropped (authors' script: 3,500). Bad records are
reported with their index and reason, skipped, and counted in the summary.

Parquet layout (one row per example; verl's ``RLHFDataset`` reads ``prompt``, ``data_source``,
``reward_model`` and ``extra_info``): ``data_source`` ("cm2"), ``prompt`` (list of ``{role, content}``),
``uid``, ``reward_model`` (``{"style": "checklist", "ground_truth": <checklists JSON>}``) and
``extra_info`` (``index``, ``uid``, ``prompt_tokens`` and JSON strings ``tools``, ``references``,
``reference_calls``, ``checklists``). JSON strings keep heterogeneous tool schemas out of parquet's
struct typing. :func:`read_training_parquet` turns rows back into :class:`TrainingExample`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envace.tools import render_chat

__all__ = [
    "BadRecord",
    "TrainingExample",
    "iter_source_records",
    "local_source_path",
    "normalize_record",
    "count_prompt_tokens",
    "convert",
    "write_training_parquet",
    "read_training_parquet",
    "write_json_atomic",
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


def _tools(record: dict[str, Any]) -> list[dict[str, Any]]:
    tools = _maybe_json(record.get("tools"), "tools")
    if not isinstance(tools, list) or not tools:
        raise BadRecord("tools must be a non-empty list")
    out = []
    for tool in tools:
        spec = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise BadRecord("a tool has no function name")
        out.append({"type": "function", "function": spec})
    return out


def _checklists(record: dict[str, Any], n_user_turns: int) -> list[list[dict[str, Any]]]:
    raw = _maybe_json(record.get("checklists"), "checklists")
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
            clean.append({**item, "id": str(item.get("id", f"{t}.{j}")), "weight": float(weight)})
        total = sum(item["weight"] for item in clean)
        if total <= 0:
            raise BadRecord(f"checklist weights of turn {t} sum to 0")
        for item in clean:
            item["weight"] = item["weight"] / total
        turns.append(clean)
    if len(turns) > n_user_turns:
        raise BadRecord(f"{len(turns)} checklists for {n_user_turns} user turns")
    return turns


def normalize_record(record: dict[str, Any], index: int) -> TrainingExample:
    """Normalise one CM2 record (see the module docstring). Raises :class:`BadRecord` with the reason."""
    messages = _maybe_json(record.get("messages"), "messages")
    if not isinstance(messages, list) or not messages:
        raise BadRecord("messages must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise BadRecord("a message has no valid role")
    tools = _tools(record)
    start = 1 if messages[0]["role"] == "system" else 0
    if len(messages) <= start or messages[start]["role"] != "user":
        raise BadRecord("the first non-system message must be a user message")
    prompt = [{"role": m["role"], "content": str(m.get("content") or "")} for m in messages[: start + 1]]
    if not prompt[-1]["content"].strip():
        raise BadRecord("the first user message is empty")

    references: list[dict[str, Any]] = []
    reference_calls: list[dict[str, Any]] = []
    pending: list[tuple[str | None, dict[str, Any]]] = []  # calls awaiting their tool message
    user_turn = 0
    for m in messages[start + 1:]:
        if m["role"] == "user":
            user_turn += 1
        elif m["role"] == "assistant":
            items = _maybe_json(m.get("tool_calls") or [], "tool_calls")
            if not isinstance(items, list):
                raise BadRecord("tool_calls is not a list")
            for item in items:
                call = _call_of(item)
                pending.append((item.get("id"), call))
                if user_turn == 0:
                    reference_calls.append(call)
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
    uid = str(record.get("id", index))
    return TrainingExample(uid, index, prompt, tools, references, reference_calls,
                           _checklists(record, user_turn + 1))


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


def _atomic_write(path: Path, write: Callable[[str], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_training_parquet(examples: list[TrainingExample], path: str | Path) -> None:
    """Write the examples' rows to ``path`` atomically (temp file + rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([e.to_row() for e in examples])
    _atomic_write(Path(path), lambda tmp: pq.write_table(table, tmp))


def write_json_atomic(obj: Any, path: str | Path) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    text = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    _atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def read_training_parquet(path: str | Path) -> list[TrainingExample]:
    """Read the examples back from a parquet written by :func:`write_training_parquet`."""
    import pyarrow.parquet as pq

    return [TrainingExample.from_row(row) for row in pq.read_table(path).to_pylist()]
