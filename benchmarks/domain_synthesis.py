"""What the no-LLM loop (analysis, then synthesis) makes of each bundled domain, without a model.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/domain_synthesis.py [--runs 48] [--rate 0.6]
        [--domain shop|clinic] [--exact] [--validity-seeds 200] [--keep DIR] [--json FILE]

Why: the demo's loop must work on a second domain by the same code path. This checks the half
of it that needs no model: for each domain of `examples.domains.DOMAINS` a scripted agent (the
domain's oracle, except for two planted weaknesses, each on one kind of request, taken on
`--rate` of the runs where it can show) is traced with the public tracer (`@tg.agent`, one
`tg.llm` span per model turn with the messages and tool definitions, the tools' own `@tg.tool`
spans, `tg.record_outcome` with the verifier's verdict) into a temporary home; then
`analysis.pipeline.analyze` and `synthesis.pipeline.synthesize` run on it as `tracegym analyze`
and `tracegym synthesize` do (the default embedder; `--exact` groups failure signatures by exact
text instead, which needs no embedding model).

Printed per domain: the runs (failed per planted weakness), every gap (name, detector,
coverage, delta, failed and successful runs lacking it), for each planted weakness whether a gap
covers its runs (most of its failed runs among the gap's members), the environments
synthesized (family, validity, a sampled task) and the gaps that got none, with the reason.

The weaknesses:

| domain | kind    | the scripted agent, where the weakness shows                          |
|--------|---------|-----------------------------------------------------------------------|
| shop   | refund  | refunds without get_order (a precondition rule; the tool refuses)     |
| shop   | address | passes the customer's old address, not the new one (wrong field)      |
| clinic | cancel  | cancels an appointment that is not booked (a state rule; refused)     |
| clinic | book    | books the first listed slot, not the one of the day asked (wrong row) |
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tracegym as tg
from tracegym.examples.domains import DOMAINS, Domain

Call = tuple[str, dict[str, str]]


@dataclass(frozen=True)
class Weakness:
    """A planted weakness: on tasks of `kind` where `shows(task)`, the agent makes `calls(task)`
    and answers `answer(task)` instead of the oracle's."""

    name: str
    domain: str
    kind: str
    what: str
    detectors: tuple[str, ...]  # the detectors that should name it
    shows: Callable[[Any], bool]
    calls: Callable[[Any], list[Call]]
    answer: Callable[[Any], str]


def _shop_weaknesses() -> list[Weakness]:
    from tracegym.examples import shop

    def refund_blind(task: Any) -> list[Call]:
        return [("find_user", {"email": task.email}),
                ("refund_order", {"order_id": task.order_id})]  # fmt: skip

    def old_address(task: Any) -> list[Call]:
        calls = shop.oracle_actions(task)
        return [*calls[:-1], ("update_address", {"user_id": task.user_id, "address": task.address})]

    return [
        Weakness("refund_without_lookup", "shop", "refund",
                 "refund_order before get_order (the tool refuses)", ("wrong_tool_order",),
                 lambda t: True, refund_blind,
                 lambda t: f"Sorry, I could not refund order {t.order_id}."),
        Weakness("address_from_wrong_field", "shop", "address",
                 "update_address with the old address", ("ungrounded_argument", "wrong_choice"),
                 lambda t: True, old_address,
                 lambda t: f"Done: your address is now {t.new_address}."),
    ]  # fmt: skip


def _clinic_weaknesses() -> list[Weakness]:
    from tracegym.examples import clinic

    def not_booked(task: Any) -> bool:
        return task.appointments[task.appointment_id]["status"] != "booked"

    def cancel_anyway(task: Any) -> list[Call]:
        calls = clinic.oracle_actions(task)
        return [*calls, ("cancel_appointment", {"appointment_id": task.appointment_id})]

    def first_slot(task: Any) -> bool:
        return sorted(task.slots)[0] != task.slot_id

    def book_first(task: Any) -> list[Call]:
        calls = clinic.oracle_actions(task)
        wrong = {"patient_id": task.patient_id, "slot_id": sorted(task.slots)[0]}
        return [*calls[:-1], ("book_slot", wrong)]

    def first_answer(task: Any) -> str:
        slot = task.slots[sorted(task.slots)[0]]
        return f"Done: you are booked with {task.doctor} on {slot['day']} at {slot['time']}."

    return [
        Weakness("cancel_not_booked", "clinic", "cancel",
                 "cancel_appointment on an attended or missed appointment (the tool refuses)",
                 ("forbidden_action",), not_booked, cancel_anyway,
                 lambda t: f"Sorry, appointment {t.appointment_id} cannot be cancelled."),
        Weakness("book_first_slot", "clinic", "book",
                 "book_slot with the first listed slot, not the day asked for",
                 ("wrong_choice", "ungrounded_argument"), first_slot, book_first, first_answer),
    ]  # fmt: skip


WEAKNESSES: dict[str, Callable[[], list[Weakness]]] = {
    "shop": _shop_weaknesses,
    "clinic": _clinic_weaknesses,
}


@dataclass
class TracedRun:
    run_id: str
    trace_id: str
    task_id: str
    kind: str
    weakness: str | None
    passed: bool


def _turn(domain: Domain, messages: list[dict[str, Any]], reply: dict[str, Any]) -> None:
    """One model turn: a chat span with what the model saw and what it said."""
    with tg.llm(
        "generate",
        model=f"scripted-{domain.name}",
        messages=list(messages),
        system_instructions=domain.rules,
        tool_definitions=list(domain.tool_schemas),
    ) as call:
        call.set_result([reply])
        call.set_usage(input_tokens=sum(len(str(m["content"])) for m in messages) // 4,
                       output_tokens=16)  # fmt: skip
    messages.append(reply)


def _episode(domain: Domain, task: Any, calls: list[Call], answer: str) -> Any:
    """The scripted agent's episode on `task` (inside the agent span): the tools it used."""
    tools = domain.tools_for(task)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": domain.rules},
        {"role": "user", "content": task.request},
    ]
    for i, (name, arguments) in enumerate(calls):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
        _turn(domain, messages, {"role": "assistant", "content": "", "tool_calls": [call]})
        result = tools.call(name, arguments)
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": result})
    _turn(domain, messages, {"role": "assistant", "content": answer})
    return tools


def trace_domain(home: Path, domain: Domain, weaknesses: list[Weakness], runs: int,
                 rate: float) -> list[TracedRun]:  # fmt: skip
    """`runs` dev tasks of `domain` served by the scripted agent, traced into `home`."""
    from opentelemetry.sdk.trace import TracerProvider
    from tracegym.tracer.operations import state

    by_kind = {w.kind: w for w in weaknesses}
    saved = state.tracer, state.settings
    provider = TracerProvider()
    tg.init(home=home, provider=provider, capture_messages=True, service=f"{domain.name}-bench")
    traced = []
    try:
        for task in domain.tasks(domain.dev_seeds, runs):
            weak = by_kind.get(task.kind)
            rng = random.Random(f"{domain.name}:{task.seed}")
            planted = weak is not None and weak.shows(task) and rng.random() < rate
            calls = weak.calls(task) if planted else domain.oracle_actions(task)
            answer = weak.answer(task) if planted else domain.oracle_answer(task)
            run_id = f"{domain.name}-{task.seed:03d}"

            with tg.agent(domain.agent_name, run_id=run_id, input=task.request):
                trace_id = tg.current_trace_id() or ""
                tools = _episode(domain, task, calls, answer)
            verdict = domain.verify(task, tools, answer)
            tg.record_outcome(run_id, success=verdict.passed, reward=verdict.reward,
                              source="verifier",
                              labels={"task_id": task.task_id, "split": "dev"})  # fmt: skip
            traced.append(TracedRun(run_id, trace_id, task.task_id, task.kind,
                                    weak.name if planted and weak else None,
                                    verdict.passed))  # fmt: skip
    finally:
        tg.shutdown()
        provider.shutdown()
        state.tracer, state.settings = saved
    return traced


@dataclass
class GapRow:
    gap_id: str
    name: str
    detector: str
    coverage: float
    delta: float | None
    failed_lacking: int
    successful_lacking: int
    tools: list[str]
    rules: list[str]
    members: list[str]  # trace ids


@dataclass
class EnvRow:
    gap_id: str
    family: str | None
    valid: bool
    failed_checks: list[str]
    sample_request: str = ""


@dataclass
class DomainResult:
    domain: str
    runs: int
    failed: int
    planted: dict[str, int]  # weakness -> failed runs it caused
    gaps: list[GapRow]
    found: dict[str, str | None]  # weakness -> the gap covering it (None: missed)
    near: dict[str, list[str]]  # a missed weakness -> the candidates covering its runs, and why
    environments: list[EnvRow]
    without: list[dict[str, Any]]  # gaps without an environment: stage and reason
    seconds: dict[str, float] = field(default_factory=dict)


def gap_rows(gaps: Any) -> list[GapRow]:
    return [
        GapRow(g.id, g.name, g.detector, round(g.coverage, 3),
               None if g.delta is None else round(g.delta, 3), g.failed_runs_lacking,
               g.successful_runs_lacking, list(g.tools), [r.statement for r in g.rules],
               [m.trace_id for m in g.members])
        for g in gaps
    ]  # fmt: skip


def which_gap(runs: list[TracedRun], weakness: Weakness, gaps: list[GapRow]) -> str | None:
    """The gap whose members hold most of the weakness's failed runs (at least half)."""
    planted = {r.trace_id for r in runs if r.weakness == weakness.name and not r.passed}
    if not planted:
        return None
    best = max(gaps, key=lambda g: len(planted & set(g.members)), default=None)
    if best is None or 2 * len(planted & set(best.members)) < len(planted):
        return None
    return f"{best.name} ({best.detector})"


def near_misses(runs: list[TracedRun], weakness: Weakness, scored: Any) -> list[str]:
    """The candidates analysis scored that hold the weakness's failed runs, with why each was
    not kept (best first): where the planted runs went."""
    planted = {r.trace_id for r in runs if r.weakness == weakness.name and not r.passed}
    rows = []
    for s in scored:
        overlap = len(planted & s.candidate.lacking)
        if overlap and not s.kept:
            rows.append((-overlap, f"{s.candidate.key} holds {overlap}/{len(planted)}: {s.why}"))
    return [text for _, text in sorted(rows)[:3]]


def _environments(home: Path, report: Any) -> list[EnvRow]:
    """The registered environments (their validity checks passed) with a sampled task, and the
    built ones validity rejected."""
    from tracegym.synthesis.registry import load

    rows = []
    for built in report.environments:
        try:
            sample = str(load(home, built.env_id).make_task(0).instruction)
        except Exception as exc:  # a benchmark row, not a crash
            sample = f"(no sample: {type(exc).__name__}: {exc})"
        rows.append(EnvRow(built.gap_id, built.family, True, [], sample[:160]))
    for rejected in report.rejected:
        rows.append(EnvRow(rejected.gap_id, rejected.family, False, list(rejected.failures)))
    return rows


def run_domain(name: str, options: argparse.Namespace, keep: Path | None) -> DomainResult:
    from tracegym.analysis.pipeline import analyze
    from tracegym.synthesis.pipeline import synthesize

    domain = DOMAINS[name]
    weaknesses = WEAKNESSES[name]()
    with tempfile.TemporaryDirectory(prefix=f"tracegym-{name}-") as tmp:
        home = (keep / name) if keep else Path(tmp)
        home.mkdir(parents=True, exist_ok=True)
        seconds = {}
        clock = time.perf_counter()
        runs = trace_domain(home, domain, weaknesses, options.runs, options.rate)
        seconds["trace"] = round(time.perf_counter() - clock, 2)
        clock = time.perf_counter()
        embedder = None
        if options.exact:
            from tracegym.benchmarks.planted_causes import ExactSignatures

            embedder = ExactSignatures()
        analysis = analyze(home, embedder=embedder)
        seconds["analyze"] = round(time.perf_counter() - clock, 2)
        clock = time.perf_counter()
        report = synthesize(home, validity_seeds=options.validity_seeds)
        seconds["synthesize"] = round(time.perf_counter() - clock, 2)
        gaps = gap_rows(analysis.gaps)
        planted = {w.name: sum(r.weakness == w.name and not r.passed for r in runs)
                   for w in weaknesses}  # fmt: skip
        found = {w.name: which_gap(runs, w, gaps) for w in weaknesses}
        near = {w.name: near_misses(runs, w, analysis.scored)
                for w in weaknesses if found[w.name] is None}  # fmt: skip
        return DomainResult(
            domain=name,
            runs=len(runs),
            failed=sum(not r.passed for r in runs),
            planted=planted,
            gaps=gaps,
            found=found,
            near=near,
            environments=_environments(home, report),
            without=[g.to_dict() for g in report.without_environment],
            seconds=seconds,
        )


def show(result: DomainResult, weaknesses: list[Weakness]) -> None:
    print(f"\n== {result.domain}: {result.runs} runs, {result.failed} failed "
          f"(trace {result.seconds['trace']}s, analyze {result.seconds['analyze']}s, "
          f"synthesize {result.seconds['synthesize']}s)")  # fmt: skip
    for w in weaknesses:
        print(f"  planted {w.name:26s} on {w.kind:8s} {result.planted[w.name]:2d} failed runs: "
              f"{w.what}")  # fmt: skip
    print(f"  gaps ({len(result.gaps)}):")
    for g in result.gaps:
        delta = "-" if g.delta is None else f"{g.delta:+.2f}"
        print(
            f"    {g.name:40s} {g.detector:20s} coverage {g.coverage:.2f} delta {delta} "
            f"failed {g.failed_lacking} ok {g.successful_lacking} tools {','.join(g.tools)}"
        )
        for rule in g.rules:
            print(f"      rule: {rule[:110]}")
    for w in weaknesses:
        found = result.found[w.name]
        print(f"  {w.name:28s} {'FOUND as ' + found if found else 'MISSED'}"
              f"  (expected from {', '.join(w.detectors)})")  # fmt: skip
        for line in result.near.get(w.name, []):
            print(f"      not kept: {line[:160]}")
    print(f"  environments ({len(result.environments)}):")
    for e in result.environments:
        if e.valid:
            print(f"    {e.gap_id} -> {e.family}, valid; task 0: {e.sample_request}")
        else:
            print(f"    {e.gap_id} -> {e.family}, INVALID: {'; '.join(e.failed_checks)[:200]}")
    for g in result.without:
        checks = f" [{', '.join(g['failed_checks'])}]" if g.get("failed_checks") else ""
        print(f"    {g['gap_id']} ({g.get('detector')}) -> none: {g['stage']}: "
              f"{g['reason'][:200]}{checks}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=48)
    parser.add_argument("--rate", type=float, default=0.6)
    parser.add_argument("--domain", choices=sorted(DOMAINS), action="append")
    parser.add_argument(
        "--exact",
        action="store_true",
        help="group failure signatures by exact text (no embedding model)",
    )
    parser.add_argument("--validity-seeds", type=int, default=200)
    parser.add_argument("--keep", type=Path, help="keep the homes under this folder")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args(argv)
    results = []
    for name in options.domain or list(DOMAINS):
        result = run_domain(name, options, options.keep)
        show(result, WEAKNESSES[name]())
        results.append(result)
    if options.json:
        options.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
