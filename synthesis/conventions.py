"""The agent's own conventions, mined from its successful runs, so environments speak its language.

An adapter trained in an environment that talks to the model differently from the agent (another
system prompt, other tool descriptions, no "find the customer first" step) learns the capability
in a setting the agent never sees, and can unlearn what the agent already does right. So
synthesis copies what every successful run of the agent shares:

| convention    | mined from                                                  | e.g.              |
|---------------|-------------------------------------------------------------|-------------------|
| system_prompt | `gen_ai.system_instructions` on the agent's chat spans, else | the shop's rules  |
|               | the system message of their `gen_ai.input.messages`         |                   |
| tools         | `gen_ai.tool.definitions` on the agent's chat spans         | its tool list     |
| opening       | the tool calls nearly every successful run starts with      | `find_user`       |
| lookups       | the read on the same id accepted writes follow (per id arg) | `get_order` first |

    conventions = conventions_from_store(home)          # or mine_conventions(runs)
    spec = build_spec(gap, catalog, conventions)        # environments follow them

Nothing here is told what the agent's tasks are: it is all in the traces.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracegym.analysis.tool_kinds import is_answer_tool, is_read_tool
from tracegym.synthesis.spec import is_id_name, parse_json_literal
from tracegym.tracer import semconv as sc
from tracegym.tracer.messages import chat_messages

SHARE = 0.9  # a convention is what at least this share of successful runs do
MIN_RUNS = 3  # and at least this many successful runs show it


@dataclass
class Conventions:
    """What the agent's successful runs share (see the module docstring); empty when unknown."""

    agent: str = ""
    runs: int = 0  # successful runs mined
    system_prompt: str = ""
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI-style definitions
    opening: list[str] = field(default_factory=list)
    lookups: dict[str, str] = field(default_factory=dict)  # write tool -> read tool before it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Conventions:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in (data or {}).items() if k in known})

    def tool_definition(self, name: str) -> dict[str, Any] | None:
        for tool in self.tools:
            if _tool_name(tool) == name:
                return tool
        return None


@dataclass
class MinedRun:
    """One run as mining needs it: its calls in order, its outcome, what its chats recorded."""

    calls: list[dict[str, Any]]  # {"tool", "arguments", "error"}
    success: bool = True
    system_instructions: str = ""
    tool_definitions: list[dict[str, Any]] = field(default_factory=list)


def _tool_name(tool: Mapping[str, Any]) -> str:
    fn = tool.get("function", tool)
    return str(fn.get("name", "")) if isinstance(fn, Mapping) else ""


def instructions_text(value: Any) -> str:
    """`gen_ai.system_instructions` as text: a string, or the text parts of a list of parts."""
    value = parse_json_literal(value) if isinstance(value, str) else value
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        parts = [
            str(p.get("content", "")) if isinstance(p, Mapping) else str(p)
            for p in value
            if not isinstance(p, Mapping) or p.get("type", "text") == "text"
        ]
        return "\n".join(p for p in parts if p).strip()
    return ""


def system_message(messages: Any) -> str:
    """The text of the system message a chat's recorded input starts with (importers of
    OpenAI-style runs record the agent's instructions there), or ""."""
    data = parse_json_literal(messages) if isinstance(messages, str) else messages
    if not isinstance(data, list):
        return ""
    for message in chat_messages(data[:2]):  # GenAI or older shape; developer -> system
        if message.get("role") == "system":
            return instructions_text(message.get("content") or "")
    return ""


def _common(values: Iterable[Any], n: int) -> Any:
    """The value at least SHARE of the `n` runs have, or None."""
    counts = Counter(json.dumps(v, sort_keys=True) for v in values if v)
    if not counts:
        return None
    text, count = counts.most_common(1)[0]
    return openai_order(json.loads(text)) if count >= SHARE * n else None


def _opening(runs: Sequence[MinedRun]) -> list[str]:
    """The longest prefix of successful tool names that SHARE of the runs start with."""
    names = [[c["tool"] for c in r.calls if not c.get("error")] for r in runs]
    prefix: list[str] = []
    for depth in range(4):
        heads = Counter(tuple(n[: depth + 1]) for n in names if len(n) > depth)
        if not heads:
            break
        head, count = heads.most_common(1)[0]
        if count < SHARE * len(runs) or is_answer_tool(head[-1]) or not is_read_tool(head[-1]):
            break
        prefix = list(head)
    return prefix


def _values(arguments: Any) -> set[str]:
    data = parse_json_literal(arguments)
    if not isinstance(data, Mapping):
        return set()
    out: set[str] = set()
    for value in data.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and len(item) >= 3:
                out.add(item)
    return out


def _lookups(runs: Sequence[MinedRun], tools: Sequence[Mapping[str, Any]] = ()) -> dict[str, str]:
    """Write tool -> the read the agent makes first on the record the write acts on.

    Learnt per id argument, pooled over every write that takes it: when SHARE of the accepted
    writes (in at least MIN_RUNS runs, failed runs included: a write the backend accepted is
    evidence of what it needs) with an `order_id` were preceded by a read called with the same
    value, and mostly the same read (`get_order`), then every write taking `order_id` follows
    it, including writes rarely accepted or never called (known from `tools`, the agent's
    definitions)."""
    uses: Counter[str] = Counter()  # id argument -> accepted writes using it
    before: dict[str, Counter[str]] = {}
    arg_runs: dict[str, set[int]] = {}
    arguments: dict[str, set[str]] = {}  # write tool -> its argument names
    for index, run in enumerate(runs):
        done = [c for c in run.calls if not c.get("error")]
        for i, call in enumerate(done):
            tool = call["tool"]
            if is_read_tool(tool) or is_answer_tool(tool):
                continue
            data = parse_json_literal(call.get("arguments"))
            data = data if isinstance(data, Mapping) else {}
            arguments.setdefault(tool, set()).update(data)
            for name, value in data.items():
                if not is_id_name(name) or not isinstance(value, str):
                    continue
                uses[name] += 1
                arg_runs.setdefault(name, set()).add(index)
                reads = {
                    c["tool"]
                    for c in done[:i]
                    if is_read_tool(c["tool"]) and value in _values(c.get("arguments"))
                }
                for read in reads:
                    before.setdefault(name, Counter())[read] += 1
    by_argument: dict[str, str] = {}
    for name, n in uses.items():
        if len(arg_runs[name]) < MIN_RUNS or name not in before:
            continue
        read, count = before[name].most_common(1)[0]
        if count >= SHARE * n:
            by_argument[name] = read
    for tool in tools:
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        name = str(fn.get("name", ""))
        if name and not is_read_tool(name) and not is_answer_tool(name):
            arguments.setdefault(name, set()).update(props)
    out: dict[str, str] = {}
    for tool, names in sorted(arguments.items()):
        found = sorted(by_argument[a] for a in names if a in by_argument)
        if found:
            out[tool] = found[0]
    return out


def mine_conventions(runs: Sequence[MinedRun], agent: str = "") -> Conventions:
    """The conventions of one agent's `runs`: what its successful runs share (nothing below
    MIN_RUNS of them), and the reads its accepted writes follow."""
    won = [r for r in runs if r.success]
    if len(won) < MIN_RUNS:
        return Conventions(agent=agent, runs=len(won))
    prompt = _common((r.system_instructions for r in won), len(won)) or ""
    tools = _common((r.tool_definitions for r in won), len(won)) or []
    return Conventions(
        agent=agent,
        runs=len(won),
        system_prompt=str(prompt),
        tools=list(tools),
        opening=_opening(won),
        lookups=_lookups(runs, tools),
    )


def conventions_from_store(home: str | Path) -> Conventions:
    """The conventions of the agent with the most successful runs in the store under `home`
    (runs without an outcome are left out)."""
    from tracegym.store.store import Store  # duckdb: only when reading a store

    with Store(home) as store:
        top = store.sql(
            "SELECT agent, count(*) AS n FROM traces WHERE success AND agent IS NOT NULL "
            "GROUP BY agent ORDER BY n DESC, agent LIMIT 1"
        ).fetchall()
        if not top:
            return Conventions()
        agent = top[0][0]
        judged = store.sql(
            "SELECT trace_id, success FROM traces WHERE success IS NOT NULL AND agent = ?",
            [agent],
        ).fetchall()
        mine = "SELECT trace_id FROM traces WHERE success IS NOT NULL AND agent = ?"
        calls = store.sql(
            "SELECT trace_id, tool, arguments, status, error_type FROM tool_calls "
            f"WHERE trace_id IN ({mine}) "
            "ORDER BY trace_id, start_time, step_index NULLS LAST",
            [agent],
        ).fetchall()
        chats = store.sql(
            "SELECT trace_id, any_value(attributes->>?), any_value(attributes->>?), "
            "arg_min(attributes->>?, start_time) FROM spans "
            f"WHERE operation = ? AND trace_id IN ({mine}) GROUP BY trace_id",
            [sc.SYSTEM_INSTRUCTIONS, sc.TOOL_DEFINITIONS, sc.INPUT_MESSAGES, sc.OP_CHAT, agent],
        ).fetchall()
    runs = {trace_id: MinedRun([], success=bool(success)) for trace_id, success in judged}
    for trace_id, tool, arguments, status, error_type in calls:
        runs.setdefault(trace_id, MinedRun([])).calls.append(
            {
                "tool": tool,
                "arguments": arguments,
                "error": status == "ERROR" or error_type is not None,
            }
        )
    for trace_id, instructions, definitions, first_input in chats:
        run = runs.setdefault(trace_id, MinedRun([]))
        run.system_instructions = instructions_text(instructions) or system_message(first_input)
        tools = parse_json_literal(definitions)
        run.tool_definitions = [openai_order(t) for t in tools] if isinstance(tools, list) else []
    return mine_conventions(list(runs.values()), agent=str(agent))


_TOOL_ORDER = ("type", "function", "name", "description", "parameters", "properties", "required")


def openai_order(value: Any) -> Any:
    """A tool definition with its keys in the order OpenAI's documentation and clients write
    them (`type`, `function`; `name`, `description`, `parameters`; `type`, `properties`,
    `required`), each object's properties in its `required` order first. The tracer stores
    attributes with sorted keys, and a chat template renders the definitions as JSON text: in
    sorted order, an adapter would learn a tool list that differs from the one the agent
    sends."""
    if isinstance(value, list):
        return [openai_order(v) for v in value]
    if not isinstance(value, dict):
        return value
    rank = {key: i for i, key in enumerate(_TOOL_ORDER)}
    keys = sorted(value, key=lambda k: (rank.get(k, len(rank)), list(value).index(k)))
    out = {k: openai_order(value[k]) for k in keys}
    properties, required = out.get("properties"), out.get("required")
    if isinstance(properties, dict) and isinstance(required, list):
        first = [k for k in required if k in properties]
        out["properties"] = {k: properties[k] for k in [*first, *(k for k in properties
                                                               if k not in first)]}  # fmt: skip
    return out


__all__ = [
    "Conventions",
    "MinedRun",
    "conventions_from_store",
    "instructions_text",
    "mine_conventions",
    "openai_order",
    "system_message",
]
