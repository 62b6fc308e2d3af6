"""Shared pieces of the importers: run identity, synthetic clocks, labels, and the mapping of
OpenAI-style message lists (tau-bench, tau2-bench, openai-chat) onto spans.

The mapping is documented in docs/importers.md. In short, for a message list `messages`:

- every message at position `j` (0-based) becomes exactly one span with
  `tracegym.step.index = j`: system/user/other -> `step {role}`, assistant -> `chat`, tool ->
  `execute_tool {name}` (the call, with the arguments from the assistant message that asked for
  it and the result from this tool message);
- a tool call no tool message answers still becomes an `execute_tool` span, without a step index;
- all spans are children of the run's root `invoke_agent {agent}` span.

Ids derive from a digest of the run's own content (never the file's hash or the run's position
in it), so the same run gets the same trace and span ids whichever file it is imported from.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tracegym.store.importers import ImportFormatError, load_json
from tracegym.store.records import outcome_record, span_record, stable_id
from tracegym.tracer import semconv as sc

# Synthetic time: sources without timestamps start on this day, 1 ms per message.
BASE_NS = 1_704_067_200 * 10**9  # 2024-01-01T00:00:00Z
STEP_NS = 1_000_000
_DAY_MS = 86_400_000

SCOPE = "tracegym.import"

# Attributes the importers add (besides tracegym.tracer.semconv's).
MESSAGE_ROLE = "tracegym.message.role"
MESSAGE_INDEX = "tracegym.message.index"  # the source's own number for a message, if it has one
SOURCE_FORMAT = "tracegym.source.format"
SOURCE_PREFIX = "tracegym.source."
LABEL_FAILURE_ID = "tracegym.label.failure_id"
LABEL_CATEGORY = "tracegym.label.failure_category"
LABEL_CATEGORY_REASON = "tracegym.label.category_reason"
LABEL_AGENT = "tracegym.label.failed_agent"
LABEL_REASON = "tracegym.label.step_reason"
LABEL_ROOT_CAUSE = "tracegym.label.root_cause"
LABEL_FAILURES = "tracegym.label.failures"
TOOL_REQUESTED_BY = sc.TOOL_REQUESTED_BY

TOOL_ERROR_TYPE = "ToolError"
_ERROR_TEXT = re.compile(r"^\s*(Error|ERROR)\b")
_MESSAGE_KEYS = ("role", "name", "content", "tool_calls", "tool_call_id", "function_call")
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


# Small helpers ------------------------------------------------------------------------------


def digest(value: Any) -> str:
    """A hex digest of `value`'s canonical JSON: the identity of a run's content."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def as_text(value: Any) -> str | None:
    """An attribute value: strings as they are, None as None, anything else as JSON."""
    if value is None or isinstance(value, str):
        return value
    return _encode(value)


def content_text(content: Any) -> str | None:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, Mapping) and isinstance(part.get("content"), str):
                texts.append(part["content"])
        if texts:
            return "\n".join(texts)
    return _encode(content)


def looks_like_error(text: str | None) -> bool:
    return text is not None and bool(_ERROR_TEXT.match(text))


def first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:limit]


def parse_time_ns(value: Any) -> int | None:
    """Nanoseconds since the epoch from an ISO 8601 string or epoch seconds; None if neither.

    Naive ISO times (tau2-bench writes `datetime.now().isoformat()`) are read as UTC.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value * 1e9) if value > 0 else None
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1_000_000) * 1000


def synthetic_start(key: str) -> int:
    """A deterministic start time for a run without timestamps: BASE_NS plus up to a day,
    derived from the run's content digest (so runs spread out and never depend on the file)."""
    return BASE_NS + (int(key[:12], 16) % _DAY_MS) * STEP_NS


def boundaries(count: int, start_ns: int, stamps: Sequence[int | None] = ()) -> list[int]:
    """`count + 1` non-decreasing times: item j occupies [b[j], b[j + 1]).

    An item's own timestamp is used where it has one that does not go back in time; otherwise
    it starts STEP_NS after the previous item. The last item lasts STEP_NS.
    """
    times = [start_ns]
    for j in range(count):
        stamp = stamps[j] if j < len(stamps) else None
        if j == 0:
            times[0] = stamp if stamp is not None and stamp >= start_ns else start_ns
            continue
        previous = times[-1]
        times.append(stamp if stamp is not None and stamp > previous else previous + STEP_NS)
    times.append(times[-1] + STEP_NS)
    return times


def hint(value: Any) -> str:
    """' (this looks like FORMAT ...)' when `value` looks like another importer's input."""
    guess = None
    if isinstance(value, Mapping):
        if "simulations" in value:
            guess = "tau2-bench input"
        elif isinstance(value.get("custom"), Mapping) and "raw_results" in value["custom"]:
            guess = "medagentbench input"
        elif "mistake_agent" in value or ("history" in value and "question" in value):
            guess = "whowhen input"
        elif "trajectory" in value:
            guess = "swe-agent input"
        elif "resourceSpans" in value:
            guess = "otlp-json input"
        elif "messages" in value:
            guess = "openai-chat input"
        elif "traj" in value:
            guess = "tau-bench input"
        elif "role" in value:
            guess = 'one chat message, not a run (wrap the message list as {"messages": [...]})'
    elif isinstance(value, list) and value and isinstance(value[0], Mapping):
        first = value[0]
        if "traj" in first:
            guess = "tau-bench input"
        elif "mistake_agent" in first and "history" in first:
            guess = "agentracer input"
        elif "messages" in first:
            guess = "openai-chat input"
        elif "role" in first:
            guess = 'chat messages, not runs (wrap each message list as {"messages": [...]})'
    return f" (this looks like {guess})" if guess else ""


def literal_list(path: Path, value: Any, where: str, name: str = "history") -> list[Any]:
    """A list field that sources write as a list or as a Python literal string (AgenTracer,
    MedAgentBench), read with `ast.literal_eval` (never evaluated as code)."""
    if value is None:
        raise ImportFormatError(path, f"missing field {name!r}", where)
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
            raise ImportFormatError(
                path, f"{name!r} is not a Python literal ({type(exc).__name__})", where
            ) from None
    if not isinstance(value, list):
        raise ImportFormatError(path, f"{name!r} should be a list, got {describe(value)}", where)
    return value


def describe(value: Any) -> str:
    if isinstance(value, Mapping):
        keys = ", ".join(list(map(str, value))[:8])
        return f"an object with keys {keys}" if keys else "an empty object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__}"


def optional_number(path: Path, obj: Mapping, key: str, where: Any) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ImportFormatError(
            path, f"field {key!r} should be a number, got {describe(value)}", record=where
        )
    return float(value)


def is_full_reward(reward: float | None) -> bool | None:
    """tau-bench's own test for a solved task: reward within 1e-6 of 1."""
    return None if reward is None else reward >= 1 - 1e-6


# A run under construction ---------------------------------------------------------------------


@dataclass
class ImportedRun:
    """The spans of one imported run, with ids derived from (format, content key)."""

    fmt: str
    key: str
    run_id: str
    agent: str
    records: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.trace_id = stable_id(self.fmt, self.key)
        self.root_span_id = self.span_id("root")
        self.resource = {"service.name": self.fmt}

    def span_id(self, *parts: Any) -> str:
        return stable_id(self.fmt, self.key, *parts, width=16)

    def add(
        self,
        parts: tuple[Any, ...],
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any],
        *,
        parent: str | None = "",
        status: str = "UNSET",
        status_message: str | None = None,
    ) -> str:
        """Add a span (a child of the root unless `parent` says otherwise); returns its id."""
        span_id = self.span_id(*parts)
        attrs = {k: v for k, v in attributes.items() if v is not None}
        self.records.append(
            span_record(
                trace_id=self.trace_id,
                span_id=span_id,
                parent_span_id=self.root_span_id if parent == "" else parent,
                name=name,
                start_ns=start_ns,
                end_ns=max(end_ns, start_ns),
                status=status,
                status_message=status_message,
                attributes=attrs,
                resource=self.resource,
                scope=SCOPE,
            )
        )
        return span_id

    def root(
        self, start_ns: int, end_ns: int, attributes: Mapping[str, Any], name: str | None = None
    ) -> None:
        """Add the root `invoke_agent` span (first in the list)."""
        attrs = {
            sc.OPERATION: sc.OP_AGENT,
            sc.AGENT_NAME: self.agent,
            sc.RUN_ID: self.run_id,
            SOURCE_FORMAT: self.fmt,
            **attributes,
        }
        self.add(
            ("root",), name or f"invoke_agent {self.agent}", start_ns, end_ns, attrs, parent=None
        )
        self.records.insert(0, self.records.pop())

    def end_ns(self) -> int:
        return max((r["end_ns"] for r in self.records), default=BASE_NS)

    def outcome(
        self,
        *,
        success: bool | None,
        reward: float | None,
        source: str,
        labels: Any = None,
        labelled: bool = False,
    ) -> None:
        """The run's outcome, recorded just after its end.

        A labelled outcome is stamped 1 ms later than the same run's unlabelled one, so where a
        run was imported both with and without labels, the `outcomes` view (latest wins) shows
        the labelled one.
        """
        time_ns = self.end_ns() + STEP_NS * (2 if labelled else 1)
        self.records.append(
            outcome_record(
                self.run_id,
                time_ns=time_ns,
                success=success,
                reward=reward,
                source=source,
                labels=labels,
                resource=self.resource,
            )
        )

    def mark_failures(self, failures: Iterable[Mapping[str, Any]]) -> None:
        """Put `tracegym.label.*` attributes on the spans of each failure's `step_index`."""
        by_step: dict[int, list[Mapping[str, Any]]] = {}
        for failure in failures:
            step = failure.get("step_index")
            if isinstance(step, int) and not isinstance(step, bool):
                by_step.setdefault(step, []).append(failure)
        if not by_step:
            return
        for record in self.records:
            step = record["attributes"].get(sc.STEP_INDEX)
            if step not in by_step:
                continue
            found = sorted(by_step[step], key=lambda f: not f.get("root_cause"))
            first = found[0]
            attrs = record["attributes"]
            for attr, key in (
                (LABEL_FAILURE_ID, "failure_id"),
                (LABEL_CATEGORY, "failure_category"),
                (LABEL_CATEGORY_REASON, "category_reason"),
                (LABEL_AGENT, "failed_agent"),
                (LABEL_REASON, "step_reason"),
            ):
                if first.get(key) is not None:
                    attrs[attr] = (
                        first[key] if isinstance(first[key], (str, int)) else _encode(first[key])
                    )
            attrs[LABEL_ROOT_CAUSE] = any(bool(f.get("root_cause")) for f in found)
            attrs[LABEL_FAILURES] = _encode(list(found))


def keyed(fmt: str, value: Any, seen: dict[str, int]) -> str:
    """The content key of a run; a run repeated verbatim in one file gets `#1`, `#2` ..."""
    key = digest(value)
    count = seen.get(key, 0)
    seen[key] = count + 1
    return key if count == 0 else f"{key}#{count}"


def source_attrs(**values: Any) -> dict[str, Any]:
    """`tracegym.source.<name>` attributes; containers as JSON, None dropped."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, (str, int, float, bool)):
            out[SOURCE_PREFIX + name] = value
        else:
            out[SOURCE_PREFIX + name] = _encode(value)
    return out


# The message mapping --------------------------------------------------------------------------


@dataclass
class _Call:
    call_id: str | None
    name: str
    arguments: str | None
    message: int  # index of the message that made the call
    position: int  # position among that message's calls
    role: str


@dataclass
class ChatSummary:
    """What the root span wants to know about a converted message list."""

    first_user: str | None = None
    last_assistant: str | None = None
    steps: int = 0


def _tool_call(path: Path, call: Any, where: Any, j: int, k: int) -> tuple[str | None, str, Any]:
    """(id, name, arguments) of an OpenAI (`function{name, arguments}`) or tau2 (`name`,
    `arguments`) tool call."""
    if not isinstance(call, Mapping):
        raise ImportFormatError(
            path, f"message {j}: tool call {k} should be an object, got {describe(call)}", where
        )
    function = call.get("function")
    source = function if isinstance(function, Mapping) else call
    name = source.get("name")
    if not isinstance(name, str) or not name:
        raise ImportFormatError(path, f"message {j}: tool call {k} has no function name", where)
    call_id = call.get("id")
    return (str(call_id) if call_id is not None else None), name, source.get("arguments")


def compact_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message with only the keys a reader needs (drops ids, annotations, raw data ...)."""
    return {k: message[k] for k in _MESSAGE_KEYS if message.get(k) is not None}


def _usage(message: Mapping[str, Any]) -> tuple[int | None, int | None]:
    usage = message.get("usage")
    if not isinstance(usage, Mapping):
        return None, None

    def pick(*names: str) -> int | None:
        for name in names:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    return pick("input_tokens", "prompt_tokens"), pick("output_tokens", "completion_tokens")


def convert_messages(
    run: ImportedRun,
    path: Path,
    where: Any,
    messages: Any,
    *,
    start_ns: int,
    stamps: Sequence[int | None] = (),
    model: str | None = None,
    source_index: str | None = None,
) -> ChatSummary:
    """Add one span per message of `messages` to `run` (see the module docstring).

    `stamps` are per-message times where the source has them; `source_index` names a per-message
    field holding the source's own message number (kept as `tracegym.message.index`).
    """
    if not isinstance(messages, list):
        raise ImportFormatError(path, f"messages should be a list, got {describe(messages)}", where)
    for j, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ImportFormatError(
                path, f"message {j} should be an object, got {describe(message)}", where
            )
        if not isinstance(message.get("role"), str):
            raise ImportFormatError(path, f"message {j} has no role", where)
    times = boundaries(len(messages), start_ns, stamps)
    summary = ChatSummary(steps=len(messages))
    pending: list[_Call] = []
    previous_assistant = -1
    agent = run.agent

    def common(j: int, role: str) -> dict[str, Any]:
        attrs: dict[str, Any] = {sc.STEP_INDEX: j, sc.AGENT_NAME: agent, MESSAGE_ROLE: role}
        if source_index is not None:
            own = messages[j].get(source_index)
            if isinstance(own, (int, str)) and not isinstance(own, bool):
                attrs[MESSAGE_INDEX] = own
        return attrs

    def tool_span(call: _Call | None, j: int | None, result: Mapping[str, Any] | None) -> None:
        name = call.name if call is not None else str((result or {}).get("name") or "unknown")
        text = content_text(result.get("content")) if result is not None else None
        failed = result is not None and (result.get("error") is True or looks_like_error(text))
        attrs: dict[str, Any] = {sc.OPERATION: sc.OP_TOOL, sc.TOOL_NAME: name}
        if j is not None:
            attrs.update(common(j, str(result.get("role")) if result else "tool"))
        else:
            attrs.update({sc.AGENT_NAME: agent, MESSAGE_ROLE: call.role if call else "tool"})
        call_id = call.call_id if call is not None else (result or {}).get("tool_call_id")
        if call_id is None and result is not None and isinstance(result.get("id"), str):
            call_id = result["id"]
        attrs[sc.TOOL_CALL_ID] = as_text(call_id)
        if call is not None and call.role != "assistant":
            attrs[TOOL_REQUESTED_BY] = call.role  # e.g. tau2-bench's user-side tools
        attrs[sc.TOOL_ARGUMENTS] = call.arguments if call is not None else None
        attrs[sc.TOOL_RESULT] = text
        if failed:
            attrs[sc.ERROR_TYPE] = TOOL_ERROR_TYPE
        if call is not None:
            start = times[call.message + 1]
            parts: tuple[Any, ...] = ("call", call.message, call.position)
        else:
            start = times[j] if j is not None else times[-1]
            parts = ("tool", j)
        end = times[j + 1] if j is not None else start
        run.add(
            parts,
            f"{sc.OP_TOOL} {name}",
            start,
            end,
            attrs,
            status="ERROR" if failed else "UNSET",
            status_message=(first_line(text or "") or TOOL_ERROR_TYPE) if failed else None,
        )

    for j, message in enumerate(messages):
        role = message["role"]
        text = content_text(message.get("content"))
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise ImportFormatError(path, f"message {j}: tool_calls should be a list", where)
        legacy = message.get("function_call")
        if isinstance(legacy, Mapping) and not calls:
            calls = [{"function": legacy}]
        for k, raw in enumerate(calls):
            call_id, name, arguments = _tool_call(path, raw, where, j, k)
            pending.append(_Call(call_id, name, as_text(arguments), j, k, role))

        if role in ("tool", "function"):
            call_id = message.get("tool_call_id", message.get("id"))
            name = message.get("name")
            match = None
            for call in pending:
                if call.message >= j:
                    continue
                if call_id is not None and call.call_id == str(call_id):
                    match = call
                    break
            if match is None and (call_id is None or role == "function"):
                match = next(
                    (c for c in pending if c.message < j and (name is None or c.name == name)),
                    None,
                )
            if match is not None:
                pending.remove(match)
            tool_span(match, j, message)
            continue

        if role == "assistant":
            if text:
                summary.last_assistant = text
            attrs = common(j, role)
            attrs[sc.OPERATION] = sc.OP_CHAT
            attrs[sc.REQUEST_MODEL] = model
            context = [compact_message(m) for m in messages[previous_assistant + 1 : j]]
            attrs[sc.INPUT_MESSAGES] = _encode(context) if context else None
            attrs[sc.OUTPUT_MESSAGES] = _encode([compact_message(message)])
            input_tokens, output_tokens = _usage(message)
            attrs[sc.INPUT_TOKENS] = input_tokens
            attrs[sc.OUTPUT_TOKENS] = output_tokens
            run.add(
                ("message", j),
                f"{sc.OP_CHAT} {model}" if model else sc.OP_CHAT,
                times[j],
                times[j + 1],
                attrs,
            )
            previous_assistant = j
            continue

        if role == "user" and summary.first_user is None and text:
            summary.first_user = text
        attrs = common(j, role)
        attrs[sc.OPERATION] = sc.OP_STEP
        attrs[sc.STEP_NAME] = role
        attrs[sc.INPUT] = text
        run.add(("message", j), f"{sc.OP_STEP} {role}", times[j], times[j + 1], attrs)

    for call in pending:  # asked for, never answered
        tool_span(call, None, None)
    return summary


# AgentRx-style failure labels -----------------------------------------------------------------


@dataclass
class RunLabels:
    """The labels of one trajectory, normalised (each failure gains a 0-based `step_index`)."""

    trajectory_id: str
    failures: list[dict[str, Any]]
    root_cause: Any
    summary: Any

    def outcome_labels(self) -> dict[str, Any]:
        return {"failures": self.failures, "root_cause": self.root_cause, "summary": self.summary}


def load_agentrx_labels(path: Path) -> dict[str, RunLabels]:
    """AgentRx `tau_ground_truth.json`: a list of `{trajectory_id, failures[{failure_id,
    step_number, step_reason, failure_category, category_reason, failed_agent}], root_cause,
    failure_summary}`, keyed by trajectory id (as text).

    `step_number` is 1-based and counts every message from the first (the system prompt), so
    the failure's span is the one with `tracegym.step.index = step_number - 1` (verified on the
    AgentRx tau-bench retail labels; see docs/importers.md).
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImportFormatError(path, f"cannot read labels: {exc.strerror or exc}") from None
    entries = load_json(path, data)
    if isinstance(entries, Mapping):
        entries = [entries]
    if not isinstance(entries, list):
        raise ImportFormatError(
            path, f"labels should be a list of trajectories, got {describe(entries)}"
        )
    out: dict[str, RunLabels] = {}
    for i, entry in enumerate(entries):
        where = f"label {i}"
        if not isinstance(entry, Mapping) or entry.get("trajectory_id") is None:
            raise ImportFormatError(path, "expected an object with a trajectory_id", record=where)
        trajectory = str(entry["trajectory_id"])
        failures = entry.get("failures") or []
        if not isinstance(failures, list):
            raise ImportFormatError(path, "failures should be a list", record=where)
        root = entry.get("root_cause")
        root_id = root.get("failure_id") if isinstance(root, Mapping) else None
        normalised = []
        for k, failure in enumerate(failures):
            if not isinstance(failure, Mapping):
                raise ImportFormatError(path, f"failure {k} should be an object", record=where)
            item = dict(failure)
            step = failure.get("step_number")
            if isinstance(step, str) and step.strip().isdigit():
                step = int(step)
            if isinstance(step, int) and not isinstance(step, bool) and step >= 1:
                item["step_index"] = step - 1
            item["root_cause"] = root_id is not None and failure.get("failure_id") == root_id
            normalised.append(item)
        if trajectory in out:
            out[trajectory].failures.extend(normalised)
        else:
            out[trajectory] = RunLabels(trajectory, normalised, root, entry.get("failure_summary"))
    return out


def match_labels(
    path: Path,
    labels: Mapping[str, RunLabels],
    runs: Sequence[tuple[Sequence[str], str]],
) -> dict[int, RunLabels]:
    """Which run (by position) each trajectory label names.

    `runs` gives, per run, the ids it answers to in order of preference (for tau-bench:
    `"{task_id}-{trial}"`, then `task_id`) and a description for errors. A label naming a task
    with several runs in the file is ambiguous: name the run as `"{task_id}-{trial}"`.
    """
    index: dict[str, list[int]] = {}
    for position, (names, _) in enumerate(runs):
        for name in dict.fromkeys(names):
            index.setdefault(name, []).append(position)
    out: dict[int, RunLabels] = {}
    for trajectory, entry in labels.items():
        positions = index.get(trajectory, [])
        if len(positions) > 1:
            raise ImportFormatError(
                path,
                f"label trajectory_id {trajectory!r} names {len(positions)} runs of this file "
                f"({', '.join(runs[p][1] for p in positions[:4])}); name one as "
                "'<task_id>-<trial>'",
            )
        if positions:
            out[positions[0]] = entry
    return out


def check_no_labels(path: Path, labels: Path | None, fmt: str) -> None:
    if labels is not None:
        raise ImportFormatError(
            path, f"--labels is not supported for {fmt} (its files carry their own labels)"
        )


def guarded(path: Path, where: Any, function: Any, *args: Any, **kwargs: Any) -> Any:
    """Call `function`, turning any stray shape error into an ImportFormatError for `where`."""
    try:
        return function(*args, **kwargs)
    except ImportFormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ImportFormatError(
            path, f"unexpected shape ({type(exc).__name__}: {exc})", record=where
        ) from None
