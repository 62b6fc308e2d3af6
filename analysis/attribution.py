"""Failure attribution: for each failed run, the decisive step and the agent responsible.

No LLM: a short list of deterministic rules over the run's turns, tried in order; the first that
applies decides, and its `reason` names the evidence (a failed execution is quoted by its error
line, e.g. the exception that ends a traceback).

What recurs in every run of a system is not evidence about one run. `attribute_runs` learns a
`SystemProfile` per system (same import format and root agent) from all the runs it is given,
successful ones included, never their labels: the lines found in at least half of the runs
(banners, the prompt template, pasted warnings with version numbers, command-format blocks) are
boilerplate, left out of what the rules read; a turn that is mostly boilerplate and says nothing
new is a logged prompt `template` (MetaGPT's "# Past Experience ... # Current Plan ..." turns);
and an agent that opens at least 80% of the runs of a team whose agents keep their names (MetaGPT's
`Team Leader`) is the system's orchestrator. `attribute(run)` alone has no profile unless given
one (`learn_profile` / `learn_profiles`).

1. `off_task_plan`: in a team run, the opening turn states the task; when it shares under 30% of
   the question's content words (boilerplate lines left out), the run went off task right there.
2. `failed_execution`: the first code execution that failed (non-zero exit code, traceback) or
   the first failed call of a state-changing tool -> the turn that wrote the code or made the
   call. (A failed lookup is a guess the agent can correct, so it does not count.) When the run
   carries on past the failure and a later turn states a number nothing grounds (rule 5), that
   claim decides instead: what the run made up in place of the result is where it went wrong.
3. `finding`: the earliest detector finding (`tracegym.analysis.detectors`) with confidence
   >= `min_finding_confidence` (0.5: the detector holds its step at least as likely decisive
   as not), when findings are given (a finding on a tool result points at the turn that made
   the call). After the run's own hard evidence (1, 2), before the weaker heuristics; but a
   finding on an earlier turn than the one rule 1 or 2 picked decides instead: the run went
   wrong there first (a poisoned memory read before a transient tool error, a made-up amount
   before a failing receipt call). Findings on a failed lookup are not used so: rule 2 already
   passed over that failure (on AgentRx's tuning half, `invalid_invocation` on a "user not
   found" lookup placed first cost a step hit).
4. `first_write`: the first call of a state-changing tool (its name does not start with a read
   verb such as get/find/list/search/calculate) -> the turn that made it.
5. `ungrounded_claim`: the first agent turn stating numbers that nothing before it holds: not
   the question, no earlier message, tool or execution output, not its own code, and not
   arithmetic on numbers seen before; boilerplate lines and prompt templates state nothing.
   An unverified (often invented) result.
6. `handover`: in a system with an orchestrator, the work starts with the first agent it hands
   the task to: the decisive step is that agent's first step. Where the first turn went wrong is
   where the artefact the run depends on (the PRD, the design, the code) was first produced, not
   where a later test visibly broke; nothing in the text tells which of the worker's steps it
   was, and its first is the most frequent (27 of 65 on AgenTracer's tuning half).
7. `first_action`: the first substantive turn after the task statement (not an execution
   result, not the requesting user, not a system prompt, not a prompt template) that does or
   states something: a turn without code whose sentences mostly announce what will be done
   ("I will retrieve the article", "let's proceed step by step") is a plan, passed over.
8. `last_turn`: the run's last agent turn (nothing else to go on).

Where the system logs the prompt an agent was given as a turn of its own just before the agent's
reply (a `template` turn of the same agent), rules 6-7 report the step at the template: the
prompt and the reply are one action, and it starts at the prompt (where a faulty instruction
enters). The notes an agent writes to its memory once the conversation is over (the trailing
`update_memory` spans of a run) are written after the run and are never the decisive step.

Each rule's `confidence` is its Laplace-smoothed step hit rate, (hits + 1) / (fired + 2), on the
tuning splits only: Who&When Algorithm-Generated even files, AgentRx tau-retail even task ids
and the AgenTracer TracerTraj-code half whose sha256(question_ID) is even (see
benchmarks/diagnosis_generalization.py, which also reports the untuned splits). Measured and
dropped: "the turn that introduced the final answer's value" (after the rules above, 1 hit in 7
on Who&When's tuning half: its good cases are the ungrounded claims), "the first turn that
asserts a result with words like assume/sample/simulated" (42% where it fired, below the rules
kept), "the turn before the first code written into a file" for MetaGPT (26 of 65, below
`handover`'s 27), "the first turn that interprets an execution's output" as Who&When's
fallback (4 hits against `first_action`'s 5 on the even files), the run's end at a turn
ending in TERMINATE (Who&When's group chats go on after such turns; 10 gold steps lie there),
"skip failed executions the run later recovers from" (55.6 -> 44.4 step on the even files), and
"a failed execution that still printed its results (8+ lines besides the traceback) is not a
failure" (+1 run on the even files, -1 on the odd: 34.9 -> 33.3).

The gold labels importers attach (`Run.labels`, the `tracegym.label.*` span attributes) are never
read, nor are run ids or file names: `Turn`s are built from the steps' content, names, roles,
tool calls and statuses only.

`step` is in the source's own indexing (`Step.step_index`, e.g. a Who&When `history` index, a
tau-bench `traj` index, the tracer's step index); runs without step indexes use their place in
run order. Both are the numbering `tracegym show` prints (`#N`, store/steps.py), and a tool
call the model asked for is blamed on the model call: `show` and the dashboard name that step
as the decisive one and the tool call as what carried it out.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracegym.analysis.arithmetic import decimals_of, derived, parse_number
from tracegym.analysis.features import is_user_side
from tracegym.analysis.runs import Run, Step, parse_json
from tracegym.store.steps import step_numbers
from tracegym.tracer import semconv as sc
from tracegym.tracer.messages import chat_messages

SOURCE_PREFIX = "tracegym.source."

# (hits + 1) / (fired + 2), step hits where the rule decided on the tuning splits (Who&When even
# files, AgentRx even task ids, AgenTracer's hash-even half; see the module docstring); `finding`
# decisions carry the detector's own confidence.
CONFIDENCE = {
    "off_task_plan": 0.88,  # 6 of 6 (Who&When)
    "failed_execution": 0.55,  # 17 of 31 (Who&When 15 of 27, AgentRx 2 of 4)
    "first_write": 0.27,  # 2 of 9 (AgentRx)
    "ungrounded_claim": 0.73,  # 10 of 13 (Who&When 10 of 12, AgenTracer 0 of 1)
    "handover": 0.43,  # 27 of 63 (AgenTracer)
    "first_action": 0.41,  # 8 of 20 (Who&When 7 of 18, AgenTracer 1 of 1, AgentRx 0 of 1)
    "last_turn": 0.1,  # never fired: a floor, not a measurement
}
OFF_TASK_COVERAGE = 0.3  # below this share of the question's content words: off task
PLAN_SHARE = 0.5  # a turn without code whose sentences at least this often announce: a plan
# A finding decides from this confidence on: 0.7 left out the 0.5-0.6 findings (ungrounded
# record picks, requests never served, tool overuse) that are right on the tuning splits
# (planted seeds 0-9: 82.0 -> 97.7 step; AgentRx even task ids 28.6 -> 35.7; docs/attribution.md).
MIN_FINDING_CONFIDENCE = 0.5
# System profiles (learnt from the runs of one system, see SystemProfile):
MIN_PROFILE_RUNS = 4  # fewer runs than this: no boilerplate, no orchestrator
BOILERPLATE_SHARE = 0.5  # a line in at least this share of the system's runs is boilerplate
ORCHESTRATOR_SHARE = 0.8  # the same agent opens at least this share of the runs
TEMPLATE_BOILERPLATE = 0.5  # a turn this much boilerplate (by characters) ...
TEMPLATE_NEW = 0.5  # ... whose other text is less than this share new is a prompt template
_SHINGLE = 4  # words per shingle when telling new text from repeated text
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
# A fenced block opens and closes on lines of its own (``` inside a JSON string is not a fence).
_FENCE = re.compile(r"^[ \t]*```[^\n]*(?:\n.*?^[ \t]*```[ \t]*$|.*\Z)", re.DOTALL | re.MULTILINE)
_TERMINATION = re.compile(r"\bTERMINATE\b|###STOP###|<\|?end\|?>", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?(?![\w])")
_LIST_MARKER = re.compile(r"^\s*\(?\d{1,2}[.)]\s", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]+")
_TOKEN = re.compile(r"[a-z_][a-z0-9_]*|\d+|[^\sa-z0-9_]")
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
# A sentence that announces what will be done rather than stating or doing it.
_INTENT = re.compile(
    r"\b(?:i will|i['’]ll|we will|we['’]ll|let['’]s|let us|we need to|we should|we must|"
    r"i need to|i am going to|we are going to|next,? we|first,? we|please)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"(?<=[.!?:])\s+|\n+")
_HEADING = re.compile(r"^\s*(?:#+|\*\*|\d+[.)]|[-*])")


@dataclass(frozen=True)
class Attribution:
    """The decisive step of a failed run and the agent responsible for it."""

    run: str  # the source's own run id (a task-trial, a question id, a file stem, a run id)
    trace_id: str
    agent: str | None
    step: int | None  # show's `#N` (store/steps.py): Step.step_index, else the run-order place
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
    evidence: str = ""  # the prose without the system's boilerplate lines (what rules read)
    boilerplate: float = 0.0  # share of the turn's characters on the system's boilerplate lines
    template: bool = False  # mostly boilerplate and says nothing new: a logged prompt template
    after_end: bool = False  # written after the run ended (a closing note): never decisive


def _chat_text(step: Step) -> tuple[str, tuple[str, ...]]:
    """Text and tool-call ids of a chat span's output messages."""
    raw = step.attributes.get(sc.OUTPUT_MESSAGES) or step.output
    if not isinstance(parse_json(raw), (list, dict)):
        return (step.output or "", ())
    messages = chat_messages(raw, "assistant")  # either shape, GenAI or the older one
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
    """(step number, spans) per step of the source, in order; the root span is left out. The
    numbers are `show`'s (store/steps.py): the source's index, else the place in run order."""
    steps = [s for s in run.steps if s.parent_span_id is not None or len(run.steps) == 1]
    indexed = [s for s in steps if s.step_index is not None]
    if not indexed:
        numbers = step_numbers(run.steps)
        return [(numbers.get(s.span_id, s.position), [s]) for s in steps]
    groups: dict[int, list[Step]] = {}
    for step in indexed:
        groups.setdefault(step.step_index, []).append(step)  # type: ignore[arg-type]
    return sorted(groups.items())


# What recurs across the runs of one system --------------------------------------------------


@dataclass(frozen=True)
class SystemProfile:
    """What the runs of one system share, learnt from their text (never from labels or ids).

    `boilerplate`: normalised lines (see `_line_key`) found in at least `BOILERPLATE_SHARE` of
    the system's runs: banners, prompt templates, pasted warnings, command-format blocks. They
    say nothing about one run, so no rule reads them as evidence.
    `orchestrator`: the agent that opens at least `ORCHESTRATOR_SHARE` of the runs, in teams
    whose agents keep their names across runs (MetaGPT's `Team Leader`); its turns hand the task
    over, and the work starts with the first agent it hands over to.
    """

    runs: int = 0
    boilerplate: frozenset[str] = frozenset()
    orchestrator: str | None = None

    def is_boilerplate(self, line: str) -> bool:
        return bool(self.boilerplate) and _line_key(line) in self.boilerplate


EMPTY_PROFILE = SystemProfile()


_VOLATILE = re.compile(
    r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?|\b0x[0-9a-f]+\b", re.IGNORECASE
)


def _line_key(line: str) -> str:
    """A line as boilerplate is counted: whitespace squashed, lower case, timestamps and memory
    addresses blanked (they change from run to run where the banner does not). Other numbers
    stay: a reply that differs from another only by its amounts says something of its own."""
    return _VOLATILE.sub("#", " ".join(line.split()).lower())


def system_key(run: Run) -> tuple[str, str]:
    """Runs of the same system: the same import format (or outcome source) and root agent."""
    root = run.root
    fmt = root.attributes.get(SOURCE_PREFIX + "format") if root is not None else None
    return (str(fmt or run.source or ""), str(run.agent or (root.agent if root else "") or ""))


def _opening_agent(run: Run) -> str | None:
    for _, spans in _turn_groups(run):
        agent = spans[0].agent
        if agent:
            return agent
    return None


def learn_profile(runs: Sequence[Run]) -> SystemProfile:
    """The profile of one system from its runs (successful ones too; outcomes are not read)."""
    runs = list(runs)
    if len(runs) < MIN_PROFILE_RUNS:
        return SystemProfile(runs=len(runs))
    frequency: Counter[str] = Counter()
    openers: Counter[str] = Counter()
    agents_per_run: list[set[str]] = []
    for run in runs:
        keys: set[str] = set()
        names: set[str] = set()
        for _, spans in _turn_groups(run):
            for span in spans:
                text, _ = _span_text(span)
                keys.update(_line_key(line) for line in text.splitlines() if line.strip())
                if span.agent:
                    names.add(span.agent)
        frequency.update(keys)
        agents_per_run.append(names)
        opener = _opening_agent(run)
        if opener:
            openers[opener] += 1
    need = BOILERPLATE_SHARE * len(runs)
    boilerplate = frozenset(k for k, n in frequency.items() if n >= need)
    orchestrator = None
    if openers:
        name, count = openers.most_common(1)[0]
        # a team (the opener is not alone in most runs) whose opener is the same agent
        teamed = sum(1 for names in agents_per_run if name in names and len(names) > 1)
        if count >= ORCHESTRATOR_SHARE * len(runs) and teamed >= ORCHESTRATOR_SHARE * len(runs):
            orchestrator = name
    return SystemProfile(runs=len(runs), boilerplate=boilerplate, orchestrator=orchestrator)


def learn_profiles(runs: Iterable[Run]) -> dict[tuple[str, str], SystemProfile]:
    """A profile per system (`system_key`) among `runs`."""
    by_system: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        by_system.setdefault(system_key(run), []).append(run)
    return {key: learn_profile(members) for key, members in by_system.items()}


def _shingles(text: str) -> set[tuple[str, ...]]:
    tokens = _TOKEN.findall(text.lower())
    width = _SHINGLE
    return {tuple(tokens[i : i + width]) for i in range(max(0, len(tokens) - width + 1))}


def _mark_boilerplate(turns: list[Turn], profile: SystemProfile, question: str) -> None:
    """Set each turn's evidence, boilerplate share and template flag."""
    seen = _shingles(question)
    for turn in turns:
        lines = [line for line in turn.text.splitlines() if line.strip()]
        total = sum(len(line) for line in lines)
        common = sum(len(line) for line in lines if profile.is_boilerplate(line))
        turn.boilerplate = common / total if total else 0.0
        kept = [line for line in turn.prose.splitlines() if not profile.is_boilerplate(line)]
        turn.evidence = "\n".join(kept)
        body = "\n".join(line for line in lines if not profile.is_boilerplate(line))
        shingles = _shingles(body)
        new = len(shingles - seen) / len(shingles) if shingles else 0.0
        seen |= shingles
        turn.template = (
            turn.boilerplate >= TEMPLATE_BOILERPLATE
            and new < TEMPLATE_NEW
            and not turn.tool_result
            and not turn.call_ids
        )


_NOTE_OPERATIONS = frozenset({sc.OP_MEMORY_UPDATE, sc.OP_MEMORY_DELETE})


def _mark_end(turns: list[Turn]) -> None:
    """The notes an agent writes to its memory once the conversation is over (the trailing
    memory writes of a run) are written after the run: flagged, and no rule picks them."""
    for turn in reversed(turns):
        if not turn.spans or not all(s.operation in _NOTE_OPERATIONS for s in turn.spans):
            break
        turn.after_end = True


def build_turns(run: Run, profile: SystemProfile | None = None) -> list[Turn]:
    """The run's turns. Reads content, names, roles, tool calls and statuses; never labels.

    With a `profile` of the run's system, the system's boilerplate lines are left out of each
    turn's `evidence` and turns that are mostly boilerplate with nothing new are `template`s.
    """
    profile = profile or EMPTY_PROFILE
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
                writes_code=bool(ids) or bool(_FENCE.search(text)),
                call_ids=tuple(ids),
                tool_result=tool_result,
                execution=tool_result,
                failed=failed,
                call_id=call_id,
                spans=spans,
            )
        )
    _mark_executions(turns)
    root = run.root
    _mark_boilerplate(turns, profile, (root.input if root is not None else None) or "")
    _mark_end(turns)
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
    """A tool call of the agent's that may change the world: its name does not start with a
    read verb, and the user did not run it on their own side (tau2-bench's phone tools)."""
    return (
        turn.tool_result
        and not _READ_VERBS.match(_tool(turn))
        and not any(is_user_side(s) for s in turn.spans)
    )


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


_ERROR_LINE = re.compile(
    r"^\s*(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*|(?:error|fatal|failed)\b.+)$",
    re.IGNORECASE,
)
_EXEC_BANNER = re.compile(r"^\s*(exit\s*code:.*|code output:\s*)$", re.IGNORECASE)


def _error_quote(turn: Turn, profile: SystemProfile = EMPTY_PROFILE) -> str:
    """The line of a failed execution that says what went wrong: the last error line (a
    traceback ends with the exception), else the failed span's status message (an SDK-traced
    tool's raised error keeps its text only there), else its first line that is neither the
    executor's banner nor the system's boilerplate, else the recorded error type."""
    lines = [line.strip() for line in turn.text.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    if errors:
        return errors[-1]
    messages = [s.status_message.strip() for s in turn.spans if s.failed and s.status_message]
    if any(messages):
        return next(m for m in messages if m)
    for line in lines:
        line = re.sub(r"^code output:\s*", "", line, flags=re.IGNORECASE)
        if line and not _EXEC_BANNER.match(line) and not profile.is_boilerplate(line):
            return line
    kinds = [s.error_type for s in turn.spans if s.error_type]
    return kinds[0] if kinds else "no output"


def _squash(text: str) -> str:
    return " ".join(text.split())


def _excerpt(text: str, limit: int = 90) -> str:
    text = _squash(text) or "(no text)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Rules -----------------------------------------------------------------------------------------


@dataclass
class _Context:
    run: Run
    turns: list[Turn]
    question: str
    task_turn: Turn | None  # the opening turn that restates the question
    requester_role: str | None  # "user" where the run is one agent serving a user
    profile: SystemProfile = EMPTY_PROFILE

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
            and not t.template
            and not t.after_end
            and _TERMINATION.sub("", t.text).strip()
        ]

    def action_start(self, turn: Turn) -> Turn:
        """Where the action of `turn` starts: the prompt template its agent was given just
        before it, when the system logs one (the template and the reply are one step)."""
        if turn.index > 0:
            before = self.turns[turn.index - 1]
            if before.template and before.agent == turn.agent and not before.after_end:
                return before
        return turn


@dataclass
class _Decision:
    turn: Turn
    rule: str
    reason: str
    confidence: float


def _context(run: Run, profile: SystemProfile = EMPTY_PROFILE) -> _Context:
    turns = build_turns(run, profile)
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
    return _Context(run, turns, question, task_turn, requester, profile)


def _rule_off_task(ctx: _Context) -> _Decision | None:
    turn = ctx.task_turn
    if turn is None:
        return None
    asked = _content_words(ctx.question)
    stated = _content_words(turn.evidence)
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
        failure = (
            f"the first failed execution is at step {turn.step} "
            f"({_excerpt(_error_quote(turn, ctx.profile), 100)!r})"
        )
        claim = _rule_ungrounded_claim(ctx)
        if claim is not None and claim.turn.index > author.index:
            # the run carried on past the failure with a number nothing grounds: what it made
            # up in place of the result is where it went wrong, not the code that failed
            claim.reason = f"after {failure}, {claim.reason}"
            return claim
        reason = f"{failure}; the {what} came from {author.agent} at step {author.step}"
        return _Decision(author, "failed_execution", reason, CONFIDENCE["failed_execution"])
    return None


def _derived(value: str, known: Sequence[float]) -> bool:
    """Whether `value` is arithmetic on known numbers (`analysis.arithmetic.derived`: one of
    them, two combined, three summed; at the value's own decimals, formatting aside):
    arithmetic on grounded numbers is grounded. Without its count-times-one and splits
    (`counts=()`): in prose the small numbers seen are list items and step numbers, and "10"
    from memory would be "5 x 2" (docs/attribution.md has the measurement)."""
    target = parse_number(value)
    if target is None:
        return False
    return derived(target, known, decimals=decimals_of(value), counts=()) is not None


def _rule_ungrounded_claim(ctx: _Context) -> _Decision | None:
    """The first agent turn stating numbers that nothing before it holds (not the question, not
    an earlier message or tool or execution output, not its own code, not arithmetic on those)."""
    seen: dict[str, None] = dict.fromkeys(sorted(_all_numbers(ctx.question)))  # in seen order
    for turn in ctx.turns:
        claimant = not (
            turn.execution
            or ctx.requester(turn)
            or turn.role == "system"
            or turn is ctx.task_turn
            or turn.template
            or turn.after_end
        )
        if claimant:
            code = " ".join(_FENCE.findall(turn.text))
            fresh = sorted(_numbers(turn.evidence) - seen.keys() - _all_numbers(code))
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


def _rule_handover(ctx: _Context) -> _Decision | None:
    """In a system whose runs an orchestrator opens (SystemProfile.orchestrator), the work
    starts with the first agent it hands the task to: that agent's first step (its prompt
    template, when the system logs one before the reply)."""
    boss = ctx.profile.orchestrator
    if boss is None or ctx.requester_role is not None:
        return None
    turns = ctx.substantive()
    worker = next((t for t in turns if t.agent != boss), None)
    if worker is None:
        return None
    start = ctx.action_start(worker)
    reason = (
        f"{boss} opens the run and hands the task over; the work starts with {worker.agent}'s "
        f"first step, step {start.step} ({_excerpt(worker.evidence or worker.text, 70)!r})"
    )
    return _Decision(start, "handover", reason, CONFIDENCE["handover"])


def _announces_only(turn: Turn) -> bool:
    """A turn that runs nothing and mostly says what will be done ("I will retrieve the
    article", "let's proceed step by step"): a plan, not yet an action that can be wrong.
    Headings and list items are not counted as sentences (a plan's steps are its content)."""
    if turn.writes_code:
        return False
    sentences = [
        s for s in _SENTENCE.split(turn.evidence) if len(s.split()) >= 3 and not _HEADING.match(s)
    ]
    announcing = sum(1 for s in sentences if _INTENT.search(s))
    return bool(sentences) and announcing >= PLAN_SHARE * len(sentences)


def _rule_first_action(ctx: _Context) -> _Decision | None:
    """The first substantive turn that does or states something: turns that only announce a
    plan are passed over (the first of them is kept when nothing else follows)."""
    turns = ctx.substantive()
    if not turns:
        return None
    turn = next((t for t in turns if not _announces_only(t)), turns[0])
    start = ctx.action_start(turn)
    opening = "the task statement" if ctx.task_turn is not None else "the start"
    reason = (
        f"no error or answer trace to follow; the first substantive step after {opening} is "
        f"{turn.agent}'s at step {start.step} ({_excerpt(turn.evidence or turn.text, 70)!r})"
    )
    return _Decision(start, "first_action", reason, CONFIDENCE["first_action"])


def _rule_last_turn(ctx: _Context) -> _Decision | None:
    for turn in reversed(ctx.turns):
        if not turn.execution and not ctx.requester(turn) and not turn.after_end:
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
    _rule_handover,
    _rule_first_action,
)
_BEFORE_FINDINGS = frozenset(RULES[: RULES.index(FINDINGS)])


def _finding_decision(
    ctx: _Context, findings: Iterable[Any], min_confidence: float, *, lookups: bool = True
) -> _Decision | None:
    """The earliest confident finding, mapped onto its turn (the caller's, for a finding on a
    tool result). `lookups=False` passes over findings on a failed lookup: `failed_execution`
    already weighed that failure (a guess the agent can correct)."""
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
        if turn is None or turn.after_end:  # a note written after the run is never decisive
            continue
        if not lookups and turn.tool_result and turn.failed and not _writes_state(turn):
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
    profile: SystemProfile | None = None,
) -> Attribution:
    """The decisive step and responsible agent of `run` (meant for failed runs).

    `findings` are detector findings for this run (optional); the earliest with confidence >=
    `min_finding_confidence` takes its place among the rules (see the module docstring).
    Deterministic; never reads `run.labels` or `tracegym.label.*` attributes.
    """
    ctx = _context(run, profile or EMPTY_PROFILE)
    run_id = source_run_id(run)
    findings = list(findings)
    decision = None
    for rule in RULES:
        if rule == FINDINGS:
            decision = _finding_decision(ctx, findings, min_finding_confidence)
        else:
            decision = rule(ctx)
            if decision is not None and findings and rule in _BEFORE_FINDINGS:
                # where the run first went wrong: a confident finding on an earlier step
                earlier = _finding_decision(ctx, findings, min_finding_confidence, lookups=False)
                if earlier is not None and earlier.turn.index < decision.turn.index:
                    decision = earlier
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
    """`attribute` for every failed run (`run.success is False`), in the given order.

    Each system's profile (boilerplate, orchestrator) is learnt from all of `runs` of that
    system, successful ones included; pass `profiles` (from `learn_profiles`) to reuse one.
    """
    runs = list(runs)
    findings_by_trace = findings_by_trace or {}
    profiles = options.pop("profiles", None) or learn_profiles(runs)
    return [
        attribute(
            run,
            findings_by_trace.get(run.trace_id, ()),
            profile=profiles.get(system_key(run)),
            **options,
        )
        for run in runs
        if run.failed
    ]
