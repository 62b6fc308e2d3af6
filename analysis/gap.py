"""`Gap` and `GapsDocument`: the typed contract between analysis (which writes gaps.json) and
its readers (synthesis, training, the dashboard, the `gap_runs` view). gaps.json (docs/gaps.md)
is `GapsDocument.to_dict()`; one record of its `gaps` list is `Gap.to_dict()`. `Gap.from_dict`
reads a record back, also from documents written before `members` and `symptoms` existed, and
raises `GapError` (naming the problem) when a record cannot be a gap: no id, or no detector named
or derivable from its key or signatures. `GapsDocument.from_dict` reads the whole document and
raises `GapsDocumentError` when its shape is wrong; `GapsDocument.read(home)` and `.write(home)`
go through `tracegym.store.home`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tracegym.store.home import DocumentError, Home, read_json, write_json

KINDS = ("finding", "detector", "cluster")
EXAMPLES = 5  # gaps.json's `examples`: the first members, kept for older readers
_HEAD = re.compile(r"^[a-z][a-z0-9_]*$")


class GapError(ValueError):
    """A gaps.json record that is not a gap (the message says why)."""


def _strings(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise GapError(f"'{name}' must be a list, got {type(value).__name__}")
    return tuple(str(v) for v in value)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class GapMember:
    """One failed run the gap explains, at its decisive step (the candidate's earliest finding
    in the run)."""

    trace_id: str
    run_id: str | None = None
    step: int | None = None  # the source's own step index
    position: int | None = None  # the step's place in run order
    agent: str | None = None
    span_ids: tuple[str, ...] = ()  # the spans that prove it, decisive step first
    evidence: str = ""  # the finding's sentence

    def to_dict(self) -> dict[str, Any]:
        return {"trace_id": self.trace_id, "run_id": self.run_id, "step": self.step,
                "position": self.position, "agent": self.agent,
                "span_ids": list(self.span_ids), "evidence": self.evidence}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GapMember:
        if not isinstance(data, Mapping) or not isinstance(data.get("trace_id"), str):
            raise GapError("a member run must be an object with a 'trace_id' string")
        run_id = data.get("run_id")
        agent = data.get("agent")
        return cls(
            trace_id=data["trace_id"],
            run_id=str(run_id) if run_id is not None else None,
            step=_int(data.get("step")),
            position=_int(data.get("position")),
            agent=str(agent) if agent is not None else None,
            span_ids=_strings(data.get("span_ids"), "span_ids"),
            evidence=str(data.get("evidence") or ""),
        )


@dataclass(frozen=True)
class GapRequest:
    """A user's request behind the gap's findings, with the run's first successful call
    (`{"tool", "arguments"}`), from detectors that keep them (`unserved_request`)."""

    text: str
    first_call: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text,
                "first_call": dict(self.first_call) if self.first_call else None}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GapRequest:
        call = data.get("first_call")
        return cls(str(data.get("text") or ""), dict(call) if isinstance(call, Mapping) else None)


@dataclass(frozen=True)
class Symptom:
    """A kept candidate folded into this gap: it follows the gap's cause in the same failed
    runs (see `analysis.gaps.select`)."""

    key: str
    name: str
    detector: str
    failed_runs: int  # failed runs with the symptom
    shared: int  # of them, runs where this gap's earliest finding comes first
    explained: int  # runs where some kept cause comes first (>= shared)
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "detector": self.detector,
                "failed_runs": self.failed_runs, "shared": self.shared, "explained": self.explained,
                "why": self.why}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Symptom:
        return cls(str(data.get("key") or ""), str(data.get("name") or ""),
                   str(data.get("detector") or ""), _int(data.get("failed_runs")) or 0,
                   _int(data.get("shared")) or 0, _int(data.get("explained")) or 0,
                   str(data.get("why") or ""))  # fmt: skip


@dataclass(frozen=True)
class MinedRule:
    """A rule a detector mined from the agent's own successful runs, which the gap's failed runs
    break. Synthesis enforces exactly these and nothing invented (docs/gaps.md):

    - ``precondition`` (forbidden_action): `tool` is never called on a record `read_tool` showed
      with `path` in `values` (or above `above` / below `below`); `allowed` are the states
      successful runs did call it in;
    - ``trigger`` (missed_action): after `read_tool` shows `path` = `values[0]`, `tool` is called;
    - ``amount`` (wrong_amount): `argument` of `tool` follows from numbers the run saw;
    - ``list`` (wrong_list): `argument` of `tool` holds the `relation` (equal | subset | named) to
      what the run looked up or the user named.

    `support` counts the successful records or calls the rule held on, `abstained` the records
    successful runs left alone in the forbidden state, `confidence` the share of successful cases
    it held on, `failed_runs` the gap's members that break it, `evidence_runs` (some of) the
    successful trace ids it was mined from.
    """

    detector: str
    kind: str  # precondition | trigger | amount | list
    tool: str
    statement: str  # one sentence a person can check
    read_tool: str | None = None
    path: str | None = None
    values: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()  # (preconditions) the states successful runs acted in
    above: float | None = None
    below: float | None = None
    argument: str | None = None
    relation: str | None = None
    support: int = 0
    abstained: int = 0
    confidence: float | None = None
    failed_runs: int = 0
    evidence_runs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"detector": self.detector, "kind": self.kind, "tool": self.tool,
                "statement": self.statement, "read_tool": self.read_tool, "path": self.path,
                "values": list(self.values), "allowed": list(self.allowed), "above": self.above,
                "below": self.below,
                "argument": self.argument, "relation": self.relation, "support": self.support,
                "abstained": self.abstained, "confidence": self.confidence,
                "failed_runs": self.failed_runs,
                "evidence_runs": list(self.evidence_runs)}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MinedRule:
        if not isinstance(data, Mapping):
            raise GapError(f"a rule must be an object, got {type(data).__name__}")
        if not data.get("tool") or not data.get("kind"):
            raise GapError("a rule needs a 'kind' and a 'tool'")

        def number(name: str) -> float | None:
            value = data.get(name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return float(value) if ok else None

        confidence = number("confidence")
        return cls(
            detector=str(data.get("detector") or ""), kind=str(data["kind"]),
            tool=str(data["tool"]), statement=str(data.get("statement") or ""),
            read_tool=str(data["read_tool"]) if data.get("read_tool") else None,
            path=str(data["path"]) if data.get("path") else None,
            values=_strings(data.get("values"), "values"),
            allowed=_strings(data.get("allowed"), "allowed"), above=number("above"),
            below=number("below"),
            argument=str(data["argument"]) if data.get("argument") else None,
            relation=str(data["relation"]) if data.get("relation") else None,
            support=_int(data.get("support")) or 0, abstained=_int(data.get("abstained")) or 0,
            confidence=confidence, failed_runs=_int(data.get("failed_runs")) or 0,
            evidence_runs=_strings(data.get("evidence_runs"), "evidence_runs"),
        )  # fmt: skip

    def identity(self) -> tuple[Any, ...]:
        """Two findings state the same rule when these agree (their counts may differ)."""
        return (self.detector, self.kind, self.tool, self.read_tool, self.path, self.values,
                self.allowed, self.above, self.below, self.argument, self.relation)  # fmt: skip


def derive_detector(key: str, kind: str, signatures: Sequence[str]) -> str | None:
    """The detector behind a record that does not name one: the key's `<detector>:` prefix
    (`detector:<name>` for a whole kind), else the most frequent detector heading its failure
    signatures' lines (clusters)."""
    prefix, _, rest = key.partition(":")
    if prefix == "detector" and rest:
        return rest
    if kind != "cluster" and rest and prefix != "cluster" and _HEAD.match(prefix):
        return prefix
    counts: Counter[str] = Counter()
    for signature in signatures:
        for line in str(signature).splitlines():
            head = line.split(":", 1)[0].strip()
            if ":" in line and head != "around" and _HEAD.match(head):
                counts[head] += 1
    return max(counts, key=lambda d: (counts[d], d)) if counts else None


@dataclass(frozen=True)
class Gap:
    """A capability the failed runs lack (docs/gaps.md has every field's meaning)."""

    id: str
    name: str
    key: str
    kind: str  # one of KINDS
    detector: str  # the detector whose findings define it (a cluster: its dominant one)
    description: str = ""
    rank: int = 0
    coverage: float = 0.0
    delta: float | None = None
    stability: int = 0
    failed_runs_lacking: int = 0
    successful_runs_lacking: int = 0
    tools: tuple[str, ...] = ()
    argument_patterns: tuple[str, ...] = ()
    members: tuple[GapMember, ...] = ()  # every failed run it explains, in trace id order
    requests: tuple[GapRequest, ...] = ()
    successful_behaviour: str = ""
    signatures: tuple[str, ...] = ()
    symptoms: tuple[Symptom, ...] = ()
    # the mined rules its failed runs break (forbidden_action, missed_action, wrong_amount,
    # wrong_list): what synthesis may enforce; empty for the other detectors
    rules: tuple[MinedRule, ...] = ()
    # when the contrast within the failed runs' kinds of request kept it (analysis.gaps.
    # like_with_like): {"kinds", "failed", "succeeded", "delta", "stability"}
    within_kind: Mapping[str, Any] | None = None
    # why the gap is confined to kinds of request that failed throughout (analysis.gaps.
    # the_kind_itself): nothing in the traces tells it from those kinds; None for the others
    confined: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # fields this version does not know

    def __post_init__(self) -> None:
        if not self.id.strip():
            raise GapError("a gap needs an 'id'")
        if not self.detector:
            raise GapError(
                "the gap names no detector and its evidence points at none, so no family fits"
            )

    @property
    def examples(self) -> tuple[GapMember, ...]:
        return self.members[:EXAMPLES]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rank": self.rank,
            "name": self.name,
            "key": self.key,
            "kind": self.kind,
            "detector": self.detector,
            "description": self.description,
            "coverage": self.coverage,
            "delta": self.delta,
            "stability": self.stability,
            "failed_runs_lacking": self.failed_runs_lacking,
            "successful_runs_lacking": self.successful_runs_lacking,
            "tools": list(self.tools),
            "argument_patterns": list(self.argument_patterns),
            "examples": [m.to_dict() for m in self.examples],
            "members": [m.to_dict() for m in self.members],
            "requests": [r.to_dict() for r in self.requests],
            "successful_behaviour": self.successful_behaviour,
            "signatures": list(self.signatures),
            "symptoms": [s.to_dict() for s in self.symptoms],
            "rules": [r.to_dict() for r in self.rules],
            "within_kind": dict(self.within_kind) if self.within_kind else None,
            "confined": self.confined,
            **dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gap:
        """A gap from its gaps.json record. Older records without `members` take their
        `examples` as members; one without a `detector` takes the one its key or signatures
        name."""
        if not isinstance(data, Mapping):
            raise GapError(f"a gap must be an object, got {type(data).__name__}")
        gap_id = data.get("id")
        if not isinstance(gap_id, str) or not gap_id.strip():
            raise GapError("a gap needs an 'id' string")
        key = str(data.get("key") or "")
        kind = str(data.get("kind") or ("cluster" if key.startswith("cluster:") else "finding"))
        signatures = _strings(data.get("signatures"), "signatures")
        detector = data.get("detector") or derive_detector(key, kind, signatures)
        if not key and detector:
            key = f"detector:{detector}"
        members = data.get("members")
        if members is None:
            members = data.get("examples")
        if members is not None and not isinstance(members, (list, tuple)):
            raise GapError(f"'members' must be a list, got {type(members).__name__}")
        requests = data.get("requests") or []
        if not isinstance(requests, (list, tuple)):
            raise GapError(f"'requests' must be a list, got {type(requests).__name__}")
        delta = data.get("delta")
        known = {f for f in cls.__dataclass_fields__ if f != "extra"} | {"examples"}
        return cls(
            id=gap_id,
            name=str(data.get("name") or gap_id),
            key=key,
            kind=kind,
            detector=str(detector or ""),
            description=str(data.get("description") or ""),
            rank=_int(data.get("rank")) or 0,
            coverage=float(data.get("coverage") or 0.0),
            delta=None if delta is None else float(delta),
            stability=_int(data.get("stability")) or 0,
            failed_runs_lacking=_int(data.get("failed_runs_lacking")) or 0,
            successful_runs_lacking=_int(data.get("successful_runs_lacking")) or 0,
            tools=_strings(data.get("tools"), "tools"),
            argument_patterns=_strings(data.get("argument_patterns"), "argument_patterns"),
            members=tuple(GapMember.from_dict(m) for m in members or []),
            requests=tuple(GapRequest.from_dict(r) for r in requests if isinstance(r, Mapping)),
            successful_behaviour=str(data.get("successful_behaviour") or ""),
            signatures=signatures,
            symptoms=tuple(
                Symptom.from_dict(s) for s in data.get("symptoms") or [] if isinstance(s, Mapping)
            ),
            rules=tuple(
                MinedRule.from_dict(r) for r in data.get("rules") or [] if isinstance(r, Mapping)
            ),
            within_kind=dict(within)
            if isinstance(within := data.get("within_kind"), Mapping)
            else None,
            confined=str(data["confined"]) if data.get("confined") else None,
            extra={k: v for k, v in data.items() if k not in known},
        )

    def summary(self) -> dict[str, Any]:
        """What an environment spec keeps of its gap."""
        return {"id": self.id, "name": self.name, "key": self.key, "detector": self.detector,
                "kind": self.kind, "description": self.description, "coverage": self.coverage,
                "delta": self.delta}  # fmt: skip


def as_gap(gap: Gap | Mapping[str, Any]) -> Gap:
    """`gap` itself, or the Gap its gaps.json record describes (the public entry points of
    synthesis accept both; everything behind them reads `Gap`)."""
    return gap if isinstance(gap, Gap) else Gap.from_dict(gap)


class GapsDocumentError(DocumentError):
    """gaps.json is not a gaps document (the message names what is wrong)."""


def _number(value: Any, default: float | int | None) -> Any:
    """`value` when it is a number (kept as written: 0 stays 0, 0.1 stays 0.1), else `default`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if ok else default


def _mapping(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise GapsDocumentError(f"'{name}' must be an object, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class RunCounts:
    """gaps.json's `runs`: how many runs the analysis read, by outcome (`unknown`: no outcome),
    and, where it streamed (`analysis.streaming`), the sample the detectors were fitted on
    (`fitted_on`; absent: fitted on all of them)."""

    total: int = 0
    failed: int = 0
    succeeded: int = 0
    unknown: int = 0
    fitted_on: int | None = None

    def to_dict(self) -> dict[str, Any]:
        counts = {"total": self.total, "failed": self.failed, "succeeded": self.succeeded,
                  "unknown": self.unknown}  # fmt: skip
        return counts if self.fitted_on is None else {**counts, "fitted_on": self.fitted_on}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunCounts:
        counts = (_int(data.get(name)) or 0 for name in ("total", "failed", "succeeded", "unknown"))
        return cls(*counts, fitted_on=_int(data.get("fitted_on")))


@dataclass(frozen=True)
class GapThresholds:
    """gaps.json's `thresholds`: what a candidate had to reach to be kept as a gap (the
    `analysis.gap_selection.Thresholds` the analysis ran with)."""

    min_coverage: float = 0.10
    min_delta: float = 0.20
    resamples: int = 10
    min_stability: int = 8
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"min_coverage": self.min_coverage, "min_delta": self.min_delta,
                "resamples": self.resamples, "min_stability": self.min_stability,
                "seed": self.seed}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GapThresholds:
        default = cls()
        return cls(**{name: _number(data.get(name), getattr(default, name))
                      for name in cls.__dataclass_fields__})  # fmt: skip


@dataclass(frozen=True)
class RejectedCandidate:
    """One row of gaps.json's `rejected`: a candidate not kept as a gap, and why (the 20 with
    the highest coverage)."""

    key: str
    kind: str
    coverage: float = 0.0
    delta: float | None = None
    stability: int = 0
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "coverage": self.coverage,
                "delta": self.delta, "stability": self.stability, "why": self.why}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RejectedCandidate:
        if not isinstance(data, Mapping):
            raise GapsDocumentError(f"a rejected candidate must be an object, got "
                                    f"{type(data).__name__}")  # fmt: skip
        return cls(key=str(data.get("key") or ""), kind=str(data.get("kind") or ""),
                   coverage=_number(data.get("coverage"), 0.0),
                   delta=_number(data.get("delta"), None),
                   stability=_int(data.get("stability")) or 0,
                   why=str(data.get("why") or ""))  # fmt: skip


@dataclass(frozen=True)
class NotAGap:
    """A record of gaps.json's `gaps` list that `Gap.from_dict` rejects. Readers report it and
    go on with the others; it is kept so that writing the document back keeps it too."""

    index: int  # its place in the `gaps` list
    record: Any  # the record as read
    reason: str  # the GapError's message

    @property
    def gap_id(self) -> str | None:
        value = self.record.get("id") if isinstance(self.record, Mapping) else None
        return value if isinstance(value, str) else None

    @property
    def name(self) -> str | None:
        value = self.record.get("name") if isinstance(self.record, Mapping) else None
        return value if isinstance(value, str) else None


_LISTS = ("tools", "argument_patterns", "examples", "members", "signatures")


def _malformed(index: int, record: Any) -> str | None:
    """Why `record` is not shaped like a gaps.json gap at all (a damaged document rather than a
    gap some reader cannot use), or None."""
    if not isinstance(record, Mapping):
        return f"gaps[{index}] must be an object, got {type(record).__name__}"
    gap_id = record.get("id")
    if not isinstance(gap_id, str) or not gap_id.strip():
        return f"gaps[{index}] has no 'id' string"
    if not (record.get("key") or record.get("detector")):
        return f"gaps[{index}] ({gap_id}) has neither 'key' nor 'detector'"
    for name in _LISTS:
        if name in record and not isinstance(record[name], list):
            return f"gaps[{index}] ({gap_id}): '{name}' must be a list"
    return None


@dataclass(frozen=True)
class GapsDocument:
    """gaps.json: what one analysis of the whole store found (docs/gaps.md). `where` is set
    only on a filtered analysis (`analyze --where`, written with --output)."""

    VERSION: ClassVar[int] = 1

    version: int = VERSION
    generated_at: str | None = None  # UTC, "%Y-%m-%dT%H:%M:%SZ"
    runs: RunCounts = field(default_factory=RunCounts)
    contrast: str = ""  # what the gaps were contrasted with, in words
    thresholds: GapThresholds = field(default_factory=GapThresholds)
    gaps: tuple[Gap, ...] = ()  # in rank order
    rejected: tuple[RejectedCandidate, ...] = ()
    detector_errors: Mapping[str, str] = field(default_factory=dict)  # detector -> its error
    where: str | None = None
    not_gaps: tuple[NotAGap, ...] = ()  # records of `gaps` that are not gaps (read, never made)
    extra: Mapping[str, Any] = field(default_factory=dict)  # fields this version does not know

    def to_dict(self) -> dict[str, Any]:
        records: list[Any] = [g.to_dict() for g in self.gaps]
        for bad in sorted(self.not_gaps, key=lambda b: b.index):
            records.insert(min(bad.index, len(records)), bad.record)
        document: dict[str, Any] = {
            "version": self.version,
            "generated_at": self.generated_at,
            "runs": self.runs.to_dict(),
            "contrast": self.contrast,
            "thresholds": self.thresholds.to_dict(),
            "gaps": records,
            "rejected": [r.to_dict() for r in self.rejected],
            "detector_errors": dict(self.detector_errors),
        }
        if self.where is not None:
            document["where"] = self.where
        return {**document, **dict(self.extra)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, strict: bool = True) -> GapsDocument:
        """The document `data` holds; one without a `version` (written before it had one)
        reads as version 0 with defaults for what it lacks. A record of `gaps` that is not a
        gap lands in `not_gaps`; with `strict`, one not even shaped like a gap (not an object,
        no id, neither key nor detector, a list field that is not a list) raises
        GapsDocumentError instead, as a damaged document."""
        if not isinstance(data, Mapping):
            raise GapsDocumentError(f"expected a JSON object with a 'gaps' list (docs/gaps.md), "
                                    f"got {type(data).__name__}")  # fmt: skip
        version = data.get("version", 0)
        if _int(version) is None or not 0 <= version <= cls.VERSION:
            raise GapsDocumentError(
                f"gaps.json version {version!r} is not supported (expected {cls.VERSION})"
            )
        records = data.get("gaps", [])
        if not isinstance(records, list):
            raise GapsDocumentError(f"'gaps' must be a list, got {type(records).__name__}")
        gaps: list[Gap] = []
        not_gaps: list[NotAGap] = []
        for index, record in enumerate(records):
            problem = _malformed(index, record) if strict else None
            if problem is not None:
                raise GapsDocumentError(problem)
            try:
                gaps.append(Gap.from_dict(record))
            except GapError as error:
                not_gaps.append(NotAGap(index, record, str(error)))
        rejected = data.get("rejected", [])
        if not isinstance(rejected, list):
            raise GapsDocumentError(f"'rejected' must be a list, got {type(rejected).__name__}")
        errors = _mapping(data, "detector_errors")
        where = data.get("where")
        generated_at = data.get("generated_at")
        known = {f for f in cls.__dataclass_fields__ if f not in ("not_gaps", "extra")}
        return cls(
            version=int(version),
            generated_at=str(generated_at) if generated_at is not None else None,
            runs=RunCounts.from_dict(_mapping(data, "runs")),
            contrast=str(data.get("contrast") or ""),
            thresholds=GapThresholds.from_dict(_mapping(data, "thresholds")),
            gaps=tuple(gaps),
            rejected=tuple(RejectedCandidate.from_dict(r) for r in rejected),
            detector_errors={str(k): str(v) for k, v in errors.items()},
            where=str(where) if where is not None else None,
            not_gaps=tuple(not_gaps),
            extra={k: v for k, v in data.items() if k not in known},
        )

    @classmethod
    def read_file(cls, path: str | os.PathLike[str], *, strict: bool = True) -> GapsDocument:
        """The gaps document at `path`: FileNotFoundError when there is none, DocumentError
        (GapsDocumentError for the wrong shape) naming the file when it cannot be one."""
        target = Path(path)
        data = read_json(target)
        try:
            return cls.from_dict(data, strict=strict)
        except GapsDocumentError as error:
            raise GapsDocumentError(f"{target}: {error}") from None

    @classmethod
    def read(cls, home: str | os.PathLike[str] | Home, *, strict: bool = True) -> GapsDocument:
        """`<home>/gaps.json` (see `read_file`)."""
        return cls.read_file(Home.at(home).gaps, strict=strict)

    def write_file(self, path: str | os.PathLike[str]) -> Path:
        """Write the document to `path` atomically (a reader never sees half of it)."""
        write_json(path, self.to_dict())
        return Path(path)

    def write(self, home: str | os.PathLike[str] | Home) -> Path:
        """Write `<home>/gaps.json` atomically."""
        return self.write_file(Home.at(home).gaps)


__all__ = ["EXAMPLES", "KINDS", "Gap", "GapError", "GapMember", "GapRequest", "GapThresholds",
           "GapsDocument", "GapsDocumentError", "MinedRule", "NotAGap", "RejectedCandidate",
           "RunCounts", "Symptom", "as_gap", "derive_detector"]  # fmt: skip
