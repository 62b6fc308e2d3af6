"""The nightly's documents: what each night writes under `<home>/nightly/` and what dashboards
read back, apart from the job that runs the stages (jobs.nightly), so a reader needs no runner.

    stages/<stage>.json   a StageResult (CompactResult ... ReportResult; `stage_result`)
    report.json           NightlyReport (with ReportAdapter rows)
    state.json            NightlyState: what the last completed night read
    history.jsonl         a NightRecord a line (`read_history`)

Each is a dataclass with `to_dict`/`from_dict` and a version; the JSON keeps the keys it had
before the version, so nights written then still read (as version 0). A document that is not the
shape its reader needs raises NightlyDocumentError naming it. Light on purpose: no torch, duckdb
or polars at import.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tracegym.store.home import DocumentError, Home, read_json
from tracegym.training.evaluate import EvaluationRow
from tracegym.training.router import RoutingAccuracy

STAGES = ("compact", "analyze", "synthesize", "train", "evaluate", "report")


class NightlyDocumentError(DocumentError):
    """A nightly document (a stage's result, the report, the state, a history line) that is not
    the shape its reader needs."""


def _mapping(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise NightlyDocumentError(f"{what} is not a JSON object: {type(data).__name__}")
    return data


def _text(data: Mapping[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise NightlyDocumentError(f"{what} has no {key!r} (text), got {value!r}")
    return value


def _version(data: Mapping[str, Any], cls: Any, what: str) -> int:
    """The document's version: 0 when it has none (written before documents had one)."""
    version = data.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version > cls.VERSION:
        raise NightlyDocumentError(
            f"{what} has version {version!r}; this tracegym reads up to {cls.VERSION}"
        )
    return version


def _int(data: Mapping[str, Any], key: str, what: str) -> int:
    value = data.get(key) or 0
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise NightlyDocumentError(f"{what}'s {key!r} is not a number: {value!r}")
    return int(value)


def _strings(data: Mapping[str, Any], key: str) -> list[str]:
    return [str(item) for item in data.get(key) or []]


@dataclass
class StageFailure:
    """One environment (or adapter) a stage could not handle; the stage went on without it."""

    item: str
    error: str  # the exception's type
    reason: str  # its type and the first line of its message
    env_id: str | None = None
    adapter_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        ids = {k: v for k, v in (("env_id", self.env_id), ("adapter_id", self.adapter_id)) if v}
        return {**ids, "item": self.item, "error": self.error, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageFailure:
        data = _mapping(data, "a stage's failure")
        return cls(
            item=str(data.get("item", "")), error=str(data.get("error", "")),
            reason=str(data.get("reason", "")), env_id=data.get("env_id"),
            adapter_id=data.get("adapter_id"),
        )  # fmt: skip


@dataclass
class StageResult:
    """What one stage did tonight (`stages/<stage>.json`, and in report.json's `stages`): its
    status (done, partial, skipped), why it was skipped, and how long it took. Each stage's
    subclass adds its own fields; `to_dict` writes the keys the stage has always written."""

    STAGE: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1

    status: str = "done"
    reason: str | None = None
    seconds: float | None = None
    version: int = VERSION

    @property
    def skipped(self) -> bool:
        return self.status == "skipped"

    @property
    def failures(self) -> list[StageFailure]:
        return []

    def fields(self) -> dict[str, Any]:
        """The stage's own keys, in the order they are written."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"version": self.VERSION, "status": self.status}
        if self.reason is not None:
            data["reason"] = self.reason
        data.update(self.fields())
        if self.seconds is not None:
            data["seconds"] = self.seconds
        return data

    @classmethod
    def read_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageResult:
        what = f"the {cls.STAGE or 'stage'} stage's result"
        data = _mapping(data, what)
        seconds = data.get("seconds")
        return cls(
            status=_text(data, "status", what), reason=data.get("reason"),
            seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
            version=_version(data, cls, what), **cls.read_fields(data),
        )  # fmt: skip


@dataclass
class CompactResult(StageResult):
    STAGE: ClassVar[str] = "compact"

    files: int = 0
    spans: int = 0
    parts: int = 0
    lake: str | None = None  # the lake's fingerprint after compaction

    def fields(self) -> dict[str, Any]:
        if self.skipped:
            return {}
        return {"files": self.files, "spans": self.spans, "parts": self.parts, "lake": self.lake}

    @classmethod
    def read_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "files": _int(data, "files", "the compact stage's result"),
            "spans": _int(data, "spans", "the compact stage's result"),
            "parts": _int(data, "parts", "the compact stage's result"),
            "lake": data.get("lake"),
        }  # fmt: skip


@dataclass
class AnalyzeResult(StageResult):
    STAGE: ClassVar[str] = "analyze"

    lake: str | None = None  # the lake's fingerprint the analysis read
    runs: dict[str, int] | None = None  # gaps.json's `runs` (done only)
    gaps: list[str] | None = None  # the gaps' ids (done only)

    def fields(self) -> dict[str, Any]:
        data: dict[str, Any] = {"lake": self.lake}
        if self.runs is not None:
            data["runs"] = self.runs
        if self.gaps is not None:
            data["gaps"] = self.gaps
        return data

    @classmethod
    def read_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        runs = data.get("runs")
        return {
            "lake": data.get("lake"),
            "runs": dict(runs) if isinstance(runs, Mapping) else None,
            "gaps": _strings(data, "gaps") if "gaps" in data else None,
        }


@dataclass
class SynthesizeResult(StageResult):
    STAGE: ClassVar[str] = "synthesize"

    gaps_hash: str | None = None  # of the gaps.json synthesis read
    environments: list[str] | None = None  # None: a skipped stage that knows of no synthesis
    rejected: list[str] = field(default_factory=list)
    not_synthesizable: list[str] = field(default_factory=list)
    # synthesis.pipeline.GapWithoutEnvironment records, parsed where they are shown (a damaged
    # one is reported as such, not fatal to the night)
    without_environment: list[dict[str, Any]] | None = None

    @property
    def says_what_it_left(self) -> bool:
        """Whether it lists its environments and the gaps without one: a stage that ran does;
        a skipped one does when the last synthesis of the same gaps is on record."""
        if not self.skipped:
            return True
        return self.environments is not None or self.without_environment is not None

    def fields(self) -> dict[str, Any]:
        data: dict[str, Any] = {"gaps_hash": self.gaps_hash}
        if self.skipped:
            if self.says_what_it_left:
                data["environments"] = self.environments or []
                data["without_environment"] = self.without_environment or []
            return data
        return {
            **data, "environments": self.environments or [], "rejected": self.rejected,
            "not_synthesizable": self.not_synthesizable,
            "without_environment": self.without_environment or [],
        }  # fmt: skip

    @classmethod
    def read_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        without = data.get("without_environment")
        return {
            "gaps_hash": data.get("gaps_hash"),
            "environments": _strings(data, "environments") if "environments" in data else None,
            "rejected": _strings(data, "rejected"),
            "not_synthesizable": _strings(data, "not_synthesizable"),
            "without_environment": list(without) if isinstance(without, list) else None,
        }


@dataclass
class TrainResult(StageResult):
    STAGE: ClassVar[str] = "train"

    trained: list[str] = field(default_factory=list)  # adapter ids trained tonight
    kept: list[str] = field(default_factory=list)  # adapters whose inputs did not change
    failed: list[StageFailure] = field(default_factory=list)
    model: str | None = None  # the base model's folder

    @property
    def failures(self) -> list[StageFailure]:
        return self.failed

    def fields(self) -> dict[str, Any]:
        data: dict[str, Any] = {"trained": self.trained, "kept": self.kept}
        if self.skipped:
            return data
        return {**data, "failed": [f.to_dict() for f in self.failed], "model": self.model}

    @classmethod
    def read_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "trained": _strings(data, "trained"), "kept": _strings(data, "kept"),
            "failed": [StageFailure.from_dict(f) for f in data.get("failed") or []],
            "model": data.get("model"),
        }  # fmt: skip


@dataclass
class EvaluateResult(StageResult):
    STAGE: ClassVar[str] = "evaluate"

    rows: list[EvaluationRow] = field(default_factory=list)
    routing: RoutingAccuracy | None = None  # None: no embedder, so no router
    failed: list[StageFailure] = field(default_factory=list)

    @property
    def failures(self) -> list[StageFailure]:
        return self.failed

    def fields(self) -> dict[str, Any]:
        rows = [row.to_dict() for row in self.rows]
        if self.skipped:
            return {"rows": rows}
        routing = self.routing.to_dict() if self.routing is not None else None
        return {"rows": rows, "routing": routing, "failed": [f.to_dict() for f in self.failed]}

    @classmethod
    def read_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "rows": _rows(data.get("rows")),
            "routing": _routing(data.get("routing")),
            "failed": [StageFailure.from_dict(f) for f in data.get("failed") or []],
        }


def _rows(data: Any) -> list[EvaluationRow]:
    return [EvaluationRow.from_dict(row) for row in data or []]


def _routing(data: Any) -> RoutingAccuracy | None:
    return RoutingAccuracy.from_dict(data) if isinstance(data, Mapping) else None


@dataclass
class ReportResult(StageResult):
    STAGE: ClassVar[str] = "report"

    report: str | None = None  # the report.json it wrote

    def fields(self) -> dict[str, Any]:
        return {"report": self.report}

    @classmethod
    def read_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return {"report": data.get("report")}


STAGE_RESULTS: dict[str, type[StageResult]] = {
    cls.STAGE: cls
    for cls in (
        CompactResult, AnalyzeResult, SynthesizeResult, TrainResult, EvaluateResult, ReportResult
    )
}  # fmt: skip


def stage_result(stage: str, data: Mapping[str, Any]) -> StageResult:
    """A stage's result document read back (`stages/<stage>.json`, report.json's `stages`)."""
    if stage not in STAGE_RESULTS:
        raise NightlyDocumentError(f"no nightly stage {stage!r} (stages: {', '.join(STAGES)})")
    return STAGE_RESULTS[stage].from_dict(data)


@dataclass
class ReportAdapter:
    """One adapter as the night's report lists it."""

    adapter_id: str
    capability: str
    promoted: bool | None = None
    promotion: str | None = None
    data_hash: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "adapter_id": self.adapter_id, "capability": self.capability,
            "promoted": self.promoted, "promotion": self.promotion, "data_hash": self.data_hash,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReportAdapter:
        data = _mapping(data, "an adapter of the nightly report")
        return cls(
            adapter_id=_text(data, "adapter_id", "an adapter of the nightly report"),
            capability=str(data.get("capability", "")), promoted=data.get("promoted"),
            promotion=data.get("promotion"), data_hash=data.get("data_hash"),
        )  # fmt: skip


@dataclass
class NightlyReport:
    """The night's data (`nightly/<date>/report.json`, for dashboards): the config, every
    stage's result but the report's own (the evaluation rows apart), the rows, the routing
    accuracy and the adapters."""

    VERSION: ClassVar[int] = 1

    date: str
    home: str = ""
    config: dict[str, Any] = field(default_factory=dict)  # NightlyConfig.to_dict()
    stages: dict[str, StageResult] = field(default_factory=dict)
    evaluation: list[EvaluationRow] = field(default_factory=list)
    routing: RoutingAccuracy | None = None
    adapters: list[ReportAdapter] = field(default_factory=list)
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        stages = {
            name: {k: v for k, v in result.to_dict().items() if k != "rows"}
            for name, result in self.stages.items()
        }
        return {
            "version": self.VERSION, "date": self.date, "home": self.home, "config": self.config,
            "stages": stages, "evaluation": [row.to_dict() for row in self.evaluation],
            "routing": self.routing.to_dict() if self.routing is not None else None,
            "adapters": [a.to_dict() for a in self.adapters],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NightlyReport:
        data = _mapping(data, "the nightly report")
        stages = _mapping(data.get("stages") or {}, "the nightly report's stages")
        return cls(
            date=_text(data, "date", "the nightly report"), home=str(data.get("home", "")),
            config=dict(data.get("config") or {}),
            stages={name: stage_result(name, result) for name, result in stages.items()},
            evaluation=_rows(data.get("evaluation")), routing=_routing(data.get("routing")),
            adapters=[ReportAdapter.from_dict(a) for a in data.get("adapters") or []],
            version=_version(data, cls, "the nightly report"),
        )  # fmt: skip


@dataclass
class NightlyState:
    """What the last completed night read (`nightly/state.json`): the next night skips the
    stages whose inputs are the same."""

    VERSION: ClassVar[int] = 1

    date: str | None = None
    finished_at: str | None = None
    lake: str | None = None  # the lake's fingerprint
    gaps_hash: str | None = None  # of gaps.json
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.VERSION, "date": self.date, "finished_at": self.finished_at,
            "lake": self.lake, "gaps_hash": self.gaps_hash,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NightlyState:
        data = _mapping(data, "the nightly state")
        return cls(
            date=data.get("date"), finished_at=data.get("finished_at"), lake=data.get("lake"),
            gaps_hash=data.get("gaps_hash"), version=_version(data, cls, "the nightly state"),
        )  # fmt: skip

    @classmethod
    def read(cls, home: str | os.PathLike[str] | Home) -> NightlyState:
        """The state under `home`; an empty one when there is none or it cannot be read (the
        next night then redoes every stage, as a first night does)."""
        try:
            return cls.from_dict(read_json(Home.at(home).nightly_state, {}))
        except (OSError, DocumentError):
            return cls()


@dataclass
class NightRecord:
    """One night, as a line of `nightly/history.jsonl`."""

    VERSION: ClassVar[int] = 1

    date: str
    finished_at: str | None = None
    stages: dict[str, str] = field(default_factory=dict)  # each stage's status
    gaps_without_environment: int = 0
    report: str | None = None  # the night's report.json
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.VERSION, "date": self.date, "finished_at": self.finished_at,
            "stages": self.stages, "gaps_without_environment": self.gaps_without_environment,
            "report": self.report,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NightRecord:
        what = "a nightly history line"
        data = _mapping(data, what)
        stages = _mapping(data.get("stages") or {}, f"{what}'s stages")
        return cls(
            date=_text(data, "date", what), finished_at=data.get("finished_at"),
            stages={str(k): str(v) for k, v in stages.items()},
            gaps_without_environment=_int(data, "gaps_without_environment", what),
            report=data.get("report"), version=_version(data, cls, what),
        )  # fmt: skip


def read_history(
    home: str | os.PathLike[str] | Home, *, skip_damaged: bool = False
) -> list[NightRecord]:
    """Every night in `nightly/history.jsonl`, oldest first. A line that is not a night (cut
    short by a crash, edited by hand) raises NightlyDocumentError naming the file and line, or
    with `skip_damaged` is left out (a page that shows the nights)."""
    path = Home.at(home).nightly_history
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    nights = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            nights.append(NightRecord.from_dict(json.loads(line)))
        except (ValueError, NightlyDocumentError) as error:
            if skip_damaged:
                continue
            raise NightlyDocumentError(f"{path} line {number}: {error}") from None
    return nights


__all__ = [
    "STAGES",
    "STAGE_RESULTS",
    "AnalyzeResult",
    "CompactResult",
    "EvaluateResult",
    "NightRecord",
    "NightlyDocumentError",
    "NightlyReport",
    "NightlyState",
    "ReportAdapter",
    "ReportResult",
    "StageFailure",
    "StageResult",
    "SynthesizeResult",
    "TrainResult",
    "read_history",
    "stage_result",
]
