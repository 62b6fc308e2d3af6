"""The fidelity check: do an environment's generated worlds look like the agent's real ones?

`check_fidelity(env)` generates the tasks of `n_seeds` train seeds and holds them to what the
traces showed (the `Catalog` inferred from them, `synthesis.spec`):

- records: every generated record (the lookup's and the owner's records of a chain world) and
  every tool result the oracle's calls return validates against the recorded result shape of
  that tool: id-like strings match the inferred formats, enum-like strings take observed values,
  numbers lie in the observed range, dates are calendar dates in the observed range and order,
  object keys and list elements are shaped as observed, and no field the traces never showed
  appears; the oracle's arguments validate against the recorded arguments the same way;
- reads return the record asked for: the result field that echoed the argument in the traces
  (`ToolSchema.echoes`) holds the argument's value;
- writes change the state they name: the record the write's arguments name (by id, or by a field
  of a lone record) differs after the oracle's write (after one of them, when the oracle repeats
  a write a silent failure swallowed), and the write's result has the recorded result's shape
  and echoes what the recorded results echoed (`reason` -> `cancel_reason`);
- the system prompt, and the tool descriptions the environment wrote, do not state the answer
  (see `prompt_leaks`; the agent's own recorded instructions and definitions are left out).

Catalogs saved before the facts these checks need were recorded (`Catalog.facts` 0) still load:
the checks without facts are skipped and `FidelityReport.skipped` says which.
"""

from __future__ import annotations

import re
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tracegym.analysis.runs import json_type
from tracegym.analysis.tool_kinds import is_read_tool
from tracegym.synthesis.base import Environment, Task, contains_token
from tracegym.synthesis.spec import (
    FACTS_VERSION,
    Catalog,
    ToolSchema,
    date_kind,
    is_id_name,
    is_id_value,
    parse_date,
)
from tracegym.synthesis.world import (
    MEMORY_TOOLS,
    Roles,
    ToolError,
    WorldState,
    canonical,
    clone,
)

NUMBER_SLACK = 0.05  # share of the recorded span a number may lie outside it (older catalogs)
MAX_ISSUES = 200  # issues a report keeps (all are counted)
MAX_PER_PLACE = 3  # issues kept per place (the same path with other ids and seeds)
MAX_DEPTH = 6  # `spec._Shape` records no facts deeper than this

Found = list[tuple[str, str, Any]]  # (path, problem, value)
Checker = Callable[[Any, str, Found], None]


@dataclass(frozen=True)
class FidelityIssue:
    """One way a generated task departs from the traces: the seed, where (tool and path, or
    the system prompt), and the problem in one sentence."""

    seed: int
    where: str
    problem: str

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "where": self.where, "problem": self.problem}


@dataclass
class FidelityReport:
    env_id: str
    ok: bool
    seeds: int
    issues: list[FidelityIssue] = field(default_factory=list)
    clean: int = 0  # seeds whose task showed no issue
    problems: int = 0  # issues found in all (`issues` keeps some of each place)
    skipped: list[str] = field(default_factory=list)  # checks the catalog has no facts for
    seconds: float = 0.0

    @property
    def share_clean(self) -> float:
        return self.clean / self.seeds if self.seeds else 1.0

    def detail(self) -> str:
        text = f"{self.clean}/{self.seeds} seeds faithful to the traces"
        if self.issues:
            places = len({_place(i.where) for i in self.issues})
            text += f" ({self.problems} problem(s) at {places}+ place(s))"
            shown = []
            seen: set[str] = set()
            for issue in self.issues:
                if _place(issue.where) in seen:
                    continue
                seen.add(_place(issue.where))
                shown.append(f"seed {issue.seed}, {issue.where}: {issue.problem}")
                if len(shown) == 3:
                    break
            text += "; e.g. " + "; ".join(shown)
        if self.skipped:
            text += f"; not checked ({', '.join(self.skipped)})"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "ok": self.ok,
            "seeds": self.seeds,
            "clean": self.clean,
            "problems": self.problems,
            "issues": [i.to_dict() for i in self.issues],
            "skipped": list(self.skipped),
            "seconds": round(self.seconds, 3),
        }


def _place(where: str) -> str:
    """`get_order_details result.items[1].price` with its ids and indexes blanked."""
    return re.sub(r"\[[^\]]*\]|\{[^}]*\}|\d+", "*", where)


# Shapes compiled into checkers ------------------------------------------------------------------
_COMPILED: dict[tuple[int, bool], tuple[Any, Checker]] = {}


_KINDS = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object",
          list: "array"}  # fmt: skip


def _json_kind(value: Any) -> str:
    return _KINDS.get(type(value)) or json_type(value)


def _kind_ok(value: Any, kind: str, kinds: frozenset[str]) -> bool:
    if kind in kinds:
        return True
    if kind == "integer" and "number" in kinds:
        return True
    if kind == "number" and "integer" in kinds and float(value).is_integer():
        return True
    return kind == "object" and "map" in kinds


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def compile_shape_check(shape: Mapping[str, Any], facts: bool, depth: int = 0) -> Checker:
    """A function `check(value, path, found)` appending `(path, problem, value)` for every way
    `value` departs from the recorded `shape` (cached per shape object). `facts`: the catalog
    records enums, dates and types (`Catalog.facts`), so those are checked too."""
    key = (id(shape), facts)
    cached = _COMPILED.get(key)
    if cached is not None and cached[0] is shape and depth == 0:
        return cached[1]
    checker = _compile(shape, facts, depth)
    if depth == 0:
        if len(_COMPILED) > 20_000:
            _COMPILED.clear()
        _COMPILED[key] = (shape, checker)
    return checker


def _compile(shape: Mapping[str, Any], facts: bool, depth: int) -> Checker:
    if depth > MAX_DEPTH:
        return lambda value, path, found: None
    kind = shape.get("type", "string")
    kinds = frozenset((shape.get("types") if facts else None) or [kind])
    nullable = bool(shape.get("nullable")) or kind == "null"
    inner = {
        "object": _object_checker,
        "map": _map_checker,
        "array": _array_checker,
        "string": _string_checker,
        "integer": _number_checker,
        "number": _number_checker,
    }.get(kind)
    body = inner(shape, facts, depth) if inner else None
    shown = "/".join(sorted(kinds))
    main = {"map": "object", "integer": "number"}.get(kind, kind)

    def check(value: Any, path: str, found: Found) -> None:
        if value is None:
            if not nullable:
                found.append((path, "is null where the traces never showed null", None))
            return
        actual = _json_kind(value)
        if not _kind_ok(value, actual, kinds):
            found.append(
                (path, f"is {actual} ({_show(value)}) where the traces showed {shown}", value)
            )
            return
        if body is not None and (actual if actual != "integer" else "number") == main:
            body(value, path, found)

    return check


def _object_checker(shape: Mapping[str, Any], facts: bool, depth: int) -> Checker:
    props = shape.get("properties") or {}
    checks = {k: _compile(sub, facts, depth + 1) for k, sub in props.items()}
    required = tuple(shape.get("required") or ())
    order = [tuple(p) for p in shape.get("date_order") or []] if facts else []
    deep = depth >= MAX_DEPTH  # the traces' deeper keys were not recorded

    def check(value: Mapping[str, Any], path: str, found: Found) -> None:
        if deep:
            return
        for key, item in value.items():
            sub = _join(path, str(key))
            inner = checks.get(key)
            if inner is None:
                found.append((sub, "is a field the traces never showed", item))
            else:
                inner(item, sub, found)
        missing = [k for k in required if k not in value]
        if missing:
            found.append(
                (
                    path or "$",
                    f"lacks field(s) most recorded results had: {', '.join(missing)}",
                    None,
                )
            )
        for a, b in order:
            first, second = _moment(value.get(a)), _moment(value.get(b))
            if first is not None and second is not None and first > second:
                found.append(
                    (
                        _join(path, a),
                        f"{value[a]!r} is after {b} {value[b]!r}: in the traces "
                        f"{a} never came after {b}",
                        value[a],
                    )
                )

    return check


def _moment(value: Any) -> datetime | None:
    kind = date_kind(value)
    return parse_date(value, kind) if kind else None


def _map_checker(shape: Mapping[str, Any], facts: bool, depth: int) -> Checker:
    keys = _string_checker(shape.get("keys") or {}, facts, depth)
    values = _compile(shape.get("values") or {"type": "null"}, facts, depth + 1)

    def check(value: Mapping[str, Any], path: str, found: Found) -> None:
        for key, item in value.items():
            sub = f"{path}{{{key}}}"
            keys(str(key), sub + " (key)", found)
            values(item, sub, found)

    return check


def _array_checker(shape: Mapping[str, Any], facts: bool, depth: int) -> Checker:
    items = _compile(shape.get("items") or {"type": "string"}, facts, depth + 1)

    def check(value: Sequence[Any], path: str, found: Found) -> None:
        for i, item in enumerate(value):
            items(item, f"{path}[{i}]", found)

    return check


def _checks_formats(shape: Mapping[str, Any]) -> bool:
    """Formats describe id-like values (a run of digits in them) or nearly every recorded value;
    the formats of free text (a few recurring phrasings) say nothing about a new value."""
    formats = shape.get("formats") or []
    if not formats or shape.get("wordlike"):
        return False
    digits = any(kind == "digits" for f in formats for kind, _ in f.get("parts", []))
    return digits or sum(float(f.get("share", 0)) for f in formats) >= 0.9


def _slack(low: float, high: float, count: Any) -> float:
    """How far beyond the recorded [low, high] a value may lie. The recorded extremes are those
    of a sample: for n values drawn evenly from a range, the range's own end lies about
    span/(n-1) beyond the sample's (the unbiased estimate of a uniform's end point). Catalogs
    that did not count the values allow NUMBER_SLACK of the span."""
    span = high - low
    if isinstance(count, int) and count >= 2:
        return span / (count - 1)
    return span * NUMBER_SLACK


def _string_checker(shape: Mapping[str, Any], facts: bool, depth: int) -> Checker:
    examples = frozenset(x for x in shape.get("examples") or () if isinstance(x, str))
    enum = frozenset(shape["enum"]) if facts and shape.get("enum") else None
    dates = shape.get("dates") if facts else None
    layout = dates["kind"] if dates else None
    if layout is None and examples:
        kinds = {date_kind(x) for x in examples}
        layout = next(iter(kinds)) if len(kinds) == 1 else None  # older catalogs: the examples
    low = high = None
    if dates:
        low, high = datetime.fromisoformat(dates["min"]), datetime.fromisoformat(dates["max"])
        slack = max(timedelta(days=1), (high - low) * (_slack(0, 1, dates.get("count"))))
        low, high = low - slack, high + slack
    regexes = (
        [re.compile(f["regex"]) for f in shape.get("formats") or []]
        if _checks_formats(shape)
        else []
    )
    listed = ", ".join(repr(v) for v in sorted(enum)[:6]) if enum else ""

    def check(value: str, path: str, found: Found) -> None:
        if enum is not None:
            if value not in enum:
                found.append(
                    (
                        path,
                        f"{_show(value)} is not a value the traces showed ({listed}"
                        f"{', ...' if len(enum) > 6 else ''})",
                        value,
                    )
                )
            return
        if layout is not None:
            moment = parse_date(value, layout) if date_kind(value) == layout else None
            if moment is None:
                found.append((path, f"{_show(value)} is not a valid {layout}", value))
            elif low is not None and not low <= moment <= high:
                found.append(
                    (
                        path,
                        f"{_show(value)} is outside the recorded dates {dates['min']} to "
                        f"{dates['max']}",
                        value,
                    )
                )
            return
        if regexes and value not in examples and not any(r.match(value) for r in regexes):
            found.append(
                (
                    path,
                    f"{_show(value)} does not match the recorded format "
                    f"{' or '.join(r.pattern for r in regexes)}",
                    value,
                )
            )

    return check


def _number_checker(shape: Mapping[str, Any], facts: bool, depth: int) -> Checker:
    low, high = shape.get("min"), shape.get("max")
    decimals = shape.get("decimals") if shape.get("type") == "number" else None
    if low is None or high is None:
        return lambda value, path, found: None
    slack = _slack(float(low), float(high), shape.get("count")) + 1e-9

    def check(value: float, path: str, found: Found) -> None:
        if not low - slack <= value <= high + slack:
            found.append((path, f"{value} is outside the recorded range [{low}, {high}]", value))
        elif (
            decimals is not None
            and isinstance(value, float)
            and abs(round(value, int(decimals)) - value) > 1e-9
        ):
            found.append((path, f"{value} has more decimals than the recorded {decimals}", value))

    return check


# The system prompt ------------------------------------------------------------------------------
ORDER_WORDS = re.compile(
    r"\b(before|after|afterwards|first|then|prior|earlier|once|until|followed|"
    r"precedes?|preceded|preceding|beforehand|next|previously)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")


def _has(text: str, value: str) -> bool:
    """`contains_token`, after a cheap substring test (most sentences hold no value at all)."""
    return value.casefold() in text.casefold() and contains_token(text, value)


def _mentions(text: str, tool: str) -> bool:
    return _has(text, tool) or ("_" in tool and _has(text, tool.replace("_", " ")))


def _without(sentence: str, tools: Sequence[str]) -> str:
    for tool in tools:
        for form in {tool, tool.replace("_", " ")}:
            sentence = re.sub(
                r"(?<![A-Za-z0-9_])" + re.escape(form) + r"(?![A-Za-z0-9_])",
                " ",
                sentence,
                flags=re.IGNORECASE,
            )
    return sentence


def prompt_leaks(
    prompt: str,
    tools: Sequence[str],
    decisive: Sequence[str] = (),
    arguments: Sequence[str] = (),
) -> list[str]:
    """The sentences of `prompt` that state the answer of a task whose oracle calls `tools`:

    - a sentence that names one of the oracle's tools (`get_order_details`, or "get order
      details") together with an ordering word (before, after, first, then, once, until, ...)
      states the call order the task checks ("Always call get_order_details before
      cancel_pending_order", "After each write, check it with get_order_details"), when the
      oracle calls two tools or more (with one, there is no call order to give away: "Press the
      button, then reply" states the task);
    - a sentence that names one of the oracle's tools and a `decisive` value (the state a write
      depends on or leaves: `pending`, `cancelled`) states the rule the task checks;
    - a sentence holding one of the oracle's `arguments` (an id, an amount) states the answer
      itself.

    Each leak is one sentence: "why: the sentence"."""
    out = []
    for sentence in filter(None, (s.strip() for s in _SENTENCE.split(prompt))):
        named = [t for t in tools if _mentions(sentence, t)]
        rest = _without(sentence, named)  # a tool's own name (`cancel_pending_order`) says nothing
        if named and len(set(tools)) >= 2 and ORDER_WORDS.search(rest):
            out.append(f"names the order of the oracle's calls ({', '.join(named)}): {sentence!r}")
            continue
        value = next((v for v in decisive if _has(rest, v)), None) if named else None
        if value is not None:
            out.append(f"states the {value!r} the oracle's {named[0]} depends on: {sentence!r}")
            continue
        value = next((v for v in arguments if _has(sentence, v)), None)
        if value is not None:
            out.append(f"holds the oracle's argument {value!r}: {sentence!r}")
    return out


def _argument_texts(value: Any) -> Iterator[str]:
    """Values of the oracle's arguments a prompt must not hold: ids and amounts."""
    if isinstance(value, list):
        for item in value:
            yield from _argument_texts(item)
    elif isinstance(value, str) and is_id_value(value):
        yield value
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) >= 10:
        yield str(value)
        if isinstance(value, float):
            yield f"{value:.2f}"


# The check --------------------------------------------------------------------------------------
class _Checker:
    """What one environment's tasks are checked against, computed once."""

    def __init__(self, env: Environment, catalog: Catalog) -> None:
        self.env = env
        self.catalog = catalog
        self.facts = catalog.facts >= FACTS_VERSION
        roles = getattr(env, "roles", None)
        self.roles: Roles | None = roles if isinstance(roles, Roles) else None
        self._effect_unknown: bool | None = None
        self.tools: dict[str, ToolSchema] = dict(catalog.tools)
        self.skipped: set[str] = set()
        if not self.facts:
            self.skipped.add(
                "enum values, date ranges and order, argument shapes and echoed ids: the "
                "catalog predates them (ids checked by same-name fields)"
            )
        conventions = getattr(env, "conventions", None)
        recorded = getattr(conventions, "system_prompt", "") or ""
        if not recorded and env.spec is not None:
            recorded = str((env.spec.extra.get("conventions") or {}).get("system_prompt") or "")
        self.recorded_prompt = recorded
        self.descriptions = self._own_descriptions(conventions)
        self.status_values: list[str] = []
        for rule in catalog.status_rules.values():
            self.status_values += [
                *rule.allowed,
                *rule.refused,
                *([rule.after] if rule.after else []),
            ]
        if self.roles and self.roles.status:
            status = self.roles.status
            self.status_values += [*status.get("allowed", []), *status.get("refused", [])]
            self.status_values.append(str(status.get("after") or ""))

    def _own_descriptions(self, conventions: Any) -> list[tuple[str, str]]:
        """(where, text) of the tool descriptions the environment wrote itself."""
        recorded = getattr(conventions, "tools", None) or []
        if not recorded and self.env.spec is not None:
            recorded = (self.env.spec.extra.get("conventions") or {}).get("tools") or []
        theirs = {
            str(t.get("function", t).get("description") or "")
            for t in recorded
            if isinstance(t, Mapping)
        }
        try:
            schemas = self.env.tool_schemas()
        except Exception:  # the schemas are another check's business
            return []
        out = []
        for schema in schemas:
            function = schema.get("function", schema) if isinstance(schema, Mapping) else {}
            text = str(function.get("description") or "")
            if text and text not in theirs:
                out.append((f"tool description {function.get('name')}", text))
        return out

    def shape_check(self, shape: Mapping[str, Any]) -> Checker:
        return compile_shape_check(shape, self.facts)

    def has_results(self, name: str) -> bool:
        tool = self.tools.get(name)
        return tool is not None and tool.calls > tool.errors

    # records in the state
    def state_records(self, state: Any) -> Iterator[tuple[str, Any, Any]]:
        r = self.roles
        if r is None:
            return
        state = _plain(state)
        for container, tool in (("entities", r.lookup), ("owners", r.owner)):
            records = state.get(container)
            if tool and self.has_results(tool) and isinstance(records, Mapping):
                shape = self.tools[tool].result
                for rid, record in records.items():
                    yield f"{tool} record[{rid}]", record, shape

    # writes
    def id_order(self, args: Mapping[str, Any]) -> list[str]:
        first = self.roles.id_arg if self.roles else None
        return sorted(args, key=lambda a: (a != first, not is_id_name(a)))

    def named_record(
        self, state: Any, args: Mapping[str, Any]
    ) -> tuple[str, tuple[str, ...]] | None:
        """The stored record a write's arguments name: `entities[#W1234567]` (a record keyed by
        an argument's value) or `record` (a lone record holding an argument's value)."""
        state = _plain(state)
        containers = [
            k
            for k, v in state.items()
            if not k.startswith("_") and k not in ("writes", "memory") and isinstance(v, Mapping)
        ]
        order = self.id_order(args)
        for name in order:
            value = args[name]
            if not isinstance(value, str):
                continue
            for c in containers:
                if isinstance(state[c].get(value), Mapping):
                    return f"{c}[{value}]", (c, value)
        for c in containers:
            if any(
                name in state[c] and state[c][name] == args[name] and args[name] not in (None, "")
                for name in order
            ):
                return c, (c,)
        return None

    def check_seed(self, seed: int) -> list[tuple[str, str]]:
        try:
            task = self.env.make_task(seed)
        except Exception as exc:  # a crashing generator fails the check, never the caller
            return [("generation", _raised(exc))]
        found: list[tuple[str, str]] = []

        def add(prefix: str, items: Found, accepted: Mapping[str, set[str]] | None = None) -> None:
            for path, problem, value in items:
                top = path.split(".", 1)[0].split("[", 1)[0].split("{", 1)[0]
                if accepted and top in accepted and canonical(value) in accepted[top]:
                    continue  # a value the oracle's own write put there
                found.append((f"{prefix}.{path}" if path and path != "$" else prefix, problem))

        for where, record, shape in self.state_records(task.state):
            items: Found = []
            self.shape_check(shape)(record, "", items)
            add(where, items)
        try:
            decisive = self.replay(task, add, found)
        except Exception as exc:  # the environment's own tool code crashed on the oracle
            found.append(("oracle replay", _raised(exc)))
            decisive = []
        found.extend(self.prompt(task, decisive))
        return found

    def replay(
        self,
        task: Task,
        add: Callable[..., None],
        found: list[tuple[str, str]],
    ) -> list[str]:
        """Run the oracle on a copy of the state, checking what each call returns and does;
        returns the values the writes changed (the state they depend on and leave)."""
        env = self.env
        state = env.fork_state(task.state)
        touched: dict[tuple[str, str], bool] = {}
        accepted: dict[str, set[str]] = {}
        decisive: list[str] = []
        for action in task.oracle:
            name = action.get("name")
            if not name or name in MEMORY_TOOLS:
                continue
            args = action.get("arguments") or {}
            schema = self.tools.get(name)
            read = schema.read if schema else is_read_tool(name)
            if schema and self.facts and isinstance(args, Mapping):
                for arg_name, value in args.items():
                    arg = schema.arguments.get(arg_name)
                    if arg is not None and arg.shape:
                        items: Found = []
                        self.shape_check(arg.shape)(value, "", items)
                        add(f"{name}({arg_name})", items)
            named = (
                None if read or not isinstance(args, Mapping) else self.named_record(state, args)
            )
            before = clone(_resolve(_plain(state), named[1])) if named else None
            logged = _logged(state)
            try:
                result = env.call_tool(state, name, args)
            except ToolError:
                continue  # a refusal or a flaky read the oracle retries
            if schema is not None and self.has_results(name):
                items = []
                self.shape_check(schema.result)(result, "", items)
                if named:  # the stored record's own values are held to the lookup's shape
                    record = _resolve(_plain(state), named[1])
                    items = [i for i in items if not _echoes_record(record, i[0], i[2])]
                add(f"{name} result", items, accepted if read else None)
            found.extend(self.echo_problems(name, schema, args, result, read))
            if not read and named:
                after = _resolve(_plain(state), named[1])
                changed = canonical(after) != canonical(before)
                if not changed and self.effect_unknown(env, name):
                    # the traces never show what this write changes: logging the call is the
                    # faithful effect (a changed field would be one the traces never showed)
                    changed = _logged(state) > logged
                key = (name, named[0])
                touched[key] = touched.get(key, False) or changed
                if changed and isinstance(after, Mapping) and isinstance(before, Mapping):
                    for key_name, value in after.items():
                        if before.get(key_name) != value:
                            accepted.setdefault(key_name, set()).add(canonical(value))
                            decisive += [
                                v for v in (before.get(key_name), value) if isinstance(v, str)
                            ]
        for (name, where), changed in touched.items():
            if not changed:
                found.append(
                    (f"{name} on {where}", "the oracle's write left the record it names unchanged")
                )
        return decisive

    def effect_unknown(self, env: Environment, name: str) -> bool:
        """Whether `name` is a chain world's action whose effect on its record the traces never
        show (no mined status change after it, no argument naming a field of the record);
        worked out once per checker."""
        if self._effect_unknown is None:
            catalog = getattr(getattr(env, "spec", None), "catalog", None)
            unknown = False
            if self.roles is not None and catalog is not None:
                from tracegym.synthesis.families.chain import write_effects

                changes, fields = write_effects(self.roles, catalog)
                unknown = not changes and not fields
            self._effect_unknown = unknown
        return self._effect_unknown and self.roles is not None and self.roles.action == name

    def echo_problems(
        self, name: str, schema: ToolSchema | None, args: Any, result: Any, read: bool
    ) -> list[tuple[str, str]]:
        """A read returns the record asked for, a write the value it wrote: the result field
        that echoed an argument in every recorded call holds its value."""
        if not isinstance(result, Mapping) or not isinstance(args, Mapping):
            return []
        if schema is not None and self.facts:
            echoes = dict(schema.echoes)
        elif read:  # older catalogs: an id argument and the result field of the same name
            props = (schema.result.get("properties") or {}) if schema else {}
            echoes = {a: a for a in args if is_id_name(a) and a in props}
        else:
            return []
        out = []
        for arg, key in echoes.items():
            if arg in args and key in result and result[key] != args[arg]:
                if read:
                    problem = (
                        f"a read of {arg} {_show(args[arg])} returned the record of {key} "
                        f"{_show(result[key])}"
                    )
                else:
                    problem = (
                        f"a write of {arg} {_show(args[arg])} returned {key} "
                        f"{_show(result[key])} (the recorded results always echoed it)"
                    )
                out.append((f"{name} result.{key}", problem))
        return out

    def prompt(self, task: Task, decisive: list[str]) -> list[tuple[str, str]]:
        """Leaks in the system prompt and in the tool descriptions the environment wrote (the
        agent's own recorded instructions and tool definitions are left out)."""
        text = task.system_prompt or ""
        if self.recorded_prompt:
            text = text.replace(self.recorded_prompt, " ")  # the agent's own instructions
        texts = [("system prompt", text), *self.descriptions]
        if not any(t.strip() for _, t in texts):
            return []
        tools = list(dict.fromkeys(a["name"] for a in task.oracle if a.get("name")))
        values = [v for v in dict.fromkeys([*decisive, *self.status_values]) if len(v) >= 3]
        arguments = [
            v
            for a in task.oracle
            if isinstance(a.get("arguments"), Mapping)
            for value in a["arguments"].values()
            for v in _argument_texts(value)
        ]
        arguments = list(dict.fromkeys(arguments))
        return [
            (where, leak)
            for where, body in texts
            if body.strip()
            for leak in prompt_leaks(body, tools, values, arguments)
        ]


_STEP = re.compile(r"\[(\d+)\]|\{([^}]*)\}|([^.\[{]+)")


def _echoes_record(record: Any, path: str, value: Any) -> bool:
    """The value at `path` of a write's result is the named record's value at the same path
    (the write returned the record): the record check covers it."""
    if value is None or path in ("", "$") or path.endswith(" (key)"):
        return False
    here = record
    for index, key, name in _STEP.findall(path):
        if index:
            here = here[int(index)] if isinstance(here, list) and int(index) < len(here) else None
        else:
            here = here.get(key or name) if isinstance(here, Mapping) else None
        if here is None:
            return False
    return here == value


def _raised(exc: Exception) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})" if where else ""
    return f"raised {type(exc).__name__}: {exc}{at}"


def _plain(state: Any) -> Any:
    """A state as plain data: a chain world's public fields (its live records), else itself."""
    return state.to_dict() if isinstance(state, WorldState) else state


def _logged(state: Any) -> int:
    """How many writes the state has logged."""
    state = _plain(state)
    return len(state.get("writes") or ()) if isinstance(state, Mapping) else 0


def _resolve(state: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = state
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _seeds(env: Environment, n: int) -> list[int]:
    start, stop = env.spec.train_seeds if env.spec is not None else (0, 10_000)
    return list(range(start, min(stop, start + n)))


def check_fidelity(
    env: Environment, catalog: Catalog | None = None, n_seeds: int = 200
) -> FidelityReport:
    """Check `n_seeds` train tasks of `env` against `catalog` (default: the spec's)."""
    started = time.perf_counter()
    if catalog is None:
        catalog = env.spec.catalog if env.spec is not None else Catalog()
    seeds = _seeds(env, n_seeds)
    report = FidelityReport(env.env_id, ok=True, seeds=len(seeds))
    checker = _Checker(env, catalog)
    if not catalog.tools:
        checker.skipped.add("everything: no recorded tools to compare with")
    per_place: dict[str, int] = {}
    for seed in seeds:
        found = checker.check_seed(seed)
        if not found:
            report.clean += 1
        report.problems += len(found)
        for where, problem in found:
            place = _place(where)
            if per_place.get(place, 0) >= MAX_PER_PLACE or len(report.issues) >= MAX_ISSUES:
                continue
            per_place[place] = per_place.get(place, 0) + 1
            report.issues.append(FidelityIssue(seed, where, problem))
    report.ok = report.problems == 0
    report.skipped = sorted(checker.skipped)
    report.seconds = time.perf_counter() - started
    return report


__all__ = [
    "FidelityIssue",
    "FidelityReport",
    "check_fidelity",
    "compile_shape_check",
    "prompt_leaks",
]
