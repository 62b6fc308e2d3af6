"""OpenAI chat fine-tuning JSONL from passing runs and from oracle demonstrations.

Two sources, one line format (`{"messages": [...], "tools": [...]}`, see `ft_format`):
- runs in the store whose latest outcome is a success (the verifier passed them). The
  conversation is rebuilt from the run's LLM calls in order (the root agent's, when it made
  any): each call's input messages extend the conversation (a call that resends the whole
  history replaces it; one that sends only what is new is appended), then its output. The
  tools are the recorded `gen_ai.tool.definitions` of the LLM spans, else the definitions the
  tool spans carry (the OpenAI Agents SDK's chat-completions model leaves its LLM spans
  without them; its tool spans keep each tool's description and parameter schema, `required`
  included), and only for a tool no span describes, a schema inferred from the calls made.
  A run whose LLM calls kept no messages (message capture off), or whose messages do not make a
  valid line (say, tool calls written as text in the reply), is rebuilt from its tool calls in
  order: the agent's input as the user message, each call and its result, the agent's output
  as the answer.
- the registered environments' oracle demonstrations on their train seeds (never the held-out
  ones), built as training does (`synthesis.registry.demonstration`, the environment's tool
  schemas), kept only when the verifier passes them. They are made above the store, where the
  registry is (`tracegym.synthesis.demonstrations.demo_examples`), as `Example`s of this module.

Every line is validated before it is written; one that fails is skipped and counted with the
first reason (`ExportReport.skipped`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from tracegym.store.exporters import SelectedRun
from tracegym.store.exporters.chat_messages import (
    inferred_tools,
    system_messages,
    to_openai,
    tool_schema,
    tool_schemas,
)
from tracegym.store.exporters.ft_format import reason_kind, validate_example
from tracegym.tracer import semconv as sc

PASSED = "success = true"  # the `traces` view's latest outcome
# OpenInference's names on a tool span (the Agents SDK's instrumentor writes them): the
# tool's own description and its parameters' JSON schema.
OI_TOOL_DESCRIPTION = "tool.description"
GENAI_TOOL_DESCRIPTION = "gen_ai.tool.description"  # what the tracer maps the former onto
OI_TOOL_PARAMETERS = "tool.parameters"


@dataclass
class Example:
    """One candidate line and where it came from (a trace id, or `env_id:seed`)."""

    source: str
    origin: str  # "run" or "demo"
    line: dict[str, Any] | None
    problem: str | None = None  # why there is no line


@dataclass
class ExportReport:
    written: int = 0
    runs: int = 0
    demos: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    examples: list[tuple[str, str]] = field(default_factory=list)  # (source, first problem)

    def skip(self, source: str, problem: str) -> None:
        self.skipped[reason_kind(problem)] += 1
        self.examples.append((source, problem))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _starts_with(longer: list[dict[str, Any]], prefix: list[dict[str, Any]]) -> bool:
    return len(longer) >= len(prefix) and all(
        _same(x, y) for x, y in zip(longer, prefix, strict=False)
    )


def merge_calls(calls: Iterable[tuple[Any, Any]]) -> list[dict[str, Any]]:
    """The conversation of a run from its LLM calls' (input, output) messages, in order."""
    conversation: list[dict[str, Any]] = []
    for raw_input, raw_output in calls:
        sent = to_openai(raw_input, "user")
        if _starts_with(sent, conversation):
            conversation = sent  # the whole history again, and what is new
        elif not _starts_with(conversation, sent):
            conversation = conversation + sent  # only what is new since the last call
        conversation = conversation + to_openai(raw_output, "assistant")
    return conversation


def number_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give tool calls recorded without an id one (`call_<n>`), and their results the same,
    in order; ids that were recorded are kept."""
    waiting: list[str] = []
    n = 0
    for message in messages:
        for call in message.get("tool_calls") or []:
            if not call["id"]:
                call["id"] = f"call_{n}"
                waiting.append(call["id"])
            n += 1
        if message["role"] == "tool" and not message.get("tool_call_id") and waiting:
            message["tool_call_id"] = waiting.pop(0)
    return messages


def line_of(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    line: dict[str, Any] = {"messages": messages}
    if tools:
        line["tools"] = tools
    if any(len(m.get("tool_calls") or []) > 1 for m in messages):
        line["parallel_tool_calls"] = True
    return line


def _text(value: Any) -> str | None:
    """An agent's recorded input or output as message text: a string as it is, the single
    string among a call's arguments, else the JSON."""
    if value is None:
        return None
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return value
    if isinstance(parsed, str):
        return parsed
    if isinstance(parsed, dict):
        texts = [v for v in parsed.values() if isinstance(v, str)]
        if len(parsed) == 1 and texts:
            return texts[0]
    return json.dumps(parsed, ensure_ascii=False)


def _arguments(value: Any) -> str:
    """Recorded tool arguments as a JSON object string (a bare value as `{"input": v}`)."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        parsed = value
    if parsed is None:
        parsed = {}
    if not isinstance(parsed, dict):
        parsed = {"input": parsed}
    return json.dumps(parsed, ensure_ascii=False)


@dataclass
class RunData:
    """What a line is built from: the root span's agent, input and output, the LLM calls
    (own: made by the root agent; input, output, tool definitions, system instructions) and
    the tool calls (call id, tool, arguments, result), each in order."""

    agent: str | None = None
    question: Any = None
    answer: Any = None
    chats: list[tuple[Any, ...]] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    described: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool spans' schemas


def run_data(store: Any, runs: Sequence[SelectedRun]) -> dict[str, RunData]:
    """RunData of each of `runs`, in three queries (not three per run)."""
    traces = [r.trace_id for r in runs]
    data = {t: RunData() for t in traces}
    for trace_id, agent, question, answer in store.sql(
        "SELECT trace_id, agent, input, output FROM spans "
        "WHERE parent_span_id IS NULL AND list_contains($t, trace_id) "
        "QUALIFY row_number() OVER (PARTITION BY trace_id ORDER BY start_ns) = 1",
        {"t": traces},
    ).fetchall():
        data[trace_id].agent, data[trace_id].question, data[trace_id].answer = (
            agent,
            question,
            answer,
        )
    for trace_id, agent, *chat in store.sql(
        f"""
        SELECT trace_id, agent, input, output,
               json_extract_string(attributes, '$."{sc.TOOL_DEFINITIONS}"'),
               json_extract_string(attributes, '$."{sc.SYSTEM_INSTRUCTIONS}"')
        FROM spans WHERE operation = '{sc.OP_CHAT}' AND list_contains($t, trace_id)
        ORDER BY trace_id, start_ns, span_id
        """,
        {"t": traces},
    ).fetchall():
        run = data[trace_id]
        run.chats.append((agent is not None and agent == run.agent, *chat))
    for trace_id, *call, description, parameters in store.sql(
        f"""
        SELECT trace_id, call_id, tool, input, output,
               coalesce(json_extract_string(attributes, '$."{GENAI_TOOL_DESCRIPTION}"'),
                        json_extract_string(attributes, '$."{OI_TOOL_DESCRIPTION}"')),
               json_extract_string(attributes, '$."{OI_TOOL_PARAMETERS}"')
        FROM spans WHERE operation = '{sc.OP_TOOL}' AND list_contains($t, trace_id)
        ORDER BY trace_id, start_time, span_id
        """,
        {"t": traces},
    ).fetchall():
        data[trace_id].calls.append(tuple(call))
        schema = described_tool(call[1], description, parameters)
        if schema is not None:
            data[trace_id].described.setdefault(call[1], schema)
    return data


def described_tool(name: Any, description: Any, parameters: Any) -> dict[str, Any] | None:
    """A tool span's own definition (OpenInference's tool.parameters, a JSON schema, with the
    description) as an OpenAI function tool; None when the span carries no schema."""
    if not isinstance(name, str) or not name or parameters is None:
        return None
    try:
        schema = json.loads(parameters) if isinstance(parameters, str) else parameters
    except ValueError:
        return None
    if not isinstance(schema, dict):
        return None
    definition = {"name": name, "parameters": schema}
    if isinstance(description, str) and description:
        definition["description"] = description
    return tool_schema({"type": "function", "function": definition})


def _with_inferred(
    described: dict[str, dict[str, Any]], messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The tool spans' definitions, plus one inferred from the calls for each tool called
    that no span described."""
    inferred = [t for t in inferred_tools(messages) if t["function"]["name"] not in described]
    return [*described.values(), *inferred]


def from_tool_calls(run: RunData, head: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A run rebuilt from its tool calls: `head` (the recorded system and first user
    message) or else the agent's input as the user message, each call and its result in
    order, the agent's output as the answer."""
    question, answer = _text(run.question), _text(run.answer)
    messages: list[dict[str, Any]] = list(head or [])
    if question and not any(m["role"] == "user" for m in messages):
        messages.append({"role": "user", "content": question})
    for i, (call_id, tool, arguments, result) in enumerate(run.calls):
        call_id = call_id or f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": tool or "", "arguments": _arguments(arguments)},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": _text(result) or ""})
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return messages


def run_example(trace_id: str, run: RunData) -> Example:
    """One passing run as a candidate line."""
    rows = run.chats
    if any(own for own, *_ in rows):
        rows = [r for r in rows if r[0]]  # the root agent's own calls, not its subagents'
    definitions = next((r[3] for r in rows if r[3]), None)
    tools = tool_schemas(definitions) if definitions else []

    def line(messages: list[dict[str, Any]]) -> dict[str, Any]:
        messages = number_calls(messages)
        return line_of(messages, tools or _with_inferred(run.described, messages))

    recorded = [r for r in rows if r[1] is not None or r[2] is not None]
    if not recorded:
        return Example(trace_id, "run", line(from_tool_calls(run)))
    messages = merge_calls((r[1], r[2]) for r in recorded)
    if not any(m["role"] == "system" for m in messages):
        messages = system_messages(next((r[4] for r in rows if r[4]), None)) + messages
    chosen = line(messages)
    problems = validate_example(chosen)
    if problems and run.calls:  # e.g. tool calls written as text: the tool spans still tell
        system = [m for m in messages[:1] if m["role"] == "system"]
        user = [m for m in messages if m["role"] == "user"][:1]
        fallback = line(from_tool_calls(run, system + user))
        if not validate_example(fallback):
            return Example(trace_id, "run", fallback)
    return Example(trace_id, "run", chosen, problems[0] if problems else None)


def run_examples(store: Any, runs: Sequence[SelectedRun], *, chunk: int = 256) -> Iterator[Example]:
    """Candidate lines of `runs`, read `chunk` runs at a time."""
    for start in range(0, len(runs), chunk):
        part = runs[start : start + chunk]
        data = run_data(store, part)
        for run in part:
            yield run_example(run.trace_id, data[run.trace_id])


def write_examples(examples: Iterable[Example], out: IO[str]) -> ExportReport:
    """Validate each candidate line and write the valid ones to `out` as JSON lines."""
    report = ExportReport()
    for example in examples:
        problem = example.problem
        if example.line is not None and problem is None:
            problems = validate_example(example.line)
            problem = problems[0] if problems else None
        if problem is not None or example.line is None:
            report.skip(example.source, problem or "no line")
            continue
        out.write(json.dumps(example.line, ensure_ascii=False) + "\n")
        report.written += 1
        if example.origin == "run":
            report.runs += 1
        else:
            report.demos += 1
    return report
