"""Poisoned memory: a record written wrong, read back later and acted on.

A memory write (`update_memory` span) is *suspect* when its content came from a bad source:

- ``errored_source``: the last tool call before the write failed (the agent noted down what it
  made of an error);
- ``ungrounded``: the content holds values (ids, amounts, names) found in none of the evidence
  the writing run had seen (same rules as `UngroundedArgument`);
- ``contradicted``: a later tool result of the writing run, or of the run that reads it back,
  gives a different value for the same field (the record id for a scalar note, the keys of a
  JSON note);
- ``disagrees_with_successful_runs`` (needs `fit`): other runs wrote the same record (same store
  and record id) with a different content, and successful runs back that other content far more:
  at least `min_support` successful runs wrote or read it, and at most `disagreement` times as
  many backed this one.

A suspect write is *poisoned* when it is read back: a `search_memory` span returned its content
(the store links the read to the write: `Step.source_write_span_ids`, across runs too) and a
later step of the reading run used it (its input holds the content's values; where the content
has none to check, any later tool call or LLM call counts).

Findings go to the run that read the poison. When the write is in the same run, the decisive step
is the write; when an earlier run wrote it, the decisive step of *this* run is the read (the run
did nothing wrong before it), and the write is named in `span_ids` (second) and in
`details["write"]` (trace id, span id, position). Key ``poisoned_memory:<store>/<record>``
(digits in record ids masked, so that per-user records group together).

`fit` indexes every write of the population (needed to follow reads into earlier runs); without
`fit`, only writes read back within the same run are followed.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracegym.analysis.detector_names import POISONED_MEMORY
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.ungrounded import (
    Evidence,
    Value,
    normalize,
    significant_tokens,
    token_set_of,
)
from tracegym.analysis.features import is_tool, step_ref
from tracegym.analysis.runs import Run, Step, parse_json
from tracegym.tracer import semconv as sc

_DIGITS = re.compile(r"\d+")


def write_content(step: Step) -> str:
    """What a write stored (the span's output, else the content attribute)."""
    content = (
        step.output if step.output not in (None, "") else step.attributes.get(sc.MEMORY_CONTENT)
    )
    return "" if content is None else str(content)


def _fields(value: Any, name: str | None, out: dict[str, str], depth: int = 0) -> None:
    """Scalar fields of a parsed value by key (a bare scalar under `name`)."""
    if depth > 8:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _fields(item, str(key).casefold(), out, depth + 1)
    elif isinstance(value, list):
        return  # lists of records have no single value per key
    elif name is not None and value is not None:
        out.setdefault(name, normalize(str(value)))


def fields_of(raw: str | None, name: str | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    if raw:
        _fields(parse_json(raw), name, out)
    return out


def record_key(step: Step) -> str:
    store = step.memory_store or "memory"
    record = step.memory_record
    return f"{store}/{_DIGITS.sub('#', record)}" if record else store


@dataclass
class Write:
    """A memory write and why it is suspect."""

    run: Run
    step: Step
    content: str
    reasons: dict[str, list[str]] = field(default_factory=dict)  # reason -> evidence span ids
    support: tuple[int, int] | None = None  # successful runs backing (this, the top) content

    @property
    def variant(self) -> str:
        return self.step.memory_content_hash or normalize(self.content)


def contradictions(content: str, record: str | None, steps: Sequence[Step]) -> list[Step]:
    """Tool calls among `steps` whose results give another value for a field of `content`."""
    name = record.casefold() if record else None
    mine = fields_of(content, name)
    if not mine:
        return []
    found = []
    for step in steps:
        if not is_tool(step) or step.failed:
            continue
        theirs = fields_of(step.output)
        if any(k in theirs and theirs[k] != v for k, v in mine.items()):
            found.append(step)
    return found


def local_reasons(run: Run, write: Step, content: str, **options: Any) -> dict[str, list[str]]:
    """The suspicions a run alone can raise against one of its writes."""
    reasons: dict[str, list[str]] = {}
    before = [s for s in run.steps[: write.position] if is_tool(s)]
    if before and before[-1].failed:
        reasons["errored_source"] = [before[-1].span_id]
    significant = significant_tokens(content, **options)
    if significant:
        evidence = Evidence(run)
        evidence.advance(write.position)
        value = Value("content", content, normalize(content), significant)
        if not evidence.grounded(value):
            reasons["ungrounded"] = []
    later = contradictions(content, write.memory_record, run.steps[write.position + 1 :])
    if later:
        reasons["contradicted"] = [s.span_id for s in later[:3]]
    return reasons


class PoisonedMemory(Detector):
    """Suspect memory writes read back and used (see the module docstring).

    Parameters: `min_support` (3) successful runs behind the content a write disagrees with,
    `disagreement` (0.5) the most backing, relative to that, a disagreeing content may have.
    """

    name = POISONED_MEMORY
    description = (
        "Writes to memory what an error, a guess or a misreading produced, and later acts on "
        "the record it reads back"
    )

    def __init__(self, min_support: int = 3, disagreement: float = 0.5) -> None:
        self.min_support = min_support
        self.disagreement = disagreement
        self.writes_: dict[str, Write] = {}

    def _writes(self, run: Run) -> dict[str, Write]:
        writes = {}
        for step in run.steps:
            if step.operation == sc.OP_MEMORY_UPDATE:
                content = write_content(step)
                writes[step.span_id] = Write(run, step, content, local_reasons(run, step, content))
        return writes

    def fit(self, runs: Sequence[Run]) -> PoisonedMemory:
        self.writes_ = {}
        for run in runs:
            self.writes_.update(self._writes(run))
        # Which content each record holds, and how many successful runs back each content.
        backers: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for write in self.writes_.values():
            if write.step.memory_record is None:
                continue
            variants = backers[record_key(write.step)]
            variants.setdefault(write.variant, set())
            if write.run.success is True:
                variants[write.variant].add(write.run.trace_id)
        for run in runs:
            if run.success is not True:
                continue
            for step in run.steps:
                for span_id in step.source_write_span_ids or ():
                    write = self.writes_.get(span_id or "")
                    if write is not None and write.step.memory_record is not None:
                        backers[record_key(write.step)][write.variant].add(run.trace_id)
        for write in self.writes_.values():
            variants = backers.get(record_key(write.step)) if write.step.memory_record else None
            if not variants or len(variants) < 2:
                continue
            support = Counter({v: len(ids) for v, ids in variants.items()})
            (top, top_n), *_ = support.most_common(1)
            mine = support[write.variant]
            if (
                top != write.variant
                and top_n >= self.min_support
                and mine <= self.disagreement * top_n
            ):
                write.reasons["disagrees_with_successful_runs"] = []
                write.support = (mine, top_n)
        return self

    @staticmethod
    def _used(run: Run, read: Step) -> Step | None:
        """The first later step of the run that used what the read returned."""
        content = read.output or ""
        wanted = significant_tokens(content, min_number=0)
        for step in run.steps[read.position + 1 :]:
            if not (is_tool(step) or step.operation in (sc.OP_CHAT, sc.OP_MEMORY_UPDATE)):
                continue
            if not wanted:
                return step
            raw = step.input if step.operation != sc.OP_MEMORY_UPDATE else write_content(step)
            if raw and all(t in token_set_of(raw) for t in wanted):
                return step
        return None

    def detect(self, run: Run) -> list[Finding]:
        own = self._writes(run)
        findings = []
        done: set[str] = set()
        for read in run.steps:
            if read.operation != sc.OP_MEMORY_SEARCH:
                continue
            for span_id in read.source_write_span_ids or ():
                write = own.get(span_id or "") or self.writes_.get(span_id or "")
                if write is None or span_id in done:
                    continue
                reasons = dict(write.reasons)
                if write.run.trace_id != run.trace_id:
                    later = contradictions(
                        write.content, write.step.memory_record, run.steps[read.position + 1 :]
                    )
                    if later:
                        reasons["contradicted"] = [s.span_id for s in later[:3]]
                if not reasons:
                    continue
                user = self._used(run, read)
                if user is None:
                    continue
                done.add(span_id)
                findings.append(self._finding(run, read, write, reasons, user))
        return findings

    def _finding(
        self, run: Run, read: Step, write: Write, reasons: dict[str, list[str]], user: Step
    ) -> Finding:
        same_run = write.run.trace_id == run.trace_id
        decisive = write.step if same_run else read
        evidence = [write.step.span_id, read.span_id] if same_run else [
            read.span_id, write.step.span_id]  # fmt: skip
        evidence.append(user.span_id)
        for spans in reasons.values():
            evidence.extend(spans)
        where = "earlier in this run" if same_run else "by an earlier run"
        shown = write.content if len(write.content) <= 60 else write.content[:57] + "..."
        message = (
            f"memory record {record_key(write.step)} was written {where} with {shown!r} "
            f"({', '.join(sorted(reasons))}), read back at step {read.position} and used at "
            f"step {user.position}"
        )
        return Finding(
            detector=self.name, key=f"{self.name}:{record_key(write.step)}",
            trace_id=run.trace_id, **step_ref(decisive),
            span_ids=tuple(dict.fromkeys(evidence)), message=message,
            confidence=0.8 if same_run or "contradicted" in reasons else 0.7,
            details={
                "reasons": sorted(reasons), "content": write.content,
                "write": {"trace_id": write.run.trace_id, "span_id": write.step.span_id,
                          "position": write.step.position},
                "read": {"span_id": read.span_id, "position": read.position},
                "used_at": user.position,
                "support": {"this": write.support[0], "other": write.support[1]}
                if write.support else None,
            },
        )  # fmt: skip
