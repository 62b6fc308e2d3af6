"""Failure attribution: for each failed run, the decisive step and the agent responsible.

No LLM: a short list of deterministic rules over the run's turns, tried in order; the first that
applies decides, and its `reason` names the evidence.

1. `off_task_plan`: in a team run, the opening turn states the task; when it shares under 30% of
   the question's content words, the run went off task right there.
2. `failed_execution`: the first code execution that failed (non-zero exit code, traceback) or
   the first failed call of a state-changing tool -> the turn that wrote the code or made the
   call. (A failed lookup is a guess the agent can correct, so it does not count.)
3. `finding`: the earliest detector finding (`tracegym.analysis.detectors`) with confidence
   >= `min_finding_confidence`, when findings are given (a finding on a tool result points at
   the turn that made the call). After the run's own hard evidence (1, 2), before the weaker
   heuristics: on AgentRx's development half, findings placed first cost a step hit.
4. `first_write`: the first call of a state-changing tool (its name does not start with a read
   verb such as get/find/list/search/calculate) -> the turn that made it.
5. `ungrounded_claim`: the first agent turn stating numbers that nothing before it holds: not
   the question, no earlier message, tool or execution output, not its own code, and not
   arithmetic on numbers seen before. An unverified (often invented) result.
6. `first_action`: the first substantive turn after the task statement (not an execution
   result, not the requesting user, not a system prompt).
7. `last_turn`: the run's last agent turn (nothing else to go on).

Each rule's `confidence` is its Laplace-smoothed hit rate, (hits + 1) / (fired + 2), on the
development halves of Who&When and AgentRx tau-retail (even file numbers / task ids; see
benchmarks/attribution_whowhen.py and benchmarks/attribution_agentrx.py). Measured and dropped:
"the turn that introduced the final answer's value" (after the rules above, 1 hit in 7 on the
development half: its good cases are the ungrounded claims) and "the first turn that asserts a
result with words like assume/sample/simulated" (42% where it fired, below the rules kept).

The gold labels importers attach (`Run.labels`, the `tracegym.label.*` span attributes) are never
read: `Turn`s are built from the steps' content, names, roles, tool calls and statuses only.

`step` is in the source's own indexing (`Step.step_index`, e.g. a Who&When `history` index or a
tau-bench `traj` index); runs without step indexes (natively traced) use `Step.position`.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracegym.analysis.runs import Run, Step, parse_json
from tracegym.tracer import semconv as sc

SOURCE_PREFIX = "tracegym.source."

# (hits + 1) / (fired + 2) on the development halves (see the module docstring); `finding`
# decisions carry the detector's own confidence.
CONFIDENCE = {
    "off_task_plan": 0.88,  # 6 of 6
    "failed_execution": 0.53,  # 18 of 34
    "first_write": 0.27,  # 2 of 9
    "ungrounded_claim": 0.82,  # 8 of 9
    "first_action": 0.29,  # 5 of 19
    "last_turn": 0.1,  # never fired
}
OFF_TASK_COVERAGE = 0.3  # below this share of the question's content words: off task
MIN_FINDING_CONFIDENCE = 0.7
_ARITHMETIC_WINDOW = 150  # derived numbers: arithmetic on the latest this many numbers seen

# AutoGen/AG2 code executors answer with "exitcode: N (execution ...)\nCode output: ..." or a
# notice that there was no code to run; other executors print tracebacks.
_EXEC_TEXT = re.compile(
    r"^\s*(exit\s*code:\s*-?\d+|there is no code from the last \d+ message|"
    r"traceback \(most recent call last\))",
    re.IGNORECASE,
)
_EXIT_CODE = re.compile(r"exit\s*code:\s*(-?\d+)", re.IGNORECASE)
_ERROR_TEXT = re.compile(
    r"traceback \(most recent call last\)|^\s*[A-Za-z_.]*(Error|Exception):|execution failed",
    re.IGNORECASE | re.MULTILINE,
)
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_TERMINATION = re.compile(r"\bTERMINATE\b|###STOP###|<\|?end\|?>", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?(?![\w])")
_LIST_MARKER = re.compile(r"^\s*\(?\d{1,2}[.)]\s", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]+")
_STOPWORD_TEXT = """
    a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing down during each few
    for from further had has have having he her here hers him his how i if in into is it its
    itself just me more most my no nor not now of off on once only or other our ours out over
    own please same she should so some such than that the their theirs them then there these
    they this those through to too under until up very was we were what when where which while
    who whom why will with would you your yours give provide return answer question task
    solve problem carefully find given using use one two first"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


@dataclass(frozen=True)
class Attribution:
    """The decisive step of a failed run and the agent responsible for it."""

    run: str  # the source's own run id (a task-trial, a question id, a file stem, a run id)
    trace_id: str
    agent: str | None
    step: int | None  # in the source's own indexing (Step.step_index), else Step.position
    reason: str
    confidence: float
    rule: str = ""  # the rule that decided (not part of the JSON line)
    position: int | None = None  # the decisive step's Step.position (not part of the JSON line)

    def to_dict(self) -> dict[str, Any]:
        """The stable output contract: exactly these six keys."""
        return {
            "run": self.run,
            "trace_id": self.trace_id,
            "agent": self.agent,
            "step": self.step,
            "reason": self.reason,
            "confidence": self.confidence,
        }


def to_json_line(attribution: Attribution) -> str:
    """One JSON line `{"run", "trace_id", "agent", "step", "reason", "confidence"}`."""
    return json.dumps(attribution.to_dict(), ensure_ascii=False, separators=(", ", ": "))


# Turns: what attribution reads of a run --------------------------------------------------------


@dataclass
class Turn:
    """One step of the source (one message, action or tool result), as attribution sees it."""

    index: int  # order among the run's turns
    step: int  # the source's own index
    position: int  # Step.position of its first span
    agent: str | None  # the speaker (an agent name, or the role in single-agent runs)
    role: str | None
    text: str  # everything it says, code and tool calls included
    prose: str  # the text without fenced code blocks
    writes_code: bool = False  # holds a fenced code block or calls tools
    call_ids: tuple[str, ...] = ()
    tool_result: bool = False  # an execute_tool span (the result of a call)
    execution: bool = False  # reports the result of running code or a tool
    failed: bool = False  # that execution failed
    call_id: str | None = None  # for tool results: the call it answers
    spans: list[Step] = field(default_factory=list)


def _chat_text(step: Step) -> tuple[str, tuple[str, ...]]:
    """Text and tool-call ids of a chat span's output messages."""
    messages = parse_json(step.attributes.get(sc.OUTPUT_MESSAGES) or step.output)
    if not isinstance(messages, list):
        return (step.output or "", ())
    parts: list[str] = []
    ids: list[str] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p.get("text", "") for p in content if isinstance(p, Mapping)]
        for call in message.get("tool_calls") or []:
            if not isinstance(call, Mapping):
                continue
            function = call.get("function") if isinstance(call.get("function"), Mapping) else call
            parts.append(f"{function.get('name')}({function.get('arguments') or ''})")
            if call.get("id") is not None:
                ids.append(str(call["id"]))
    return "\n".join(p for p in parts if p), tuple(ids)


def _span_text(step: Step) -> tuple[str, tuple[str, ...]]:
    if step.operation == sc.OP_CHAT:
        return _chat_text(step)
    if step.operation == sc.OP_TOOL:
        return (step.output or "", ())
    return (step.output or step.input or "", ())


def _turn_groups(run: Run) -> list[tuple[int, list[Step]]]:
    """(source index, spans) per step of the source, in order; the root span is left out."""
    steps = [s for s in run.steps if s.parent_span_id is not None or len(run.steps) == 1]
    indexed = [s for s in steps if s.step_index is not None]
    if not indexed:
        return [(s.position, [s]) for s in steps]
    groups: dict[int, list[Step]] = {}
    for step in indexed:
        groups.setdefault(step.step_index, []).append(step)  # type: ignore[arg-type]
    return sorted(groups.items())


def build_turns(run: Run) -> list[Turn]:
    """The run's turns. Reads content, names, roles, tool calls and statuses; never labels."""
    groups = _turn_groups(run)
    names = {s.agent for _, spans in groups for s in spans if s.agent}
    roles = {s.role for _, spans in groups for s in spans if s.role}
    by_role = len(names) <= 1 and bool(roles)  # one agent talking to a user and tools
    turns: list[Turn] = []
    for index, (number, spans) in enumerate(groups):
        first = spans[0]
        texts, ids = [], []
        tool_result, failed, call_id = False, False, None
        for span in spans:
            text, calls = _span_text(span)
            texts.append(text)
            ids += calls
            if span.operation == sc.OP_TOOL:
                tool_result = True
                failed = failed or span.failed
                call_id = call_id or span.call_id
        text = "\n".join(t for t in texts if t)
        role = first.role
        agent = (role if role != "tool" else "assistant") if by_role else first.agent
        turns.append(
            Turn(
                index=index,
                step=number,
                position=first.position,
                agent=agent,
                role=role,
                text=text,
                prose=_FENCE.sub(" ", text),
                writes_code=bool(ids) or "```" in text,
                call_ids=tuple(ids),
                tool_result=tool_result,
                execution=tool_result,
                failed=failed,
                call_id=call_id,
                spans=spans,
            )
        )
    _mark_executions(turns)
    return turns


def _mark_executions(turns: list[Turn]) -> None:
    """Flag turns that report code execution: tool results, executor-style messages, and every
    turn of an agent that mostly speaks that way (a code executor such as `Computer_terminal`)."""
    looks = {t.index: bool(_EXEC_TEXT.search(t.text)) for t in turns}
    spoken: Counter[str] = Counter()
    executed: Counter[str] = Counter()
    for turn in turns:
        if turn.agent and not turn.tool_result and _TERMINATION.sub("", turn.text).strip():
            spoken[turn.agent] += 1
            executed[turn.agent] += looks[turn.index]
    executors = {a for a, n in spoken.items() if executed[a] >= max(1, 0.8 * n)}
    for turn in turns:
        if turn.tool_result:
            continue
        if looks[turn.index] or (turn.agent in executors and len(executors) < len(spoken)):
            turn.execution = True
            turn.writes_code = False
            code = _EXIT_CODE.search(turn.text)
            turn.failed = (code is not None and code.group(1) not in ("0", "-0")) or bool(
                _ERROR_TEXT.search(turn.text)
            )


_READ_VERBS = re.compile(
    r"^(get|find|list|search|lookup|look|read|fetch|query|retrieve|check|calculate|compute|"
    r"think|view|show|describe|count|validate|verify|load|open|browse|inspect|scroll|download)"
    r"([_.\-\s]|[A-Z]|$)"
)


def _tool(turn: Turn) -> str:
    return next((s.tool for s in turn.spans if s.tool), "tool")


def _writes_state(turn: Turn) -> bool:
    """A tool call that may change the world: its name does not start with a read verb."""
    return turn.tool_result and not _READ_VERBS.match(_tool(turn))


def _author(turns: Sequence[Turn], turn: Turn) -> Turn | None:
    """The turn whose code or tool call produced `turn` (an execution result): the one that
    made the call (by call id), else the turn of the span it ran under, else the latest turn
    that wrote code (for a tool result: the latest agent turn)."""
    earlier = [t for t in reversed(turns[: turn.index]) if not t.execution]
    if turn.call_id:
        for candidate in earlier:
            if turn.call_id in candidate.call_ids:
                return candidate
    parents = {s.parent_span_id for s in turn.spans}
    for candidate in earlier:
        if any(s.span_id in parents for s in candidate.spans):
            return candidate
    for candidate in earlier:
        if candidate.writes_code:
            return candidate
    if turn.tool_result:
        return next((t for t in earlier if t.role not in ("user", "system")), None)
    return None


# Text helpers ----------------------------------------------------------------------------------


def _content_words(text: str) -> set[str]:
    return {w.lower().strip("'’-") for w in _WORD.findall(text)} - _STOPWORDS


def _normal_number(text: str) -> str | None:
    raw = text.replace(",", "").replace("−", "-")
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(value)


def _numbers(text: str) -> set[str]:
    """The numbers a text states, normalised ("1,000.0" -> "1000"); single digits, list
    markers and code are left out (too common to trace)."""
    prose = _LIST_MARKER.sub(" ", _FENCE.sub(" ", text))
    found = (_normal_number(n) for n in _NUMBER.findall(prose))
    return {n for n in found if n is not None and len(n.lstrip("-")) > 1}


def _all_numbers(text: str) -> set[str]:
    """Every number in a text, code and single digits included (what counts as seen)."""
    found = (_normal_number(n) for n in _NUMBER.findall(text))
    return {n for n in found if n is not None} | set(re.findall(r"\d+", text))


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _squash(text: str) -> str:
    return " ".join(text.split())


def _excerpt(text: str, limit: int = 90) -> str:
    text = _squash(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Rules -----------------------------------------------------------------------------------------


@dataclass
class _Context:
    run: Run
    turns: list[Turn]
    question: str
    task_turn: Turn | None  # the opening turn that restates the question
    requester_role: str | None  # "user" where the run is one agent serving a user

    def requester(self, turn: Turn) -> bool:
        return self.requester_role is not None and turn.role == self.requester_role

    def substantive(self) -> list[Turn]:
        """Turns after the task statement that an agent said or did (not results, not the
        requesting user, not system prompts)."""
        start = self.task_turn.index + 1 if self.task_turn is not None else 0
        return [
            t
            for t in self.turns[start:]
            if not t.execution
            and not self.requester(t)
            and t.role != "system"
            and _TERMINATION.sub("", t.text).strip()
        ]


@dataclass
class _Decision:
    turn: Turn
    rule: str
    reason: str
    confidence: float


def _context(run: Run) -> _Context:
    turns = build_turns(run)
    root = run.root
    question = (root.input if root is not None else None) or ""
    names = {t.agent for t in turns if t.agent and not t.execution}
    requester = "user" if names and names <= {"assistant", "user", "system"} else None
    opening = next((t for t in turns if t.role != "system" and not t.execution), None)
    task_turn = None
    if opening is not None and (requester is None or opening.role != requester):
        # In a team without a separate requester the opening turn states the task; elsewhere
        # only a turn that restates the question does.
        head = _squash(question)[:200]
        if requester is None or (head and head in _squash(opening.text)):
            task_turn = opening
    return _Context(run, turns, question, task_turn, requester)


def _rule_off_task(ctx: _Context) -> _Decision | None:
    turn = ctx.task_turn
    if turn is None:
        return None
    asked = _content_words(ctx.question)
    stated = _content_words(turn.prose)
    if len(asked) < 4 or len(stated) < 20:
        return None
    coverage = len(asked & stated) / len(asked)
    if coverage >= OFF_TASK_COVERAGE:
        return None
    reason = (
        f"{turn.agent}'s opening task statement at step {turn.step} does not address the "
        f"question: it shares only {coverage:.0%} of the question's key words "
        f"({_excerpt(turn.prose, 80)!r})"
    )
    return _Decision(turn, "off_task_plan", reason, CONFIDENCE["off_task_plan"])


def _rule_failed_execution(ctx: _Context) -> _Decision | None:
    for turn in ctx.turns:
        if not (turn.execution and turn.failed):
            continue
        if turn.tool_result and not _writes_state(turn):
            continue  # a failed lookup is a guess the agent can correct, not yet a mistake
        author = _author(ctx.turns, turn)
        if author is None or ctx.requester(author):
            continue
        what = f"{_tool(turn)} call" if turn.tool_result else "code"
        reason = (
            f"the first failed execution is at step {turn.step} "
            f"({_excerpt(turn.text, 80)!r}); the {what} came from {author.agent} at step "
            f"{author.step}"
        )
        return _Decision(author, "failed_execution", reason, CONFIDENCE["failed_execution"])
    return None


def _derived(value: str, known: Sequence[float]) -> bool:
    """Whether `value` is the sum, difference, product or ratio of two known numbers (rounded
    to the value's own decimals): arithmetic on grounded numbers is grounded."""
    try:
        target = float(value)
    except ValueError:
        return False
    decimals = len(value.split(".")[1]) if "." in value else 0
    tolerance = 0.5 * 10**-decimals + 1e-9
    for i, a in enumerate(known):
        for b in known[i:]:
            for result in (
                a + b,
                abs(a - b),
                a * b,
                a / b if b else math.inf,
                b / a if a else math.inf,
            ):
                if abs(result - target) <= tolerance:
                    return True
    return False


def _rule_ungrounded_claim(ctx: _Context) -> _Decision | None:
    """The first agent turn stating numbers that nothing before it holds (not the question, not
    an earlier message or tool or execution output, not its own code, not arithmetic on those)."""
    seen: dict[str, None] = dict.fromkeys(sorted(_all_numbers(ctx.question)))  # in seen order
    for turn in ctx.turns:
        claimant = not (
            turn.execution or ctx.requester(turn) or turn.role == "system" or turn is ctx.task_turn
        )
        if claimant:
            code = " ".join(_FENCE.findall(turn.text))
            fresh = sorted(_numbers(turn.prose) - seen.keys() - _all_numbers(code))
            if fresh:
                recent = [float(n) for n in list(seen)[-_ARITHMETIC_WINDOW:] if _is_float(n)]
                fresh = [n for n in fresh if not _derived(n, recent)]
            if fresh:
                shown = ", ".join(fresh[:4]) + (" ..." if len(fresh) > 4 else "")
                reason = (
                    f"{turn.agent} states {shown} at step {turn.step}, which no earlier step "
                    "(question, message, tool or execution output) holds and its own code does "
                    "not compute: an unverified claim"
                )
                return _Decision(turn, "ungrounded_claim", reason, CONFIDENCE["ungrounded_claim"])
        for number in sorted(_all_numbers(turn.text)):
            seen.pop(number, None)
            seen[number] = None
    return None


def _rule_first_write(ctx: _Context) -> _Decision | None:
    """The first call of a tool that changes state (by its name: not get/find/list/search...)."""
    for turn in ctx.turns:
        if turn.tool_result and _writes_state(turn):
            author = _author(ctx.turns, turn) or turn
            reason = (
                f"the first state-changing action is {author.agent}'s {_tool(turn)} call at step "
                f"{author.step}: the run's outcome is settled by what it changed"
            )
            return _Decision(author, "first_write", reason, CONFIDENCE["first_write"])
    return None


def _rule_first_action(ctx: _Context) -> _Decision | None:
    turns = ctx.substantive()
    if not turns:
        return None
    turn = turns[0]
    opening = "the task statement" if ctx.task_turn is not None else "the start"
    reason = (
        f"no error or answer trace to follow; the first substantive step after {opening} is "
        f"{turn.agent}'s at step {turn.step} ({_excerpt(turn.prose, 70)!r})"
    )
    return _Decision(turn, "first_action", reason, CONFIDENCE["first_action"])


def _rule_last_turn(ctx: _Context) -> _Decision | None:
    for turn in reversed(ctx.turns):
        if not turn.execution and not ctx.requester(turn):
            reason = f"nothing else to go on: the run's last agent step is {turn.agent}'s"
            return _Decision(turn, "last_turn", reason, CONFIDENCE["last_turn"])
    return None


FINDINGS = "finding"  # where detector findings sit among the rules

RULES: tuple[Any, ...] = (
    _rule_off_task,
    _rule_failed_execution,
    FINDINGS,
    _rule_first_write,
    _rule_ungrounded_claim,
    _rule_first_action,
)


def _finding_decision(
    ctx: _Context, findings: Iterable[Any], min_confidence: float
) -> _Decision | None:
    """The earliest confident finding, mapped onto its turn."""
    by_step = {t.step: t for t in ctx.turns}
    by_position = {s.position: t for t in ctx.turns for s in t.spans}
    best: tuple[tuple[int, float], Turn, Any] | None = None
    for finding in findings:
        confidence = float(getattr(finding, "confidence", 0.0) or 0.0)
        if confidence < min_confidence:
            continue
        turn = None
        if getattr(finding, "position", None) is not None:
            turn = by_position.get(finding.position)
        if turn is None and getattr(finding, "step_index", None) is not None:
            turn = by_step.get(finding.step_index)
        if turn is None:
            continue
        if turn.execution:  # a failed tool call is its caller's doing
            turn = _author(ctx.turns, turn) or turn
        key = (turn.index, -confidence)
        if best is None or key < best[0]:
            best = (key, turn, finding)
    if best is None:
        return None
    _, turn, finding = best
    reason = f"{getattr(finding, 'detector', 'detector')}: {getattr(finding, 'message', '')}"
    return _Decision(turn, "finding", reason.strip(), round(float(finding.confidence), 3))


# Public API -------------------------------------------------------------------------------------


def source_run_id(run: Run) -> str:
    """The source's own id of a run: a file stem, instance id, task-trial or question id that
    the importer recorded, else the run id (its middle part for `format/id/hash` import ids),
    else the trace id."""
    root = run.root
    attrs = root.attributes if root is not None else {}

    def source(name: str) -> Any:
        value = attrs.get(SOURCE_PREFIX + name)
        return None if value is None or value == "" else value

    for name in ("file", "instance_id", "simulation_id"):
        if source(name) is not None:
            return str(source(name))
    if source("task_id") is not None:
        trial = source("trial")
        return f"{source('task_id')}-{trial}" if trial is not None else str(source("task_id"))
    if source("question_id") is not None:
        return str(source("question_id"))
    if run.run_id:
        parts = run.run_id.split("/")
        if len(parts) == 3 and parts[0] == attrs.get(SOURCE_PREFIX + "format") and parts[1]:
            return parts[1]
        return run.run_id
    return run.trace_id


def attribute(
    run: Run,
    findings: Iterable[Any] = (),
    *,
    min_finding_confidence: float = MIN_FINDING_CONFIDENCE,
) -> Attribution:
    """The decisive step and responsible agent of `run` (meant for failed runs).

    `findings` are detector findings for this run (optional); the earliest with confidence >=
    `min_finding_confidence` takes its place among the rules (see the module docstring).
    Deterministic; never reads `run.labels` or `tracegym.label.*` attributes.
    """
    ctx = _context(run)
    run_id = source_run_id(run)
    findings = list(findings)
    decision = None
    for rule in RULES:
        if rule == FINDINGS:
            decision = _finding_decision(ctx, findings, min_finding_confidence)
        else:
            decision = rule(ctx)
        if decision is not None:
            break
    if decision is None:
        decision = _rule_last_turn(ctx)
    if decision is None:
        return Attribution(run_id, run.trace_id, None, None, "the run has no steps", 0.0, "none")
    turn = decision.turn
    return Attribution(
        run=run_id,
        trace_id=run.trace_id,
        agent=turn.agent,
        step=turn.step,
        reason=decision.reason,
        confidence=decision.confidence,
        rule=decision.rule,
        position=turn.position,
    )


def attribute_runs(
    runs: Iterable[Run],
    findings_by_trace: Mapping[str, Sequence[Any]] | None = None,
    **options: Any,
) -> list[Attribution]:
    """`attribute` for every failed run (`run.success is False`), in the given order."""
    findings_by_trace = findings_by_trace or {}
    return [
        attribute(run, findings_by_trace.get(run.trace_id, ()), **options)
        for run in runs
        if run.failed
    ]
