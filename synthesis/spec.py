"""What an environment is made of, inferred from the agent's own traces.

`infer_catalog(traces)` reads recorded tool calls (one list of calls per trace, in run order) and
infers, for every tool:

- a `ToolSchema`: argument names, JSON types, which are required (present in every call), the
  formats of string values (`#W\\d{7}` from `#W2378156`, `#W4776164`, ...), small enums, examples,
  and the shape of its results (keys, types, example values, id-keyed maps, lists);
- data flows: which earlier result (tool and JSON path) each argument value was copied from, e.g.
  `get_user_details.orders[*] -> get_order_details.order_id` (this is how an environment knows
  which lookups ground which arguments);
- status preconditions of write tools: the `status` a record had when the write succeeded, when it
  failed, and the status it had after (`pending` -> `cancelled` for `cancel_pending_order`).

Result shapes also keep the facts the fidelity check (`synthesis.fidelity`) holds generated
worlds to: the observed values of enum-like strings (`enum`), the range of date strings (`dates`)
and the order of date fields within a record (`date_order`), every JSON type a field took
(`types`), how many numbers a range was taken from (`count`); tool schemas keep which result
field echoes which argument (`echoes`: `get_order_details(order_id)` returns that `order_id`)
and the shape of every argument's values (`ArgSchema.shape`). `Catalog.facts` says which
generation of these facts a catalog has (0: a catalog saved before they were recorded).

`EnvironmentSpec` is the JSON document that describes one environment: its family, the gap it
trains, the tools (schemas) and their roles, knobs and seed ranges.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tracegym.analysis.runs import json_type
from tracegym.analysis.tool_kinds import is_read_tool

SPEC_VERSION = 1
FACTS_VERSION = 1  # Catalog.facts of catalogs that record enums, dates, types, echoes

MAX_ENUM = 12  # a string field with at most this many distinct values, each seen twice, is an enum

MAX_EXAMPLES = 12
MAX_WORD_EXAMPLES = 60  # word-like leaves (product names ...) keep more: they label entities
_MAX_DISTINCT = 400
_TOKEN = re.compile(r"\d+|[A-Za-z]+|.", re.S)
_WORDLIKE = re.compile(r"^[A-Za-z][A-Za-z '&/-]{1,38}[A-Za-z]$")


def is_id_name(name: str) -> bool:
    """`order_id`, `item_ids`, `userId`, `id`."""
    return (
        name.lower() in ("id", "ids")
        or name.lower().endswith(("_id", "_ids"))
        or (name.endswith(("Id", "Ids", "ID")))
    )


def parse_json_literal(text: Any) -> Any:
    """The value of JSON text, surrounding whitespace stripped; any other text stays the text
    it was. Only text whose first character can start a JSON literal reaches the parser (most
    recorded strings are plain words), so unlike `analysis.runs.parse_json`, "NaN" and
    "Infinity" stay text."""
    if not isinstance(text, str):
        return text
    stripped = text.strip()
    if not stripped or stripped[0] not in '[{"-0123456789tfn':
        return text
    try:
        return json.loads(stripped)
    except ValueError:
        return text


# String formats ---------------------------------------------------------------------------------
def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _token_class(token: str) -> str:
    if token.isdigit():
        return f"d{len(token)}"
    if token.isalpha() and token.isascii():
        return "a" if token.islower() else "A" if token.isupper() else "Aa"
    return "=" + token


def formats_of(values: Iterable[str], top: int = 3) -> list[dict[str, Any]]:
    """The recurring formats of `values`, most common first.

    Values that tokenise alike (runs of digits of the same length, runs of letters, the same
    punctuation) form one format; a letter run every value shares stays literal (`#W`, `card`).
    Each format is `{"regex", "parts", "share"}`; `parts` drives generation.
    """
    groups: dict[tuple[str, ...], list[list[str]]] = {}
    total = 0
    for value in values:
        if not isinstance(value, str) or not value or len(value) > 40:
            continue
        tokens = _tokens(value)
        if len(tokens) > 12:
            continue
        total += 1
        groups.setdefault(tuple(_token_class(t) for t in tokens), []).append(tokens)
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if not any(k[0] == "d" for k in key) and len(members) < 2:
            continue  # a one-off word is not a format
        parts: list[list[Any]] = []
        regex = ""
        for i, cls in enumerate(key):
            seen = sorted({m[i] for m in members})
            if cls[0] == "d":
                parts.append(["digits", int(cls[1:])])
                regex += rf"\d{{{cls[1:]}}}"
            elif cls[0] == "=":
                parts.append(["literal", cls[1:]])
                regex += re.escape(cls[1:])
            elif len(seen) == 1 and len(members) > 1:
                parts.append(["literal", seen[0]])
                regex += re.escape(seen[0])
            else:
                klass = {"a": "[a-z]+", "A": "[A-Z]+", "Aa": "[A-Za-z]+"}[cls]
                parts.append(["word", seen[:MAX_EXAMPLES]])
                regex += klass
        out.append({"regex": "^" + regex + "$", "parts": parts, "share": len(members) / total})
        if len(out) == top:
            break
    return out


def matches_format(value: Any, formats: Sequence[Mapping[str, Any]]) -> bool:
    if not formats:
        return True
    return isinstance(value, str) and any(re.match(f["regex"], value) for f in formats)


def is_wordlike(value: Any) -> bool:
    return isinstance(value, str) and bool(_WORDLIKE.match(value)) and not is_id_value(value)


def is_id_value(value: Any) -> bool:
    """Looks like an identifier: a string with at least 3 digits and no spaces."""
    return isinstance(value, str) and " " not in value and sum(c.isdigit() for c in value) >= 3


# Dates ------------------------------------------------------------------------------------------
DATE_KINDS: dict[str, re.Pattern[str]] = {
    "date": re.compile(r"^\d{4}-\d{2}-\d{2}$"),
    "datetime": re.compile(
        r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$"
    ),
    "us_date": re.compile(r"^\d{1,2}/\d{1,2}/\d{4}$"),
}


def date_kind(value: Any) -> str | None:
    """Which date layout `value` is written in (`date`, `datetime`, `us_date`), whether or not
    it is a real calendar date (`9872-24-24` is a `date` that `parse_date` refuses)."""
    if not isinstance(value, str) or not 8 <= len(value) <= 35 or not value[:1].isdigit():
        return None
    for kind, pattern in DATE_KINDS.items():
        if pattern.match(value):
            return kind
    return None


def parse_date(value: str, kind: str) -> datetime | None:
    """The (naive) moment `value` names, or None when it is no calendar date."""
    try:
        if kind == "us_date":
            return datetime.strptime(value, "%m/%d/%Y")
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.replace(tzinfo=None)


# Shapes -----------------------------------------------------------------------------------------
class _Shape:
    """Accumulates values seen at one place in a result, then describes them (`final`)."""

    __slots__ = (
        "items",
        "keys",
        "n",
        "numbers",
        "order",
        "presence",
        "props",
        "strings",
        "types",
        "values",
    )

    def __init__(self) -> None:
        self.n = 0
        self.types: Counter[str] = Counter()
        self.props: dict[str, _Shape] = {}
        self.presence: Counter[str] = Counter()
        self.items: _Shape | None = None
        self.keys: Counter[str] = Counter()
        self.values: _Shape | None = None  # an id-keyed map's values
        self.strings: Counter[str] = Counter()
        self.numbers: list[float] = []
        # date fields of one record, pairwise: (a, b) -> [seen together, a <= b, a >= b]
        self.order: dict[tuple[str, str], list[int]] = {}

    def add(self, value: Any, depth: int = 0) -> None:
        self.n += 1
        kind = json_type(value)
        if kind == "object" and value and all(is_id_value(k) for k in value):
            kind = "map"
        self.types[kind] += 1
        if depth > 6:
            return
        if kind == "object":
            for key, item in value.items():
                self.presence[key] += 1
                self.props.setdefault(key, _Shape()).add(item, depth + 1)
            self._add_date_order(value)
        elif kind == "map":
            self.values = self.values or _Shape()
            for key, item in value.items():
                if len(self.keys) < _MAX_DISTINCT or key in self.keys:
                    self.keys[key] += 1
                self.values.add(item, depth + 1)
        elif kind == "array":
            self.items = self.items or _Shape()
            for item in value[:50]:
                self.items.add(item, depth + 1)
        elif kind == "string":
            if len(self.strings) < _MAX_DISTINCT or value in self.strings:
                self.strings[value] += 1
        elif kind in ("integer", "number") and len(self.numbers) < 5000:
            self.numbers.append(float(value))

    def _add_date_order(self, record: Mapping[str, Any]) -> None:
        dated = []
        for key, item in record.items():
            kind = date_kind(item)
            moment = parse_date(item, kind) if kind else None
            if moment is not None:
                dated.append((key, moment))
        for i, (a, when_a) in enumerate(dated):
            for b, when_b in dated[i + 1 :]:
                slot = self.order.setdefault((a, b), [0, 0, 0])
                slot[0] += 1
                slot[1] += when_a <= when_b
                slot[2] += when_a >= when_b

    def _date_order(self) -> list[list[str]]:
        """Pairs of date fields always in the same order (seen together at least 3 times, not
        always equal): `[["created_at", "updated_at"]]`."""
        out = []
        for (a, b), (together, le, ge) in self.order.items():
            if together < 3 or le == ge == together:
                continue
            if le == together:
                out.append([a, b])
            elif ge == together:
                out.append([b, a])
        return sorted(out)

    def final(self) -> dict[str, Any]:
        kinds = [k for k, _ in self.types.most_common() if k != "null"]
        kind = kinds[0] if kinds else "null"
        if kind == "integer" and "number" in kinds:
            kind = "number"
        out: dict[str, Any] = {"type": kind}
        if self.types.get("null"):
            out["nullable"] = True
        distinct = sorted({"number" if k == "integer" else k for k in kinds})
        if len(distinct) > 1:
            out["types"] = sorted(set(kinds))  # every type the field took, for the fidelity check
        if kind == "object":
            seen = max(self.types["object"], 1)
            out["properties"] = {k: s.final() for k, s in self.props.items()}
            out["required"] = [k for k in self.props if self.presence[k] / seen >= 0.5]
            order = self._date_order()
            if order:
                out["date_order"] = order
        elif kind == "map":
            out["keys"] = _string_facts(self.keys)
            out["values"] = self.values.final() if self.values else {"type": "null"}
        elif kind == "array":
            out["items"] = self.items.final() if self.items else {"type": "string"}
        elif kind == "string":
            out.update(_string_facts(self.strings))
        elif kind in ("integer", "number") and self.numbers:
            decimals = max(
                (len(repr(x).split(".")[1]) if "." in repr(x) else 0) for x in self.numbers[:200]
            )
            out.update(
                min=min(self.numbers),
                max=max(self.numbers),
                decimals=0 if kind == "integer" else min(decimals, 2),
                count=len(self.numbers),
            )
        return out


def _string_facts(values: Counter[str]) -> dict[str, Any]:
    ordered = [v for v, _ in sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))]
    wordy = ordered and sum(is_wordlike(v) for v in ordered) >= 0.8 * len(ordered)
    facts: dict[str, Any] = {"examples": ordered[: MAX_WORD_EXAMPLES if wordy else MAX_EXAMPLES]}
    formats = formats_of(values.elements() if sum(values.values()) < 2000 else ordered)
    if formats and not wordy:
        facts["formats"] = formats
    if wordy:
        facts["wordlike"] = True
    kinds = {date_kind(v) for v in ordered}
    if len(kinds) == 1 and None not in kinds:
        (kind,) = kinds
        moments = [m for m in (parse_date(v, kind) for v in ordered) if m is not None]
        if moments:
            low, high = min(moments), max(moments)
            facts["dates"] = {
                "kind": kind,
                "min": low.date().isoformat() if kind == "date" else low.isoformat(),
                "max": high.date().isoformat() if kind == "date" else high.isoformat(),
                "count": sum(values.values()),
            }
    elif (
        ordered
        and len(ordered) <= MAX_ENUM
        and sum(values.values()) >= 2 * len(ordered)
        and not any(is_id_value(v) for v in ordered)
        and len(ordered) < _MAX_DISTINCT
    ):
        facts["enum"] = sorted(ordered)  # every value the field took: few, each seen repeatedly
    return facts


def shape_of(values: Iterable[Any]) -> dict[str, Any]:
    shape = _Shape()
    for value in values:
        shape.add(value)
    return shape.final()


# Tool schemas -----------------------------------------------------------------------------------
@dataclass
class ArgSchema:
    name: str
    type: str = "string"
    required: bool = True
    items: str | None = None  # element type of an array argument
    formats: list[dict[str, Any]] = field(default_factory=list)
    examples: list[Any] = field(default_factory=list)
    enum: list[Any] | None = None
    minimum: float | None = None
    maximum: float | None = None
    decimals: int | None = None
    shape: dict[str, Any] | None = None  # the recorded values' shape (None in older catalogs)

    def json_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "array":
            out["items"] = {"type": self.items or "string"}
            if self.formats:
                out["items"]["pattern"] = self.formats[0]["regex"]
        elif self.formats:
            out["pattern"] = self.formats[0]["regex"]
        if self.enum:
            out["enum"] = list(self.enum)
        return out


@dataclass
class ToolSchema:
    name: str
    arguments: dict[str, ArgSchema] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=lambda: {"type": "string", "examples": []})
    calls: int = 0
    errors: int = 0
    read: bool = True
    description: str = ""
    echoes: dict[str, str] = field(default_factory=dict)  # argument -> result field holding it

    @property
    def required(self) -> list[str]:
        return [a.name for a in self.arguments.values() if a.required]

    def json_schema(self) -> dict[str, Any]:
        """The tool in the OpenAI function-calling format the agent saw it in."""
        desc = self.description or (
            f"{'Read-only' if self.read else 'Changes state'}: {self.name.replace('_', ' ')}."
        )
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": desc,
                "parameters": {
                    "type": "object",
                    "properties": {a.name: a.json_schema() for a in self.arguments.values()},
                    "required": self.required,
                },
            },
        }

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["arguments"] = {k: asdict(v) for k, v in self.arguments.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolSchema:
        data = dict(data)
        data["arguments"] = {k: ArgSchema(**v) for k, v in data.get("arguments", {}).items()}
        return cls(**data)


@dataclass(frozen=True)
class Flow:
    """An argument value copied from an earlier tool result: `source.path -> target.argument`."""

    source: str
    path: str  # JSON path in the source's result: `$`, `orders[*]`, `items[*].item_id`, `m{*}`
    target: str
    argument: str
    count: int = 1


@dataclass
class StatusRule:
    """What a write needs and does to a record's status field (mined from the traces)."""

    tool: str
    lookup: str
    field: str
    allowed: list[str]
    refused: list[str]
    after: str | None


@dataclass
class Catalog:
    """Everything inferred about the agent's tools."""

    tools: dict[str, ToolSchema] = field(default_factory=dict)
    flows: list[Flow] = field(default_factory=list)
    status_rules: dict[str, StatusRule] = field(default_factory=dict)
    traces: int = 0
    facts: int = 0  # FACTS_VERSION of the facts recorded (0: saved before enums, dates, echoes)

    def flows_into(self, tool: str, argument: str) -> list[Flow]:
        return sorted(
            (f for f in self.flows if f.target == tool and f.argument == argument),
            key=lambda f: -f.count,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "tools": {k: v.to_dict() for k, v in self.tools.items()},
            "flows": [asdict(f) for f in self.flows],
            "status_rules": {k: asdict(v) for k, v in self.status_rules.items()},
            "traces": self.traces,
            "facts": self.facts,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Catalog:
        return cls(
            tools={k: ToolSchema.from_dict(v) for k, v in data.get("tools", {}).items()},
            flows=[Flow(**f) for f in data.get("flows", [])],
            status_rules={k: StatusRule(**v) for k, v in data.get("status_rules", {}).items()},
            traces=data.get("traces", 0),
            facts=int(data.get("facts", 0) or 0),
        )

    def subset(self, names: Iterable[str]) -> Catalog:
        keep = set(names)
        return Catalog(
            tools={k: v for k, v in self.tools.items() if k in keep},
            flows=[f for f in self.flows if f.source in keep and f.target in keep],
            status_rules={k: v for k, v in self.status_rules.items() if k in keep},
            traces=self.traces,
            facts=self.facts,
        )


def _arg_schema(name: str, values: list[Any], calls: int) -> ArgSchema:
    kinds = Counter(json_type(v) for v in values if v is not None)
    kind = kinds.most_common(1)[0][0] if kinds else "string"
    if kind == "integer" and kinds.get("number"):
        kind = "number"
    arg = ArgSchema(name=name, type=kind, required=len(values) == calls, shape=shape_of(values))
    if kind == "array":
        flat = [x for v in values if isinstance(v, list) for x in v]
        item_kinds = Counter(json_type(x) for x in flat)
        arg.items = item_kinds.most_common(1)[0][0] if item_kinds else "string"
        strings = [x for x in flat if isinstance(x, str)]
    else:
        strings = [v for v in values if isinstance(v, str)]
    if strings:
        counts = Counter(strings)
        # ties by value, not by the order the traces came in (their ids are random)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        arg.examples = [v for v, _ in ranked[:MAX_EXAMPLES]]
        arg.formats = formats_of(strings)
        words = [v for v in counts if is_wordlike(v) or " " in v]
        if (
            kind == "string"
            and len(counts) <= 8
            and len(strings) >= 2 * len(counts)
            and len(words) == len(counts)
        ):
            arg.enum = sorted(counts)
    numbers = [float(v) for v in values if json_type(v) in ("integer", "number")]
    if numbers:
        arg.examples = sorted(set(numbers))[:MAX_EXAMPLES]
        arg.minimum, arg.maximum = min(numbers), max(numbers)
        arg.decimals = 0 if kind == "integer" else 2
    return arg


def _leaves(value: Any, path: str, out: dict[str, str], depth: int = 0) -> None:
    """Index every string leaf (and id-like map key) of a result by value -> JSON path."""
    if depth > 6:
        return
    if isinstance(value, str):
        out.setdefault(value, path)
    elif isinstance(value, Mapping):
        is_map = value and all(is_id_value(k) for k in value)
        for key, item in value.items():
            if is_map:
                out.setdefault(key, f"{path}{{*}}" if path != "$" else "{*}")
                sub = f"{path}{{*}}" if path != "$" else "{*}"
            else:
                sub = key if path == "$" else f"{path}.{key}"
            _leaves(item, sub, out, depth + 1)
    elif isinstance(value, (list, tuple)):
        sub = "[*]" if path == "$" else f"{path}[*]"
        for item in value[:50]:
            _leaves(item, sub, out, depth + 1)


def _count_echoes(
    tool: str,
    arguments: Mapping[str, Any],
    result: Mapping[str, Any],
    seen: dict[str, Counter[str]],
    hits: dict[str, dict[tuple[str, str], tuple[list[int], set[Any]]]],
) -> None:
    for name, value in arguments.items():
        if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
            continue
        seen.setdefault(tool, Counter())[name] += 1
        for key, item in result.items():
            if item == value and type(item) is type(value):
                count, values = hits.setdefault(tool, {}).setdefault((name, key), ([0], set()))
                count[0] += 1
                if len(values) < 3:
                    values.add(value)


def _echoes(
    seen: Counter[str], hits: dict[tuple[str, str], tuple[list[int], set[Any]]]
) -> dict[str, str]:
    """argument -> the result field that held its value in (nearly) every successful call, for
    at least two different values (a constant proves nothing): a read returns the record asked
    for (`order_id` -> `order_id`, `booking_id` -> `id`), a write the value it wrote (`reason`
    -> `cancel_reason`, `seat` -> `seat`)."""
    out: dict[str, str] = {}
    ranked = sorted(hits.items(), key=lambda kv: (-kv[1][0][0], kv[0][1] != kv[0][0], kv[0]))
    for (name, key), ((count,), values) in ranked:
        if name in out or len(values) < 2 or count < 0.9 * seen[name]:
            continue
        out[name] = key
    return out


def infer_catalog(traces: Iterable[Sequence[Mapping[str, Any]]]) -> Catalog:
    """Infer schemas, flows and status rules from traces: each a list of calls in run order,
    a call being `{"tool", "arguments", "result", "error"}` (arguments/result as JSON text or
    values; `error` true when the call failed)."""
    args: dict[str, dict[str, list[Any]]] = {}
    results: dict[str, _Shape] = {}
    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    flows: Counter[tuple[str, str, str, str]] = Counter()
    statuses: dict[tuple[str, str], dict[str, Counter[str]]] = {}
    after: dict[str, Counter[str]] = {}
    echo_seen: dict[str, Counter[str]] = {}  # tool -> argument -> successful calls with it
    # tool -> (argument, result field) -> (calls where they were equal, some of the values)
    echo_hits: dict[str, dict[tuple[str, str], tuple[list[int], set[Any]]]] = {}
    n_traces = 0
    for trace in traces:
        n_traces += 1
        seen: dict[str, dict[tuple[str, str], None]] = {}  # value -> every (tool, path) so far
        records: dict[str, tuple[str, Mapping[str, Any]]] = {}  # id value -> (lookup, record)
        for call in trace:
            tool = call.get("tool")
            if not tool:
                continue
            calls[tool] += 1
            arguments = parse_json_literal(call.get("arguments"))
            if not isinstance(arguments, Mapping):
                arguments = {} if arguments in (None, "") else {"input": arguments}
            failed = bool(call.get("error"))
            errors[tool] += failed
            slot = args.setdefault(tool, {})
            for name, value in arguments.items():
                slot.setdefault(name, []).append(value)
                for item in value if isinstance(value, list) else [value]:
                    if isinstance(item, str) and item in seen and len(item) >= 3:
                        for source, path in seen[item]:
                            if source != tool or path != "$":
                                flows[(source, path, tool, name)] += 1
            result = parse_json_literal(call.get("result"))
            if failed:
                result_text = None
            else:
                results.setdefault(tool, _Shape()).add(result)
                result_text = result
                if isinstance(result, Mapping):
                    _count_echoes(tool, arguments, result, echo_seen, echo_hits)
            # status preconditions of writes, judged by the last record seen for the same id
            if not is_read_tool(tool):
                for value in arguments.values():
                    if isinstance(value, str) and value in records:
                        lookup, record = records[value]
                        status = record.get("status")
                        if isinstance(status, str):
                            slot_s = statuses.setdefault((tool, lookup), {})
                            slot_s.setdefault("refused" if failed else "allowed", Counter())[
                                status
                            ] += 1
                        if (
                            not failed
                            and isinstance(result, Mapping)
                            and isinstance(result.get("status"), str)
                        ):
                            after.setdefault(tool, Counter())[result["status"]] += 1
                        break
            if result_text is not None:
                index: dict[str, str] = {}
                _leaves(result_text, "$", index)
                for value, path in index.items():
                    sources = seen.setdefault(value, {})
                    if len(sources) < 4:
                        sources[(tool, path)] = None
                if is_read_tool(tool) and isinstance(result, Mapping):
                    for value in arguments.values():
                        if isinstance(value, str):
                            records[value] = (tool, result)
    catalog = Catalog(traces=n_traces, facts=FACTS_VERSION)
    for tool in calls:
        per_arg = args.get(tool, {})
        tool_calls = calls[tool]
        catalog.tools[tool] = ToolSchema(
            name=tool,
            arguments={n: _arg_schema(n, v, tool_calls) for n, v in per_arg.items()},
            result=results[tool].final() if tool in results else {"type": "string"},
            calls=tool_calls,
            errors=errors[tool],
            read=is_read_tool(tool),
            echoes=_echoes(echo_seen.get(tool, Counter()), echo_hits.get(tool, {})),
        )
    catalog.flows = [Flow(s, p, t, a, c) for (s, p, t, a), c in flows.most_common()]
    for (tool, lookup), kinds in statuses.items():
        allowed = sorted(kinds.get("allowed", Counter()))
        if not allowed:
            continue
        shape = catalog.tools[lookup].result.get("properties", {}).get("status", {})
        every = shape.get("examples", [])
        refused = sorted(s for s in {*kinds.get("refused", Counter()), *every} if s not in allowed)
        done = after.get(tool, Counter()).most_common(1)
        catalog.status_rules[tool] = StatusRule(
            tool, lookup, "status", allowed, refused, done[0][0] if done else None
        )
    return catalog


def catalog_from_store(home: str | Path, where: str = "") -> Catalog:
    """The catalog of every tool recorded in the store under `home` (needs the analysis extra)."""
    from tracegym.store.store import Store

    condition = f"WHERE trace_id IN (SELECT trace_id FROM traces WHERE {where})" if where else ""
    query = (
        "SELECT trace_id, tool, arguments, result, status, error_type FROM tool_calls "
        # traces in the order they started (their ids are random): the same runs, recorded
        # twice, give the same catalog wherever first-seen order breaks a tie
        f"{condition} ORDER BY min(start_time) OVER (PARTITION BY trace_id), trace_id, "
        "start_time, step_index NULLS LAST"
    )
    with Store(home) as store:
        rows = store.sql(query).fetchall()
    traces: dict[str, list[dict[str, Any]]] = {}
    for trace_id, tool, arguments, result, status, error_type in rows:
        traces.setdefault(trace_id, []).append(
            {
                "tool": tool,
                "arguments": arguments,
                "result": result,
                "error": status == "ERROR" or error_type is not None,
            }
        )
    return infer_catalog(traces.values())


_PATTERN = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*\((.*)\)\s*$", re.S)


def catalog_from_patterns(patterns: Iterable[str], tools: Iterable[str] = ()) -> Catalog:
    """A minimal catalog from a gap's argument patterns (`refund_order(order_id=<id>)`) alone,
    for when the store holds no calls of the gap's tools."""
    traces = []
    for pattern in patterns:
        match = _PATTERN.match(pattern)
        if not match:
            continue
        arguments = {}
        for part in filter(None, (p.strip() for p in match.group(2).split(","))):
            name, _, value = part.partition("=")
            value = value.strip()
            arguments[name.strip()] = "ID-1001" if value in ("<id>", "") else value
        traces.append([{"tool": match.group(1), "arguments": arguments, "result": {}}])
    named = {call["tool"] for trace in traces for call in trace}
    for tool in tools:
        if tool not in named:
            traces.append([{"tool": tool, "arguments": {}, "result": {}}])
    return infer_catalog(traces)


# Environment spec -------------------------------------------------------------------------------
@dataclass
class EnvironmentSpec:
    """One environment, as written to `<home>/envs/<env_id>/spec.json`."""

    env_id: str
    family: str
    entry_point: str  # "module:Class" of the Environment subclass that runs it
    gap: dict[str, Any] = field(default_factory=dict)  # id, name, key, detector, description
    catalog: Catalog = field(default_factory=Catalog)
    roles: dict[str, Any] = field(default_factory=dict)
    knobs: dict[str, Any] = field(default_factory=dict)
    train_seeds: tuple[int, int] = (0, 10_000)
    heldout_seeds: tuple[int, int] = (1_000_000, 1_001_000)
    description: str = ""
    version: int = SPEC_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "env_id": self.env_id,
            "family": self.family,
            "entry_point": self.entry_point,
            "description": self.description,
            "gap": self.gap,
            "roles": self.roles,
            "knobs": self.knobs,
            "train_seeds": list(self.train_seeds),
            "heldout_seeds": list(self.heldout_seeds),
            "catalog": self.catalog.to_dict(),
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvironmentSpec:
        version = data.get("version")
        if version != SPEC_VERSION:
            raise ValueError(f"spec version {version!r} is not {SPEC_VERSION}")
        return cls(
            env_id=data["env_id"],
            family=data["family"],
            entry_point=data["entry_point"],
            gap=dict(data.get("gap", {})),
            catalog=Catalog.from_dict(data.get("catalog", {})),
            roles=dict(data.get("roles", {})),
            knobs=dict(data.get("knobs", {})),
            train_seeds=tuple(data.get("train_seeds", (0, 10_000))),
            heldout_seeds=tuple(data.get("heldout_seeds", (1_000_000, 1_001_000))),
            description=data.get("description", ""),
            extra=dict(data.get("extra", {})),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> EnvironmentSpec:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> EnvironmentSpec:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
