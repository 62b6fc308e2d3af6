"""The story of one run, for `tracegym show`: what the user asked, each step with its arguments,
result or error message, the LLM calls as chat lines, memory reads and writes, what the last
`tracegym analyze` found in the run (its decisive step marked) and the outcome.

`load_story(store, trace_id)` reads it from the store's views into plain dataclasses;
`render_story(story, full=False)` draws it as a Rich tree. Trace content is untrusted: every
piece of it goes into `rich.text.Text` objects (never parsed as markup or emoji codes), with
control characters shown as escapes, so a span cannot restyle or drive the terminal.
`requests_of(store, trace_ids)` is the user's request per run (`tracegym traces` lists it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text
from rich.tree import Tree
from tracegym.store.home import Home, read_json
from tracegym.store.plumbing import fold, plumbing_spans
from tracegym.store.pricing import run_cost, usd
from tracegym.store.steps import DecisiveStep, describe, step_numbers
from tracegym.tracer import semconv as sc
from tracegym.tracer.messages import chat_messages

MESSAGE_ROLE = "tracegym.message.role"  # set by the importers on message spans
SHORT = 160  # characters of a value shown without --full (about one terminal line)
LONG = 240  # the same for an error message or a finding (about two lines)

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SPACE = re.compile(r"\s+")


# Plain text of untrusted values --------------------------------------------------------------
def clean(text: str, *, keep_newlines: bool = False) -> str:
    """`text` safe for a terminal: control characters (escape sequences included) as `\\xNN`;
    whitespace runs folded to one space unless `keep_newlines`."""
    text = text.replace("\t", "    ") if keep_newlines else _SPACE.sub(" ", text).strip()
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def clip(value: Any, limit: int = SHORT, *, full: bool = False, count: bool = True) -> str:
    """A value as one line of at most `limit` characters (all of it, newlines kept, when
    `full`), saying how much was left out when `count`."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if full:
        return clean(text, keep_newlines=True)
    text = clean(text)
    if len(text) <= limit:
        return text
    if not count:
        return text[: limit - 1] + "…"
    return f"{text[: limit - 1]}… (+{len(text) - limit + 1} chars)"


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def short_type(error_type: str | None) -> str | None:
    """`pkg.module.OrderNotFound` -> `OrderNotFound`."""
    return error_type.rsplit(".", 1)[-1] if error_type else None


# The story, as data ---------------------------------------------------------------------------
@dataclass
class Step:
    """One span of the run."""

    span_id: str
    parent_span_id: str | None
    name: str
    operation: str | None
    duration_ms: float | None
    status: str | None
    error_type: str | None
    error_message: str | None
    stacktrace: str | None
    step_index: int | None
    tool: str | None
    model: str | None
    input: str | None
    output: str | None
    memory_store: str | None
    memory_record: str | None
    memory_result_ids: list[str] | None
    input_tokens: int | None
    output_tokens: int | None
    attributes: dict[str, Any] = field(default_factory=dict)
    start_ns: int | None = None  # run order (store/steps.py numbers the steps)


@dataclass
class Finding:
    """A gap of the last analysis this run is a member of, at its decisive step."""

    gap_id: str
    gap_name: str
    rank: int | None
    detector: str | None
    step: int | None
    span_ids: list[str]
    evidence: str | None


@dataclass
class Story:
    trace_id: str
    run_id: str | None
    agent: str | None
    service: str | None
    start_time: Any
    duration_ms: float | None
    counts: dict[str, int]
    request: str | None
    outcome: dict[str, Any] | None  # success, reward, source, labels
    analyzed_at: str | None  # generated_at of <home>/gaps.json; None: no analysis yet
    findings: list[Finding]
    steps: list[Step]
    cost: float | None = None  # USD of its priced LLM calls (store/pricing.py)
    plumbing: frozenset[str] = frozenset()  # framework spans folded without --full


def _exception(events: str | None) -> tuple[str | None, str | None]:
    """(message, stacktrace) of the last exception event in a span's events."""
    data = _json(events)
    if not isinstance(data, list):
        return None, None
    for event in reversed(data):
        attributes = event.get("attributes") if isinstance(event, dict) else None
        if isinstance(attributes, dict) and (
            attributes.get("exception.message") or attributes.get("exception.stacktrace")
        ):
            message, trace = (
                attributes.get("exception.message"),
                attributes.get("exception.stacktrace"),
            )
            return (str(message) if message else None), (str(trace) if trace else None)
    return None, None


def _message(status_message: str | None, exception: str | None, error_type: str | None) -> str:
    """The error's own message: the exception's, else the status message less a leading
    `<error type>: ` (the tracer writes `Type: message` there)."""
    if exception:
        return exception
    text = status_message or ""
    for prefix in (error_type, short_type(error_type)):
        if prefix and text.startswith(prefix + ": "):
            return text[len(prefix) + 2 :]
    return text


_SPAN_COLUMNS = (
    "span_id, parent_span_id, name, operation, duration_ms, status, status_message, "
    "error_type, events, step_index, tool, model, input, output, memory_store, memory_record, "
    "memory_result_ids, input_tokens, output_tokens, attributes, start_ns"
)


def load_story(store: Any, trace_id: str) -> Story:
    """Everything `tracegym show` prints about the run with trace id `trace_id`."""
    rows = store.sql(
        f"SELECT {_SPAN_COLUMNS} FROM spans WHERE trace_id = $t ORDER BY start_ns, span_id",
        {"t": trace_id},
    ).fetchall()
    steps: list[Step] = []
    for row in rows:
        (span_id, parent, name, operation, ms, status, status_message, error_type, events,
         step, tool, model, input_, output, mem_store, mem_record, mem_ids, tokens_in,
         tokens_out, attributes, start_ns) = row  # fmt: skip
        exception, stacktrace = _exception(events)
        failed = status == "ERROR" or error_type is not None
        attrs = _json(attributes)
        steps.append(
            Step(
                span_id=span_id, parent_span_id=parent, name=name or "", operation=operation,
                duration_ms=ms, status=status, error_type=error_type,
                error_message=_message(status_message, exception, error_type) if failed
                else None,
                stacktrace=stacktrace, step_index=step, tool=tool, model=model, input=input_,
                output=output, memory_store=mem_store, memory_record=mem_record,
                memory_result_ids=list(mem_ids) if mem_ids is not None else None,
                input_tokens=tokens_in, output_tokens=tokens_out,
                attributes=attrs if isinstance(attrs, dict) else {}, start_ns=start_ns,
            )
        )  # fmt: skip
    trace = store.sql(
        "SELECT run_id, agent, service, start_time, duration_ms, spans, tool_calls, llm_calls, "
        "memory_ops, errors FROM traces WHERE trace_id = $t",
        {"t": trace_id},
    ).fetchall()
    run_id = agent = service = start = duration = None
    counts: dict[str, int] = {}
    if trace:
        run_id, agent, service, start, duration, *numbers = trace[0]
        keys = ("spans", "tool calls", "LLM calls", "memory ops", "errors")
        counts = dict(zip(keys, (int(n or 0) for n in numbers), strict=True))
    outcome = store.sql(
        "SELECT success, reward, source, labels FROM outcomes WHERE trace_id = $t",
        {"t": trace_id},
    ).fetchall()
    findings, analyzed_at = _findings(store, trace_id)
    return Story(
        trace_id=trace_id, run_id=run_id, agent=agent, service=service, start_time=start,
        duration_ms=duration, counts=counts, request=request_text(steps),
        outcome=dict(zip(("success", "reward", "source", "labels"), outcome[0], strict=True))
        if outcome else None,
        analyzed_at=analyzed_at, findings=findings, steps=steps,
        cost=run_cost(store, trace_id), plumbing=plumbing_spans(store, trace_id),
    )  # fmt: skip


def _findings(store: Any, trace_id: str) -> tuple[list[Finding], str | None]:
    """The run's rows of the `gap_runs` view, and when that analysis was made."""
    # gaps.json is analysis's document (analysis.gap.GapsDocument), and the store sits below
    # analysis: only `generated_at` is read here, the rest through the `gap_runs` view
    try:
        document = read_json(Home.at(store.home).gaps)
    except (OSError, ValueError):
        return [], None
    analyzed_at = (
        str(document.get("generated_at") or "an unknown time")
        if isinstance(document, dict)
        else "an unknown time"
    )
    try:
        rows = store.sql(
            "SELECT gap_id, gap_name, rank, detector, step, span_ids, evidence FROM gap_runs "
            "WHERE trace_id = $t ORDER BY rank NULLS LAST, gap_id",
            {"t": trace_id},
        ).fetchall()
    except Exception:  # a gaps.json the view cannot read is no finding, not a failed `show`
        return [], analyzed_at
    findings = [
        Finding(gap_id=str(g), gap_name=str(n or g), rank=r, detector=d, step=s,
                span_ids=[str(x) for x in (ids or [])], evidence=e)
        for g, n, r, d, s, ids, e in rows
    ]  # fmt: skip
    return findings, analyzed_at


# The user's request ---------------------------------------------------------------------------
def _root_request(raw: str | None) -> str | None:
    """The text a root span's input holds: itself, or its longest text argument."""
    if not raw:
        return None
    data = _json(raw)
    if data is None:
        return raw
    if isinstance(data, str):
        return data
    if isinstance(data, dict):
        texts = [v for v in data.values() if isinstance(v, str) and v.strip()]
        return max(texts, key=len) if texts else None
    return None


def _first_user_message(raw: str | None) -> str | None:
    for message in chat_messages(raw):
        if message.get("role") == "user" and message.get("content"):
            return str(message["content"])
    return None


def _request(
    role_user: tuple[str | None, str | None] | None,
    root_input: str | None,
    chat_input: str | None,
) -> str | None:
    given = _json(root_input) if root_input else None
    if root_input and (given is None or isinstance(given, str)):  # the agent was given text
        return given if isinstance(given, str) else root_input
    if role_user is not None and (role_user[0] or role_user[1]):
        return role_user[0] or role_user[1]
    return _root_request(root_input) or _first_user_message(chat_input) or root_input or None


def request_text(steps: Sequence[Step]) -> str | None:
    """What the user asked: the root span's input when it is text, else the first user
    message span (imported runs), else the root input's longest text argument, else the first
    user message of the first LLM call."""
    user = next((s for s in steps if s.attributes.get(MESSAGE_ROLE) == "user"), None)
    known = {s.span_id for s in steps}
    root = next((s for s in steps if s.parent_span_id not in known), None)
    chat = next((s for s in steps if s.operation == sc.OP_CHAT), None)
    return _request(
        (user.input, user.output) if user else None,
        root.input if root else None,
        chat.input if chat else None,
    )


def requests_of(store: Any, trace_ids: Iterable[str]) -> dict[str, str]:
    """`request_text` of many runs in one query (the runs `tracegym traces` lists)."""
    ids = list(dict.fromkeys(trace_ids))
    if not ids:
        return {}
    rows = store.sql(
        f"""
        WITH picked AS (
            SELECT trace_id, parent_span_id, operation, input, output, start_ns,
                   json_extract_string(attributes, '$."{MESSAGE_ROLE}"') AS role
            FROM spans WHERE list_contains($ids, trace_id)
        ),
        users AS (
            SELECT trace_id, input, output FROM picked WHERE role = 'user'
            QUALIFY row_number() OVER (PARTITION BY trace_id ORDER BY start_ns) = 1
        ),
        roots AS (
            SELECT trace_id, input FROM picked WHERE parent_span_id IS NULL
            QUALIFY row_number() OVER (PARTITION BY trace_id ORDER BY start_ns) = 1
        ),
        chats AS (
            SELECT trace_id, input FROM picked WHERE operation = '{sc.OP_CHAT}'
            QUALIFY row_number() OVER (PARTITION BY trace_id ORDER BY start_ns) = 1
        )
        SELECT t.trace_id, u.input IS NOT NULL OR u.output IS NOT NULL, u.input, u.output,
               r.input, c.input
        FROM (SELECT unnest($ids) AS trace_id) t
        LEFT JOIN users u USING (trace_id) LEFT JOIN roots r USING (trace_id)
        LEFT JOIN chats c USING (trace_id)
        """,
        {"ids": ids},
    ).fetchall()
    out: dict[str, str] = {}
    for trace_id, has_user, u_in, u_out, root_input, chat_input in rows:
        text = _request((u_in, u_out) if has_user else None, root_input, chat_input)
        if text:
            out[trace_id] = text
    return out


# Rendering ------------------------------------------------------------------------------------
def _line(label: str, value: str, style: str = "") -> Text:
    text = Text("  ")
    text.append(f"{label}: ", style="dim")
    text.append(value.replace("\n", "\n    "), style=style)
    return text


def _chat_lines(step: Step, full: bool) -> list[Text]:
    """The LLM call as chat lines: what was new in its input (all of it with --full), then
    its reply."""
    given = chat_messages(step.input)
    if not full:
        last_reply = max(
            (i for i, m in enumerate(given) if m.get("role") == "assistant"), default=-1
        )
        given = given[last_reply + 1 :]
    replies = chat_messages(step.output, role="assistant")
    lines = [_message_line(m, full) for m in given]
    lines += [_message_line(m, full, reply=True) for m in replies]
    return lines


def _message_line(message: dict[str, Any], full: bool, *, reply: bool = False) -> Text:
    role = str(message.get("role") or "?")
    text = Text("  ")
    text.append("← " if reply else "→ ", style="dim")
    label = role if role != "tool" else f"tool {message.get('name') or ''}".strip()
    text.append(clean(label) + ": ", style="bold cyan" if reply else "cyan")
    parts = []
    if message.get("content"):
        parts.append(clip(str(message["content"]), full=full))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        name = clean(str(function.get("name") or "?"))
        parts.append(f"call {name}({clip(str(function.get('arguments') or ''), full=full)})")
    text.append(" | ".join(parts) if parts else "(empty)")
    return text


def _details(step: Step, full: bool) -> list[Text]:
    """The lines under a span's header: arguments and result or error, messages, memory."""
    op = step.operation
    lines: list[Text] = []
    if op == sc.OP_CHAT:
        lines += _chat_lines(step, full)
        system = step.attributes.get(sc.SYSTEM_INSTRUCTIONS)
        if full and system:
            lines.insert(0, _line("system", clip(str(system), full=True)))
    elif op == sc.OP_TOOL:
        if step.input is not None:
            lines.append(_line("args", clip(step.input, full=full)))
        if step.output is not None:
            lines.append(_line("result", clip(step.output, full=full)))
    elif op in (sc.OP_MEMORY_SEARCH, sc.OP_MEMORY_UPDATE, sc.OP_MEMORY_DELETE):
        where = step.memory_store or "?"
        if step.memory_record:
            where += f" / {step.memory_record}"
        lines.append(_line("memory", clean(where)))
        if step.input is not None:
            lines.append(_line("query", clip(step.input, full=full)))
        if step.memory_result_ids is not None:
            lines.append(_line("returned", clip(", ".join(step.memory_result_ids) or "nothing")))
        if step.output is not None:
            lines.append(_line("content", clip(step.output, full=full)))
    else:
        role = step.attributes.get(MESSAGE_ROLE)
        if role is not None:
            text = step.input if step.input is not None else step.output
            if text is not None:
                lines.append(_line(clean(str(role)), clip(text, full=full)))
        else:
            if step.input is not None:
                lines.append(_line("input", clip(step.input, full=full)))
            if step.output is not None:
                lines.append(_line("output", clip(step.output, full=full)))
        budget = _budget(step.attributes)
        if budget:
            lines.append(_line("budget", budget, "red" if "exceeded" in budget else ""))
    if step.error_message is not None or step.status == "ERROR":
        kind, message = short_type(step.error_type), step.error_message
        shown = ": ".join(x for x in (kind, message) if x) or "(no message)"
        lines.append(_line("error", clip(shown, LONG, full=full), "red"))
        if full and step.stacktrace:
            lines.append(_line("stack", clean(step.stacktrace, keep_newlines=True), "dim"))
    return lines


def _budget(attributes: dict[str, Any]) -> str:
    pairs = [
        ("steps", sc.USED_STEPS, sc.BUDGET_STEPS),
        ("tokens", sc.USED_TOKENS, sc.BUDGET_TOKENS),
        ("seconds", sc.USED_SECONDS, sc.BUDGET_SECONDS),
    ]
    parts = []
    for label, used, limit in pairs:
        if attributes.get(limit) is not None:
            parts.append(f"{label} {attributes.get(used, '?')}/{attributes[limit]}")
    if parts and attributes.get(sc.BUDGET_EXCEEDED):
        parts.append("exceeded")
    return clean(", ".join(parts))


def _header(step: Step, number: int | None) -> Text:
    text = Text()
    if number is not None:
        text.append(f"#{number} ", style="dim")
    text.append(clean(step.name), style="bold" if step.operation == sc.OP_TOOL else "")
    who = sc.tool_requester(step.operation, step.attributes)
    if who is not None:
        text.append(f"  run by the {clean(str(who))}", style="italic")
    if step.duration_ms is not None:
        text.append(f"  {step.duration_ms:.2f} ms", style="dim")
    if step.operation == sc.OP_CHAT and (step.input_tokens or step.output_tokens):
        used = [("?" if n is None else str(n)) for n in (step.input_tokens, step.output_tokens)]
        text.append(f"  {used[0]}→{used[1]} tokens", style="dim")
    if step.status == "ERROR":
        text.append("  ERROR", style="bold red")
        if step.error_type:
            text.append(f" {clean(short_type(step.error_type) or '')}", style="bold red")
    return text


def _verdict(outcome: dict[str, Any] | None) -> Text:
    if outcome is None:
        return Text("no outcome recorded", style="dim")
    success = outcome.get("success")
    text = Text(*{True: ("success", "green"), False: ("failure", "red")}.get(
        success, ("unknown", "yellow")))  # fmt: skip
    reward = outcome.get("reward")
    text.append(f", reward {'-' if reward is None else reward}, source ")
    text.append(clean(str(outcome.get("source") or "-")))
    if outcome.get("labels"):
        text.append(f", labels {clip(str(outcome['labels']), 200)}")
    return text


def _decisive_span(story: Story, finding: Finding) -> str | None:
    """The span a finding names: its first proving span, else the tool call or LLM call at
    its step index."""
    known = {s.span_id for s in story.steps}
    if finding.span_ids and finding.span_ids[0] in known:
        return finding.span_ids[0]
    if finding.step is None:
        return None
    at_step = [s for s in story.steps if s.step_index == finding.step]
    preferred = [s for s in at_step if s.operation in (sc.OP_TOOL, sc.OP_CHAT)]
    chosen = (preferred or at_step)[:1]
    return chosen[0].span_id if chosen else None


def decisive_step(story: Story, finding: Finding) -> DecisiveStep | None:
    """The decisive step a finding names, as every surface names it (store/steps.py: a tool
    call the model asked for names the model call, and is what carried it out)."""
    span_id = _decisive_span(story, finding)
    return describe(story.steps, span_id) if span_id is not None else None


def render_story(story: Story, *, full: bool = False) -> Tree:
    """The story as a tree: the run, its request and findings, then its spans in order."""
    head = Text()
    head.append(f"run {clean(story.run_id or story.trace_id)}", style="bold")
    # the trace id only where it is not the run's name already (as `traces` lists it)
    own = story.run_id and story.run_id != story.trace_id
    head.append(f" (trace {story.trace_id}): " if own else ": ")
    head.append_text(_verdict(story.outcome))
    facts = [clean(x) for x in (story.agent and f"agent {story.agent}",
                                 story.service and f"service {story.service}") if x]  # fmt: skip
    if story.start_time is not None:
        facts.append(str(story.start_time)[:19])
    if story.duration_ms is not None:
        facts.append(f"{story.duration_ms:.1f} ms")
    facts += [
        f"{n} {k[:-1] if n == 1 else k}" for k, n in story.counts.items() if n or k == "spans"
    ]
    if story.counts.get("LLM calls"):
        facts.append(f"cost {usd(story.cost)}")
    head.append("\n" + " · ".join(facts), style="dim")
    head.append("\nrequest: ", style="bold")
    head.append(clip(story.request, LONG, full=full) if story.request else "-")
    tree = Tree(head)

    marks: dict[str, list[Text]] = {}
    if story.analyzed_at is None:
        tree.add(Text("findings: no analysis yet (run `tracegym analyze`)", style="dim"))
    elif not story.findings:
        tree.add(Text(f"findings: the last analysis ({clean(story.analyzed_at)}) puts this run "
                      "in no gap", style="dim"))  # fmt: skip
    else:
        node = tree.add(Text(f"findings of the last analysis ({clean(story.analyzed_at)})",
                             style="bold"))  # fmt: skip
        for finding in story.findings:
            rank = f"gap {finding.rank}" if finding.rank is not None else "gap"
            decisive = decisive_step(story, finding)
            line = Text("◆ ", style="bold magenta")
            line.append(f"{rank} {clean(finding.gap_name)}", style="bold")
            if finding.detector:
                line.append(f" ({clean(finding.detector)})", style="dim")
            if decisive is not None:
                line.append(f" at step {clean(str(decisive))}")
            elif finding.step is not None:
                line.append(f" at step #{finding.step}")
            if finding.evidence:
                line.append(": " + clip(finding.evidence, LONG, full=full))
            node.add(line)
            if decisive is not None:
                mark = Text(f"  ◆ decisive step of {rank} {clean(finding.gap_name)}",
                            style="bold magenta")  # fmt: skip
                marks.setdefault(decisive.span_id, []).append(mark)
                for acted in decisive.acted:
                    marks.setdefault(acted.span_id, []).append(
                        Text(f"  ◆ carried out the decisive step of {rank}", style="magenta")
                    )
            for span_id in finding.span_ids[1:]:
                marks.setdefault(span_id, []).append(
                    Text(f"  · evidence for {rank}", style="magenta")
                )

    shown = story.steps if full else fold(story.steps, story.plumbing)
    if len(shown) < len(story.steps):
        folded = len(story.steps) - len(shown)
        tree.add(Text(f"{folded} framework span{'s' if folded != 1 else ''} folded (graph, "
                      "chain, prompt, turn): --full shows them", style="dim"))  # fmt: skip
    children: dict[str | None, list[Step]] = {}
    known = {s.span_id for s in shown}
    for step in shown:
        children.setdefault(step.parent_span_id if step.parent_span_id in known else None,
                            []).append(step)  # fmt: skip

    numbers = step_numbers(story.steps)

    def add(node: Tree, parent: str | None) -> None:
        for step in children.get(parent, []):
            label = _header(step, numbers.get(step.span_id))
            for mark in marks.get(step.span_id, []):
                label.append_text(mark)
            for detail in _details(step, full):
                label.append("\n")
                label.append_text(detail)
            add(node.add(label), step.span_id)

    add(tree, None)
    return tree
