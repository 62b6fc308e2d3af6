"""`medagentbench`: MedAgentBench results (AgentBench's `overall.json`), one trace per task run.

Input: `{custom{raw_results[{index, status, result, history}]}}` (a bare list of raw results is
read too). `history` is a list of `{role, content}` turns, or that list written as a Python
literal string, read with `ast.literal_eval` (never evaluated as code). The agent has no tool
API: it writes one command a turn as text, and the environment answers in the next `user` turn:

- `GET {api_base}/Resource?k=v&...` -> a call of `get_{Resource}`, arguments = the query
  parameters (a list where a name repeats);
- `POST {api_base}/Resource\\n{json}` -> a call of `post_{Resource}`, arguments = the JSON body
  (the raw text where it is not JSON; the environment then says `Invalid POST request`);
- `FINISH([...])` -> the final answer (the root's output);
- anything else is what the benchmark calls an invalid action: a `chat` span marked ERROR
  (`error.type = InvalidAction`) and, as in the benchmark, the end of the run.

The `get_` / `post_` prefix keeps reads and writes apart for `tracegym.analysis.tool_kinds`
(`get` is a read verb, `post` is not). The turns become an OpenAI-style message list (an agent
turn that calls -> an assistant message with one tool call; the environment's answer -> the tool
message) mapped as in `tracegym.store.importers.chat`, so history entry `j` is the span with
`tracegym.step.index = j`; an answer starting `Error` or `Invalid` marks its tool span ERROR.

The model is the folder the file sits in (`outputs/<date>/<model>/medagentbench-std/
overall.json`), and it is part of the run's identity: two models can write the same history for
a task. Outcome: success = `status == completedCorrect`; `completedIncorrect` and the statuses
that end a run on the agent's fault (`agent invalid action`, `agent validation failed`, `agent
context limit`, `task limit reached`) are failures; any other status (`task error`, `unknown`,
...) gives no verdict. The status, result and index are the outcome's labels.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tracegym.store.importers import ImportFormatError, load_json
from tracegym.store.importers.chat import (
    ImportedRun,
    as_text,
    check_no_labels,
    convert_messages,
    describe,
    first_line,
    guarded,
    hint,
    keyed,
    literal_list,
    source_attrs,
    synthetic_start,
)
from tracegym.tracer import semconv as sc

FORMAT = "medagentbench"
AGENT = "MedAgentBench"
CORRECT = "completedCorrect"
FAILED_STATUSES = frozenset(
    [
        "completedIncorrect",
        "agent invalid action",
        "agent validation failed",
        "agent context limit",
        "task limit reached",
    ]
)
INVALID_ACTION = "InvalidAction"
_ERROR_ANSWER = re.compile(r"^\s*(Error|ERROR|Invalid)\b")
_RESOURCE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


# Commands --------------------------------------------------------------------------------------
def _clean(text: str) -> str:
    """The command as the benchmark reads it: code fences dropped, whitespace stripped."""
    return text.strip().replace("```tool_code", "").replace("```", "").strip()


def _resource(url: str) -> tuple[str, str | None]:
    """(FHIR resource, the rest of the path: an id) of a request URL."""
    parts = [p for p in urlsplit(url).path.split("/") if p]
    if "fhir" in parts:
        parts = parts[len(parts) - parts[::-1].index("fhir") :]
    if not parts:
        return "unknown", None
    name = parts[0] if _RESOURCE.match(parts[0]) else "unknown"
    rest = "/".join(parts[1:])
    return name, rest or None


def _query(url: str) -> dict[str, Any]:
    """The query parameters, a list where a name repeats (`date=ge...&date=le...`)."""
    out: dict[str, Any] = {}
    for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if name in out:
            out[name] = [*out[name], value] if isinstance(out[name], list) else [out[name], value]
        else:
            out[name] = value
    return out


def parse_command(text: str) -> tuple[str, str | None] | None:
    """(tool name, arguments as JSON text) of a GET/POST turn; None for anything else."""
    command = _clean(text)
    head, _, body = command.partition("\n")
    words = head.split(None, 1)
    if len(words) != 2 or words[0] not in ("GET", "POST"):
        return None
    url = words[1].strip()
    resource, rest = _resource(url)
    if words[0] == "GET":
        arguments = _query(url)
        if rest is not None:
            arguments = {"_id": rest, **arguments}
        return f"get_{resource}", _encode(arguments)
    try:
        payload: Any = json.loads(body) if body.strip() else None
    except (json.JSONDecodeError, RecursionError):
        return f"post_{resource}", body.strip()  # not JSON: the benchmark rejects it
    return f"post_{resource}", _encode(payload) if payload is not None else None


def finish_answer(text: str) -> str | None:
    """The answer list of a `FINISH([...])` turn (as written), else None."""
    command = _clean(text)
    if command.startswith("FINISH(") and command.endswith(")"):
        return command[len("FINISH(") : -1]
    return None


# Checking the input ----------------------------------------------------------------------------
def _results(path: Path, doc: Any) -> list[Any]:
    if isinstance(doc, list):
        return doc
    if not isinstance(doc, Mapping):
        raise ImportFormatError(
            path, f"expected a MedAgentBench overall.json object, got {describe(doc)}{hint(doc)}"
        )
    custom = doc.get("custom")
    results = custom.get("raw_results") if isinstance(custom, Mapping) else None
    if not isinstance(results, list):
        raise ImportFormatError(
            path,
            f"expected custom.raw_results (a list of task runs), got {describe(doc)}{hint(doc)}",
        )
    return results


def _history(path: Path, value: Any, where: str) -> list[Mapping[str, Any]]:
    value = literal_list(path, value, where)
    if not value:
        raise ImportFormatError(path, "'history' is empty", where)
    for j, turn in enumerate(value):
        if not isinstance(turn, Mapping):
            raise ImportFormatError(path, f"expected a turn object, got {describe(turn)}",
                                    f"{where} history {j}")  # fmt: skip
        for key in ("role", "content"):
            if not isinstance(turn.get(key), str):
                problem = f"missing field {key!r}" if key not in turn else f"{key!r} should be text"
                raise ImportFormatError(path, problem, f"{where} history {j}")
    return value


def _check(path: Path, item: Any, i: int) -> tuple[str, list[Mapping[str, Any]]]:
    where = f"result {i}"
    if not isinstance(item, Mapping):
        raise ImportFormatError(path, f"expected a result object, got {describe(item)}", where)
    index = item.get("index")
    if index is not None and (isinstance(index, bool) or not isinstance(index, (int, str))):
        raise ImportFormatError(path, f"index should be an integer, got {describe(index)}", where)
    if index is not None:
        where = f"result {i} (index {index})"
    status = item.get("status")
    if not isinstance(status, str):
        problem = "missing field 'status'" if status is None else "'status' should be text"
        raise ImportFormatError(path, problem, where)
    result = item.get("result")
    if result is not None and not isinstance(result, str):
        raise ImportFormatError(path, f"'result' should be text, got {describe(result)}", where)
    return where, _history(path, item.get("history"), where)


def model_of(path: Path) -> str | None:
    """The model a results file belongs to: its folder, or the one above a task folder
    (`<model>/medagentbench-std/overall.json`)."""
    folder = path.resolve().parent
    if folder.name.lower().startswith("medagentbench") and folder.parent.name:
        folder = folder.parent
    return folder.name or None


def success_of(status: str) -> bool | None:
    if status == CORRECT:
        return True
    return False if status in FAILED_STATUSES else None


# Converting ------------------------------------------------------------------------------------
def convert(path: Path, data: bytes, *, labels: Path | None = None) -> list[dict[str, Any]]:
    """One MedAgentBench results file -> spool records, one trace per raw result."""
    check_no_labels(path, labels, FORMAT)
    results = _results(path, load_json(path, data))
    model = model_of(path)
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(results):
        where, history = _check(path, item, i)
        records += guarded(path, where, _run, path, where, item, history, model, seen)
    return records


def _messages(history: list[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], set[int]]:
    """The turns as OpenAI messages, and the positions of the agent's invalid actions."""
    messages: list[dict[str, Any]] = []
    invalid: set[int] = set()
    waiting: str | None = None  # the call id the next user turn answers
    for j, turn in enumerate(history):
        role, content = turn["role"], turn["content"]
        if role == "agent" or role == "assistant":
            command = parse_command(content)
            waiting = None
            if command is not None:
                waiting = f"call_{j}"
                call = {"id": waiting, "type": "function",
                        "function": {"name": command[0], "arguments": command[1]}}  # fmt: skip
                messages.append({"role": "assistant", "content": content, "tool_calls": [call]})
            else:
                if finish_answer(content) is None:
                    invalid.add(j)
                messages.append({"role": "assistant", "content": content})
        elif waiting is not None:
            failed = bool(_ERROR_ANSWER.match(content))
            messages.append(
                {"role": "tool", "tool_call_id": waiting, "content": content, "error": failed}
            )
            waiting = None
        else:
            messages.append({"role": role, "content": content})
    return messages, invalid


def _task(prompt: str) -> str:
    """The task part of the first prompt (its context and question), without the instructions
    and function list every run repeats."""
    at = prompt.rfind("\nContext:")
    return prompt[at + 1 :].strip() if at >= 0 else prompt


def _run(
    path: Path,
    where: str,
    item: Mapping[str, Any],
    history: list[Mapping[str, Any]],
    model: str | None,
    seen: dict[str, int],
) -> list[dict[str, Any]]:
    status: str = item["status"]
    index = item.get("index")
    key = keyed(
        FORMAT,
        {"model": model, "index": index, "status": status, "result": item.get("result"),
         "history": history},
        seen,
    )  # fmt: skip
    run_id = f"{FORMAT}/{model or 'model'}/{index if index is not None else 'run'}/{key[:8]}"
    run = ImportedRun(FORMAT, key, run_id, AGENT)
    start = synthetic_start(key)
    messages, invalid = _messages(history)
    summary = convert_messages(run, path, where, messages, start_ns=start, model=model)
    for record in run.records:  # the agent's invalid actions: the benchmark's own error
        attrs = record["attributes"]
        if attrs.get(sc.OPERATION) == sc.OP_CHAT and attrs.get(sc.STEP_INDEX) in invalid:
            attrs[sc.ERROR_TYPE] = INVALID_ACTION
            record["status"] = "ERROR"
            text = first_line(history[attrs[sc.STEP_INDEX]]["content"], 120)
            record["status_message"] = f"invalid action (not GET, POST or FINISH): {text}"
    answer = next(
        (finish_answer(t["content"]) for t in reversed(history)
         if t["role"] in ("agent", "assistant") and finish_answer(t["content"]) is not None),
        None,
    )  # fmt: skip
    first = history[0]["content"]
    run.root(
        start,
        run.end_ns() if run.records else start,
        {
            sc.INPUT: _task(first) if history[0]["role"] == "user" else summary.first_user,
            sc.OUTPUT: answer if answer is not None else summary.last_assistant,
            **source_attrs(index=index, status=status, result=item.get("result"), model=model),
        },
    )
    run.outcome(
        success=success_of(status),
        reward=None,
        source=FORMAT,
        labels={"status": status, "result": as_text(item.get("result")), "index": index},
    )
    return run.records
