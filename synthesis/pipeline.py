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
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from tracegym.analysis.gap import Gap, GapError
from tracegym.synthesis.base import Policy
from tracegym.synthesis.calibrate import calibrate
from tracegym.synthesis.conventions import Conventions, conventions_from_store
from tracegym.synthesis.families import build_spec, family_for_gap
from tracegym.synthesis.registry import from_spec, register, unregister
from tracegym.synthesis.spec import Catalog, catalog_from_patterns, catalog_from_store
from tracegym.synthesis.validity import ValidityReport, check_environment
from tracegym.synthesis.world import NotSynthesizable

GAPS_VERSION = 1


class GapsFileError(ValueError):
    """gaps.json is missing or malformed (the message names the file and the problem)."""


def read_gaps(path: str | Path) -> tuple[list[Gap], list[GapWithoutEnvironment]]:
    """The gaps of a gaps.json document (docs/gaps.md), and the records that are not gaps
    (synthesis reports them, the others go on). GapsFileError when the document itself is
    unusable."""
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
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GapsFileError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(document, dict):
        raise GapsFileError(
            f"{path}: expected a JSON object with a 'gaps' list "
            f"(docs/gaps.md), got {type(document).__name__}"
        )
    version = document.get("version")
    if version != GAPS_VERSION:
        raise GapsFileError(
            f"{path}: gaps.json version {version!r} is not supported (expected {GAPS_VERSION})"
        )
    records = document.get("gaps")
    if not isinstance(records, list):
        raise GapsFileError(f"{path}: 'gaps' must be a list, got {type(records).__name__}")
    gaps: list[Gap] = []
    unusable: list[GapWithoutEnvironment] = []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise GapsFileError(f"{path}: gaps[{i}] must be an object, got {type(record).__name__}")
        if not isinstance(record.get("id"), str) or not record["id"].strip():
            raise GapsFileError(f"{path}: gaps[{i}] has no 'id' string")
        if not (record.get("key") or record.get("detector")):
            raise GapsFileError(
                f"{path}: gaps[{i}] ({record['id']}) has neither 'key' nor 'detector'"
            )
        for name in ("tools", "argument_patterns", "examples", "members", "signatures"):
            if name in record and not isinstance(record[name], list):
                raise GapsFileError(f"{path}: gaps[{i}] ({record['id']}): '{name}' must be a list")
        try:
            gaps.append(Gap.from_dict(record))
        except GapError as exc:
            name = record.get("name")
            unusable.append(
                GapWithoutEnvironment(
                    gap_id=record["id"],
                    gap_name=name if isinstance(name, str) else None,
                    detector=None,
                    stage=StopStage.UNUSABLE,
                    reason=str(exc),
                )
            )
    return gaps, unusable


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
        """ValueError on a record that is not one (a stage we do not know, no gap id)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("gap_id"), str):
            raise ValueError(f"not a gap-without-environment record: {data!r:.200}")

        def text(name: str) -> str | None:
            value = data.get(name)
            return None if value is None else str(value)

        return cls(
            gap_id=data["gap_id"],
            gap_name=text("gap_name"),
            detector=text("detector"),
            stage=StopStage(data.get("stage")),
            reason=str(data.get("reason") or ""),
            failed_checks=tuple(str(c) for c in data.get("failed_checks") or ()),
            env_id=text("env_id"),
            family=text("family"),
        )


@dataclass
class SynthesisReport:
    home: str
    gaps_path: str
    environments: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)  # built, failed validity
    not_synthesizable: list[dict[str, Any]] = field(default_factory=list)
    catalog_source: str = ""
    conventions: dict[str, Any] = field(default_factory=dict)  # what environments follow
    # every gap that got no environment, typed (each is also in one of the two lists above)
    without_environment: list[GapWithoutEnvironment] = field(default_factory=list)
    gaps_hash: str | None = None  # of the gaps.json read (`gaps_hash`)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["without_environment"] = [w.to_dict() for w in self.without_environment]
        return data

    def stopped(
        self,
        record: GapWithoutEnvironment,
        failures: list[str] | None = None,
    ) -> None:
        """Record a gap that got no environment: in `without_environment`, and in the list
        the report's earlier readers know (`not_synthesizable`, or `rejected` once built)."""
        self.without_environment.append(record)
        ref = {"gap_id": record.gap_id, "name": record.gap_name, "detector": record.detector}
        if record.env_id is None:
            self.not_synthesizable.append({**ref, "reason": record.reason})
            return
        self.rejected.append(
            {
                **ref,
                "env_id": record.env_id,
                "family": record.family,
                "failures": failures or [record.reason],
            }
        )


def _gap_ref(gap: Gap) -> dict[str, Any]:
    return {"gap_id": gap.id, "name": gap.name, "detector": gap.detector}


def _store_catalog(home: Path) -> Catalog | None:
    if not (home / "lake").exists() and not (home / "spool").exists():
        return None
    try:
        catalog = catalog_from_store(home)
    except ImportError:
        return None
    return catalog if catalog.tools else None


def _store_conventions(home: Path) -> Conventions:
    if not (home / "lake").exists() and not (home / "spool").exists():
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
    gaps_file = Path(gaps_path) if gaps_path is not None else home / "gaps.json"
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
        ref = _gap_ref(gap)
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
            {
                **ref,
                **built,
                "path": str(path),
                "action": spec.roles.get("action"),
                "knobs": env.knobs,
                "validity": {c.name: c.detail for c in validity.checks},
                "calibration": None
                if calibration is None
                else {
                    k_: calibration[k_]
                    for k_ in ("pass_at_1", "pass_at_k", "k", "in_band", "policy")
                },
            }
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
REPORT_FILE = "synthesis.json"
REPORT_VERSION = 1


def report_path(home: str | Path) -> Path:
    return Path(home) / "envs" / REPORT_FILE


def gaps_hash(path: str | Path) -> str | None:
    """The gaps file's content hash (the nightly's, so the two compare)."""
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def write_report(home: str | Path, report: SynthesisReport) -> Path:
    """`<home>/envs/synthesis.json`, written atomically (a reader never sees half of it)."""
    path = report_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "version": REPORT_VERSION,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **report.to_dict(),
    }
    fd, tmp = tempfile.mkstemp(prefix=".synthesis.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2, ensure_ascii=False, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
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


class SynthesisRecordError(ValueError):
    """synthesis.json exists but cannot be read as one."""


def last_synthesis(home: str | Path) -> LastSynthesis | None:
    """The last synthesis of `home`, None when there was none (SynthesisRecordError when its
    file is broken)."""
    path = report_path(home)
    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SynthesisRecordError(f"cannot read {path}: {exc}") from None
    if not isinstance(document, dict) or document.get("version") != REPORT_VERSION:
        raise SynthesisRecordError(f"{path} is not a synthesis report of version {REPORT_VERSION}")
    records, unreadable = [], 0
    for item in document.get("without_environment") or []:
        try:
            records.append(GapWithoutEnvironment.from_dict(item))
        except ValueError:
            unreadable += 1
    return LastSynthesis(
        generated_at=document.get("generated_at"),
        gaps_path=document.get("gaps_path"),
        gaps_hash=document.get("gaps_hash"),
        environments=tuple(
            str(e.get("env_id")) for e in document.get("environments") or [] if isinstance(e, dict)
        ),
        without_environment=tuple(records),
        unreadable=unreadable,
    )


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
    "StopStage",
    "SynthesisRecordError",
    "SynthesisReport",
    "gaps_hash",
    "last_synthesis",
    "load_gaps",
    "read_gaps",
    "report_path",
    "synthesize",
    "write_report",
]
