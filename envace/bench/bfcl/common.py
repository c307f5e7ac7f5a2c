"""BFCL-v4 helpers shared by its categories (pinned ``bfcl-eval==2026.3.23``): the category lists, the
import of bfcl-eval and its data files, function docs as OpenAI tool schemas (BFCL's types
``dict``/``float``/``tuple``/``any`` -> JSON-schema ``object``/``number``/``array``/no constraint), the
ground-truth call parser (:mod:`ast` and ``ast.literal_eval``, never ``eval``) and bfcl-eval's result
stringification.
"""

from __future__ import annotations

import ast
import json
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

MULTI_TURN_SPLITS = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                     "multi_turn_long_context")
AST_SPLITS = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
              "parallel_multiple", "irrelevance", "live_simple", "live_multiple", "live_parallel",
              "live_parallel_multiple", "live_irrelevance", "live_relevance")
AGENTIC_SPLITS = ("web_search_base", "web_search_no_snippet", "memory_kv", "memory_vector", "memory_rec_sum")
OVERALL_WEIGHTS = "non_live=10,live=10,irrelevance=10,multi_turn=30,agentic=40"

_TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array"}


def _ensure_project_root() -> None:
    """Point bfcl-eval's writable project root at a temp dir (else it writes into site-packages)."""
    if "BFCL_PROJECT_ROOT" not in os.environ:
        os.environ["BFCL_PROJECT_ROOT"] = tempfile.mkdtemp(prefix="envace-bfcl-")


def bfcl_eval_package() -> Any:
    _ensure_project_root()
    import bfcl_eval

    return bfcl_eval


@cache
def data_dir() -> Path:
    return Path(bfcl_eval_package().__file__).parent / "data"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@cache
def func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(read_jsonl(path))


def _convert_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_convert_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            if value == "any":
                continue
            out[key] = _TYPE_MAP.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _convert_schema(sub) for name, sub in value.items()}
        else:
            out[key] = _convert_schema(value)
    return out


def to_openai_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc -> ``{"type": "function", "function": {name, description, parameters}}``."""
    params = _convert_schema(doc.get("parameters", {"type": "dict", "properties": {}}))
    function = {"name": doc["name"], "description": doc.get("description", ""), "parameters": params}
    return {"type": "function", "function": function}


def parse_gold_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """Parse a ground-truth call string ``f(a, k=v)`` with :mod:`ast` (literals only, never executed).

    Returns ``(name, positional args, keyword args)``; raises ``ValueError`` for anything else.
    """
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
    return node.func.id, args, kwargs


def format_result(value: Any) -> str:
    """bfcl-eval's stringification of an execution result."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)
