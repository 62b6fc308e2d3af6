"""`synthesize(home)`: gaps.json -> validated, calibrated environments under `<home>/envs/`.

For every gap: pick the family from its detector, infer the tools' schemas, roles and flows from
the traces in the store (or, when the store holds none of the gap's tools, from its argument
patterns), build the environment, run the validity checks, calibrate the knobs against `policy`
when one is given, and register it. Gaps no family fits, or whose tools cannot express the
family, are reported as not synthesizable with the reason; environments failing validity are
reported as rejected with the failed checks. Nothing crashes on one bad gap.

Every gap that gets no environment is also a typed `GapWithoutEnvironment` (where it stopped
and why), and the report is kept at `<home>/envs/synthesis.json`, so the nightly report and
the dashboard can say why without rerunning synthesis.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from tracegym.analysis.gap import Gap, GapsDocument
from tracegym.store.home import (
    SYNTHESIS_REPORT_FILE,
    DocumentError,
    Home,
    read_json,
    write_json,
)
from tracegym.synthesis.base import Policy
from tracegym.synthesis.calibrate import calibrate
from tracegym.synthesis.conventions import Conventions, conventions_from_store
from tracegym.synthesis.families import build_spec, family_for_gap
from tracegym.synthesis.registry import (
    CalibrationSummary,
    from_spec,
    register,
    unregister,
)
from tracegym.synthesis.spec import Catalog, catalog_from_patterns, catalog_from_store
from tracegym.synthesis.validity import ValidityReport, check_environment
from tracegym.synthesis.world import NotSynthesizable

GAPS_VERSION = GapsDocument.VERSION


class GapsFileError(ValueError):
    """gaps.json is missing or malformed (the message names the file and the problem)."""


def read_gaps(path: str | Path) -> tuple[list[Gap], list[GapWithoutEnvironment]]:
    """The gaps of a gaps.json document (docs/gaps.md, `analysis.gap.GapsDocument`), and the
    records that are not gaps (synthesis reports them, the others go on). GapsFileError when
    the document itself is unusable."""
    path = Path(path)
    if not path.exists():
        raise GapsFileError(
            f"{path} does not exist: run `tracegym analyze` first (it writes "
            "gaps.json), or pass --gaps PATH"
        )
    if not path.is_file():
        raise GapsFileError(f"{path} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GapsFileError(f"cannot read {path}: {exc}") from None
    try:  # parsed here, not by store.home.read_json, to name the line and column in these words
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GapsFileError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    try:
        document = GapsDocument.from_dict(data)
    except DocumentError as exc:
        raise GapsFileError(f"{path}: {exc}") from None
    unusable = [
        GapWithoutEnvironment(
            gap_id=str(record.gap_id),
            gap_name=record.name,
            detector=None,
            stage=StopStage.UNUSABLE,
            reason=record.reason,
        )
        for record in document.not_gaps
    ]
    return list(document.gaps), unusable


def load_gaps(path: str | Path) -> list[Gap]:
    """The gaps of a gaps.json document that are usable (see `read_gaps`)."""
    return read_gaps(path)[0]


class StopStage(str, Enum):
    """Where a gap's way to an environment stopped."""

    UNUSABLE = "unusable"  # the gaps.json record is not a usable gap
    NO_FAMILY = "no_family"  # no family serves its detector
    NOT_SYNTHESIZABLE = "not_synthesizable"  # the family cannot express it with these tools
    CALIBRATION = "calibration"  # calibrating the knobs against the policy failed
    VALIDITY = "validity"  # built, but failed validity checks
    FIDELITY = "fidelity"  # built, valid otherwise, but not faithful to the traces
    REGISTRATION = "registration"  # valid, but writing it under envs/ failed

    @property
    def label(self) -> str:
        return _STAGE_LABELS[self]


_STAGE_LABELS = {
    StopStage.UNUSABLE: "not a usable gap",
    StopStage.NO_FAMILY: "no family",
    StopStage.NOT_SYNTHESIZABLE: "not synthesizable",
    StopStage.CALIBRATION: "calibration failed",
    StopStage.VALIDITY: "validity failed",
    StopStage.FIDELITY: "fidelity failed",
    StopStage.REGISTRATION: "registration failed",
}


@dataclass(frozen=True)
class GapWithoutEnvironment:
    """A gap that got no environment: where it stopped and why (the reason is the family's or
    the checks' own words; `failed_checks` names the validity checks that failed)."""

    gap_id: str
    gap_name: str | None
    detector: str | None
    stage: StopStage
    reason: str
    failed_checks: tuple[str, ...] = ()
    env_id: str | None = None
    family: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "stage": self.stage.value,
            "failed_checks": list(self.failed_checks),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GapWithoutEnvironment:
        """SynthesisRecordError (a ValueError) on a record that is not one (a stage we do not
        know, no gap id)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("gap_id"), str):
            raise SynthesisRecordError(f"not a gap-without-environment record: {data!r:.200}")

        def text(name: str) -> str | None:
            value = data.get(name)
            return None if value is None else str(value)

        try:
            stage = StopStage(data.get("stage"))
        except ValueError:
            raise SynthesisRecordError(
                f"gap {data['gap_id']!r}: unknown stage {data.get('stage')!r}"
            ) from None
        return cls(
            gap_id=data["gap_id"],
            gap_name=text("gap_name"),
            detector=text("detector"),
            stage=stage,
            reason=str(data.get("reason") or ""),
            failed_checks=tuple(str(c) for c in data.get("failed_checks") or ()),
            env_id=text("env_id"),
            family=text("family"),
        )


class SynthesisRecordError(DocumentError):
    """synthesis.json (or one of its rows) cannot be read as a synthesis report."""


def _text(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    return None if value is None else str(value)


def _row(data: Any, kind: str) -> Mapping[str, Any]:
    """`data` when it is a row naming its gap, else SynthesisRecordError naming the list."""
    if not isinstance(data, Mapping):
        raise SynthesisRecordError(f"{kind}: a row must be an object, got {type(data).__name__}")
    if not isinstance(data.get("gap_id"), str):
        raise SynthesisRecordError(f"{kind}: a row without a 'gap_id': {data!r:.200}")
    return data


def _strings(data: Mapping[str, Any], name: str, where: str) -> list[str]:
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise SynthesisRecordError(f"{where}: {name!r} must be a list")
    return [str(v) for v in value]


@dataclass(frozen=True)
class SynthesizedEnvironment:
    """A gap that got an environment: which, where it was registered, its knobs, what each
    validity check said and how it was calibrated (`envs/synthesis.json`'s `environments`)."""

    gap_id: str
    name: str | None
    detector: str | None
    env_id: str
    family: str
    path: str
    action: str | None
    knobs: dict[str, Any] = field(default_factory=dict)
    validity: dict[str, str] = field(default_factory=dict)  # check name -> its detail
    calibration: CalibrationSummary | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "gap_id": self.gap_id,
            "name": self.name,
            "detector": self.detector,
            "env_id": self.env_id,
            "family": self.family,
            "path": self.path,
            "action": self.action,
            "knobs": dict(self.knobs),
            "validity": dict(self.validity),
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SynthesizedEnvironment:
        data = _row(data, "environments")
        where = f"environments: gap {data['gap_id']!r}"
        for name in ("env_id", "family"):
            if not isinstance(data.get(name), str):
                raise SynthesisRecordError(f"{where}: {name!r} must be a string")
        for name in ("knobs", "validity", "calibration"):
            if data.get(name) is not None and not isinstance(data[name], Mapping):
                raise SynthesisRecordError(f"{where}: {name!r} must be an object")
        calibration = data.get("calibration")
        try:
            summary = None if calibration is None else CalibrationSummary.from_dict(calibration)
        except ValueError as exc:
            raise SynthesisRecordError(f"{where}: {exc}") from None
        return cls(
            gap_id=data["gap_id"],
            name=_text(data, "name"),
            detector=_text(data, "detector"),
            env_id=data["env_id"],
            family=data["family"],
            path=str(data.get("path") or ""),
            action=_text(data, "action"),
            knobs=dict(data.get("knobs") or {}),
            validity={str(k): str(v) for k, v in (data.get("validity") or {}).items()},
            calibration=summary,
        )


@dataclass(frozen=True)
class RejectedEnvironment:
    """A gap whose environment was built but not registered: the failed checks, or the error
    (`envs/synthesis.json`'s `rejected`)."""

    gap_id: str
    name: str | None
    detector: str | None
    env_id: str | None
    family: str | None
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gap_id": self.gap_id,
            "name": self.name,
            "detector": self.detector,
            "env_id": self.env_id,
            "family": self.family,
            "failures": list(self.failures),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RejectedEnvironment:
        data = _row(data, "rejected")
        return cls(
            gap_id=data["gap_id"],
            name=_text(data, "name"),
            detector=_text(data, "detector"),
            env_id=_text(data, "env_id"),
            family=_text(data, "family"),
            failures=_strings(data, "failures", f"rejected: gap {data['gap_id']!r}"),
        )


@dataclass(frozen=True)
class UnsynthesizedGap:
    """A gap no environment was built for, and why (`envs/synthesis.json`'s
    `not_synthesizable`)."""

    gap_id: str
    name: str | None
    detector: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "gap_id": self.gap_id,
            "name": self.name,
            "detector": self.detector,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UnsynthesizedGap:
        data = _row(data, "not_synthesizable")
        return cls(
            gap_id=data["gap_id"],
            name=_text(data, "name"),
            detector=_text(data, "detector"),
            reason=str(data.get("reason") or ""),
        )


@dataclass
class SynthesisReport:
    """What one synthesis did with each gap; `envs/synthesis.json` is its `to_dict()`."""

    VERSION = 1

    home: str
    gaps_path: str
    environments: list[SynthesizedEnvironment] = field(default_factory=list)
    rejected: list[RejectedEnvironment] = field(default_factory=list)  # built, not registered
    not_synthesizable: list[UnsynthesizedGap] = field(default_factory=list)
    catalog_source: str = ""
    conventions: dict[str, Any] = field(default_factory=dict)  # what environments follow
    # every gap that got no environment, typed (each is also in one of the two lists above)
    without_environment: list[GapWithoutEnvironment] = field(default_factory=list)
    gaps_hash: str | None = None  # of the gaps.json read (`gaps_hash`)
    generated_at: str | None = None  # set when it is written (`write_report`)
    version: int = VERSION

    def body(self) -> dict[str, Any]:
        """The report without its version and time (what `tracegym synthesize --json` prints)."""
        return {
            "home": self.home,
            "gaps_path": self.gaps_path,
            "environments": [e.to_dict() for e in self.environments],
            "rejected": [r.to_dict() for r in self.rejected],
            "not_synthesizable": [n.to_dict() for n in self.not_synthesizable],
            "catalog_source": self.catalog_source,
            "conventions": dict(self.conventions),
            "without_environment": [w.to_dict() for w in self.without_environment],
            "gaps_hash": self.gaps_hash,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "generated_at": self.generated_at, **self.body()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SynthesisReport:
        """SynthesisRecordError naming the list and the row that is not one."""
        if not isinstance(data, Mapping):
            raise SynthesisRecordError(
                f"a synthesis report must be an object, got {type(data).__name__}"
            )
        version = data.get("version", 0)
        if not isinstance(version, int) or version > cls.VERSION:
            raise SynthesisRecordError(
                f"synthesis report version {version!r} is not supported "
                f"(this tracegym reads up to {cls.VERSION})"
            )

        def rows(name: str) -> list[Any]:
            value = data.get(name)
            if value is None:
                return []
            if not isinstance(value, list):
                raise SynthesisRecordError(f"{name!r} must be a list, got {type(value).__name__}")
            return value

        conventions = data.get("conventions")
        return cls(
            home=str(data.get("home") or ""),
            gaps_path=str(data.get("gaps_path") or ""),
            environments=[SynthesizedEnvironment.from_dict(e) for e in rows("environments")],
            rejected=[RejectedEnvironment.from_dict(r) for r in rows("rejected")],
            not_synthesizable=[UnsynthesizedGap.from_dict(n) for n in rows("not_synthesizable")],
            catalog_source=str(data.get("catalog_source") or ""),
            conventions=dict(conventions) if isinstance(conventions, Mapping) else {},
            without_environment=[
                GapWithoutEnvironment.from_dict(w) for w in rows("without_environment")
            ],
            gaps_hash=_text(data, "gaps_hash"),
            generated_at=_text(data, "generated_at"),
            version=cls.VERSION,
        )

    def stopped(
        self,
        record: GapWithoutEnvironment,
        failures: list[str] | None = None,
    ) -> None:
        """Record a gap that got no environment: in `without_environment`, and in the list
        the report's earlier readers know (`not_synthesizable`, or `rejected` once built)."""
        self.without_environment.append(record)
        if record.env_id is None:
            self.not_synthesizable.append(
                UnsynthesizedGap(record.gap_id, record.gap_name, record.detector, record.reason)
            )
            return
        self.rejected.append(
            RejectedEnvironment(
                gap_id=record.gap_id,
                name=record.gap_name,
                detector=record.detector,
                env_id=record.env_id,
                family=record.family,
                failures=failures or [record.reason],
            )
        )


def _has_store(home: Path) -> bool:
    paths = Home.at(home)
    return paths.lake.exists() or paths.spool.exists()


def _store_catalog(home: Path) -> Catalog | None:
    if not _has_store(home):
        return None
    try:
        catalog = catalog_from_store(home)
    except ImportError:
        return None
    return catalog if catalog.tools else None


def _store_conventions(home: Path) -> Conventions:
    if not _has_store(home):
        return Conventions()
    try:
        return conventions_from_store(home)
    except ImportError:
        return Conventions()


def synthesize(
    home: str | Path,
    gaps_path: str | Path | None = None,
    policy: Policy | Callable[[], Policy] | None = None,
    *,
    catalog: Catalog | None = None,
    conventions: Conventions | None = None,
    n_train: int = 500,
    n_heldout: int = 200,
    validity_seeds: int = 200,
    calibration_seeds: int = 40,
    k: int = 4,
    policy_name: str | None = None,
) -> SynthesisReport:
    """Turn each gap of `gaps_path` (default `<home>/gaps.json`) into a registered environment.

    `policy` (a callable, or a zero-argument factory of one) calibrates the knobs; without it
    each family's default knobs are kept. `catalog` overrides the tools inferred from the store,
    `conventions` the agent's conventions mined from it (see synthesis.conventions).
    """
    home = Path(home)
    gaps_file = Path(gaps_path) if gaps_path is not None else Home.at(home).gaps
    gaps, unusable = read_gaps(gaps_file)
    report = SynthesisReport(str(home), str(gaps_file), gaps_hash=gaps_hash(gaps_file))
    for record in unusable:
        report.stopped(record)
    store_catalog = catalog if catalog is not None else _store_catalog(home)
    report.catalog_source = (
        "given"
        if catalog is not None
        else f"store ({store_catalog.traces} traces)"
        if store_catalog
        else "the gaps' argument patterns"
    )
    if conventions is None:
        conventions = _store_conventions(home)
    report.conventions = conventions.to_dict()
    for gap in gaps:
        try:
            family_for_gap(gap)
        except Exception as exc:  # NotSynthesizable, or a gap we did not foresee
            reason = (
                str(exc)
                if isinstance(exc, NotSynthesizable)
                else _failed("finding its family", exc)
            )
            report.stopped(_without(gap, StopStage.NO_FAMILY, reason))
            continue
        try:
            gap_catalog = store_catalog or catalog_from_patterns(
                list(gap.argument_patterns), list(gap.tools)
            )
            spec = build_spec(gap, gap_catalog, conventions)
        except NotSynthesizable as exc:
            report.stopped(_without(gap, StopStage.NOT_SYNTHESIZABLE, str(exc)))
            continue
        except Exception as exc:  # a gap we did not foresee must not stop the others
            report.stopped(
                _without(gap, StopStage.NOT_SYNTHESIZABLE, _failed("building the environment", exc))
            )
            continue
        built = {"env_id": spec.env_id, "family": spec.family}
        stage = StopStage.NOT_SYNTHESIZABLE  # until the environment is built from its spec
        try:
            env = from_spec(spec)
            calibration = None
            if policy is not None:
                stage = StopStage.CALIBRATION
                chosen = policy() if _is_factory(policy) else policy
                result = calibrate(env, chosen, n_seeds=calibration_seeds, k=k)
                calibration = {**result.to_dict(), "policy": policy_name or _name(chosen)}
                env = from_spec(spec, **result.knobs)
            stage = StopStage.VALIDITY
            validity = check_environment(env, validity_seeds)
            if not validity.ok:
                failed = failed_checks(validity)
                report.stopped(
                    _without(gap, validity_stage(failed), "; ".join(validity.failures),
                             failed_checks=failed, **built),
                    failures=validity.failures,
                )  # fmt: skip
                unregister(home, spec.env_id, missing_ok=True)
                continue
            stage = StopStage.REGISTRATION
            path = register(
                home,
                env,
                validity=validity,
                calibration=calibration,
                n_train=n_train,
                n_heldout=n_heldout,
            )
        except Exception as exc:
            report.stopped(_without(gap, stage, f"{type(exc).__name__}: {exc}", **built))
            continue
        report.environments.append(
            SynthesizedEnvironment(
                gap_id=gap.id,
                name=gap.name,
                detector=gap.detector,
                env_id=spec.env_id,
                family=spec.family,
                path=str(path),
                action=spec.roles.get("action"),
                knobs=env.knobs,
                validity={c.name: c.detail for c in validity.checks},
                calibration=None
                if calibration is None
                else CalibrationSummary(**{k_: calibration[k_] for k_ in CalibrationSummary.KEYS}),
            )
        )
    write_report(home, report)
    return report


def _failed(what: str, exc: Exception) -> str:
    return f"{what} failed: {type(exc).__name__}: {exc}"


def _without(gap: Gap, stage: StopStage, reason: str, **more: Any) -> GapWithoutEnvironment:
    return GapWithoutEnvironment(gap.id, gap.name, gap.detector, stage, reason, **more)


def failed_checks(validity: ValidityReport) -> tuple[str, ...]:
    """The names of the checks that failed (whatever checks the validity module runs)."""
    return tuple(c.name for c in validity.checks if not c.ok)


def validity_stage(failed: tuple[str, ...]) -> StopStage:
    """FIDELITY when fidelity is the only check that failed, else VALIDITY."""
    return StopStage.FIDELITY if failed and set(failed) == {"fidelity"} else StopStage.VALIDITY


# The last synthesis, kept for the nightly report and the dashboard ------------------------------
REPORT_FILE = SYNTHESIS_REPORT_FILE
REPORT_VERSION = SynthesisReport.VERSION


def report_path(home: str | Path) -> Path:
    return Home.at(home).synthesis_report


def gaps_hash(path: str | Path) -> str | None:
    """The gaps file's content hash (the nightly's, so the two compare)."""
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def write_report(home: str | Path, report: SynthesisReport) -> Path:
    """`<home>/envs/synthesis.json`, written atomically (a reader never sees half of it)."""
    path = report_path(home)
    report.generated_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_json(path, report.to_dict(), indent=2)
    return path


@dataclass(frozen=True)
class LastSynthesis:
    """What `<home>/envs/synthesis.json` says: when, on which gaps, and the gaps that got no
    environment (records that do not read as one are left out and counted)."""

    generated_at: str | None
    gaps_path: str | None
    gaps_hash: str | None
    environments: tuple[str, ...]
    without_environment: tuple[GapWithoutEnvironment, ...]
    unreadable: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LastSynthesis:
        """The parts of a synthesis report the nightly and the dashboard show; rows that do not
        read are skipped (and the gaps without an environment among them counted), so one
        damaged row does not hide the rest."""
        if not isinstance(data, Mapping) or data.get("version") != REPORT_VERSION:
            raise SynthesisRecordError(f"not a synthesis report of version {REPORT_VERSION}")
        records, unreadable = [], 0
        for item in data.get("without_environment") or []:
            try:
                records.append(GapWithoutEnvironment.from_dict(item))
            except ValueError:
                unreadable += 1
        return cls(
            generated_at=data.get("generated_at"),
            gaps_path=data.get("gaps_path"),
            gaps_hash=data.get("gaps_hash"),
            environments=tuple(
                str(e.get("env_id")) for e in data.get("environments") or [] if isinstance(e, dict)
            ),
            without_environment=tuple(records),
            unreadable=unreadable,
        )


def read_report(home: str | Path) -> SynthesisReport | None:
    """The last synthesis report of `home` in full, None when there was none
    (SynthesisRecordError naming the file and the row when it cannot be read)."""
    path = report_path(home)
    try:
        data = read_json(path, default=None)
        return None if data is None else SynthesisReport.from_dict(data)
    except (OSError, DocumentError) as exc:
        raise SynthesisRecordError(f"cannot read {path}: {exc}") from None


def last_synthesis(home: str | Path) -> LastSynthesis | None:
    """The last synthesis of `home`, None when there was none (SynthesisRecordError when its
    file is broken)."""
    path = report_path(home)
    try:
        data = read_json(path, default=None)
    except (OSError, DocumentError) as exc:
        raise SynthesisRecordError(f"cannot read {path}: {exc}") from None
    if data is None:
        return None
    try:
        return LastSynthesis.from_dict(data)
    except SynthesisRecordError:
        raise SynthesisRecordError(
            f"{path} is not a synthesis report of version {REPORT_VERSION}"
        ) from None


def _is_factory(policy: Any) -> bool:
    """A zero-argument callable (a policy class or factory) rather than a policy."""
    if isinstance(policy, type):
        return True
    import inspect

    try:
        params = inspect.signature(policy).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [
        p
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return not required


def _name(policy: Any) -> str:
    return getattr(policy, "__name__", None) or type(policy).__name__


__all__ = [
    "GapWithoutEnvironment",
    "GapsFileError",
    "LastSynthesis",
    "RejectedEnvironment",
    "StopStage",
    "SynthesisRecordError",
    "SynthesisReport",
    "SynthesizedEnvironment",
    "UnsynthesizedGap",
    "gaps_hash",
    "last_synthesis",
    "load_gaps",
    "read_gaps",
    "read_report",
    "report_path",
    "synthesize",
    "write_report",
]
