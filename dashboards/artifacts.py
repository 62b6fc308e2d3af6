"""The batch job's files the dashboard shows: gaps.json, the environment and adapter
registries, the nightly history. Read on demand (they are small), never written; a missing or
broken file reads as empty plus a note, so one bad artifact never takes a page down."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracegym.analysis.gap import Gap, GapsDocument
from tracegym.store.home import (
    ENVIRONMENT_CALIBRATION_FILE,
    GAPS_FILE,
    DocumentError,
    Home,
    read_json,
)

if TYPE_CHECKING:
    from tracegym.synthesis.registry import EnvironmentEntry
    from tracegym.synthesis.validity import ValidityReport
    from tracegym.training.adapters import AdapterMetadata


def _read_json(path: Path) -> tuple[Any, str | None]:
    """(the document, None), (None, None) when there is none, (None, why) when it is damaged:
    a page shows the note rather than failing."""
    try:
        return read_json(path, None), None
    except DocumentError as exc:  # names the file already
        return None, str(exc)
    except (OSError, ValueError) as exc:  # unreadable, or not UTF-8
        return None, f"cannot read {path.name}: {exc}"


def gaps_document(home: Path) -> tuple[GapsDocument, str | None]:
    """gaps.json (docs/gaps.md), or an empty document and why. Records of its `gaps` that are
    not gaps are kept aside (`not_gaps`, see `gaps`), not a reason to show none."""
    try:
        return GapsDocument.read(home, strict=False), None
    except FileNotFoundError:
        return GapsDocument(), "no gaps.json yet: run `tracegym analyze`"
    except DocumentError as exc:  # names the file and what is wrong with it
        return GapsDocument(), str(exc)
    except (OSError, ValueError) as exc:  # unreadable, or not UTF-8
        return GapsDocument(), f"cannot read {GAPS_FILE}: {exc}"


def gaps(document: GapsDocument) -> tuple[list[Gap], str | None]:
    """The document's gaps, and a note naming the records that are not gaps (left out)."""
    bad = [f"{b.gap_id or '?'} ({b.reason})" for b in document.not_gaps]
    return list(document.gaps), (f"not gaps, left out: {'; '.join(bad)}" if bad else None)


def gap_evidence(home: Path) -> dict[str, list[dict[str, Any]]]:
    """trace id -> the gaps listing it among their member runs (each member's decisive step
    and evidence, with the gap's id, name and detector)."""
    document, _ = gaps_document(home)
    out: dict[str, list[dict[str, Any]]] = {}
    for gap in gaps(document)[0]:
        for member in gap.members:
            out.setdefault(member.trace_id, []).append(
                {
                    **member.to_dict(),
                    "gap_id": gap.id,
                    "gap_name": gap.name,
                    "detector": gap.detector,
                }
            )
    return out


def environments(home: Path) -> tuple[list[EnvironmentEntry], str | None]:
    """The registry's index entries (synthesis/registry.py)."""
    try:
        from tracegym.synthesis.registry import list_envs

        return list_envs(home), None
    except Exception as exc:  # a broken index must not break the page
        return [], f"cannot read the environment registry: {exc}"


def last_synthesis(home: Path) -> tuple[Any, str | None]:
    """The last synthesis (`synthesis.pipeline.LastSynthesis`: the gaps that got no
    environment and why), None when there was none, and a note when it cannot be read or
    gaps.json changed since."""
    from tracegym.synthesis.pipeline import SynthesisRecordError, gaps_hash
    from tracegym.synthesis.pipeline import last_synthesis as read

    try:
        last = read(home)
    except SynthesisRecordError as exc:
        return None, str(exc)
    except Exception as exc:  # a broken record must not break the page
        return None, f"cannot read the last synthesis: {type(exc).__name__}: {exc}"
    if last is None:
        return None, None
    notes = []
    if last.unreadable:
        notes.append(f"{last.unreadable} record(s) of the synthesis report could not be read")
    current = gaps_hash(Home.at(home).gaps)
    if last.gaps_hash is not None and current is not None and current != last.gaps_hash:
        notes.append(
            "gaps.json changed since this synthesis: run `tracegym synthesize` to bring "
            "the environments up to date"
        )
    return last, "; ".join(notes) or None


@dataclass(frozen=True)
class EnvironmentDetail:
    """What the environment page shows: the index entry, the spec (as JSON), the validity
    report and calibration record it was registered with, and a sample task with its oracle
    episode (or why there is none)."""

    entry: EnvironmentEntry
    spec: dict[str, Any]
    validity: ValidityReport | None
    calibration: dict[str, Any] | None  # calibration.json as written (synthesis/calibrate.py)
    sample: dict[str, Any] | None
    sample_error: str | None = None


def environment_detail(home: Path, env_id: str) -> EnvironmentDetail:
    """One environment: entry, spec, validity, calibration, and a sample task with its oracle
    episode (computed by the environment's own code, deterministic per seed). RegistryError
    (a LookupError) when there is no such environment."""
    from tracegym.synthesis import registry

    entry = registry.entry(home, env_id)
    spec = registry.load_spec(home, env_id).to_dict()
    validity = registry.read_validity(home, env_id)
    calibration = read_json(Home.at(home).environment(env_id) / ENVIRONMENT_CALIBRATION_FILE, None)
    try:
        sample, error = registry.sample(home, env_id), None
    except Exception as exc:
        sample, error = None, f"{type(exc).__name__}: {exc}"
    return EnvironmentDetail(entry, spec, validity, calibration, sample, error)


def adapters(home: Path) -> list[AdapterMetadata]:
    """Every adapter's meta.json (training/adapters.py); half-written folders and documents
    that are not adapter metadata are skipped."""
    from tracegym.training.adapters import metadata

    root = Home.at(home).adapters
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(root.iterdir()):
        if folder.name.startswith("."):
            continue
        try:
            out.append(metadata(home, folder.name))
        except (LookupError, OSError, ValueError):  # missing, unreadable or not metadata
            continue
    return out


def nightly_history(home: Path) -> list[dict[str, Any]]:
    """`<home>/nightly/history.jsonl`, newest first, each with its report.json when readable."""
    home = Home.at(home)
    path = home.nightly_history
    if not path.exists():
        return []
    nights = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            night = json.loads(line)
        except ValueError:
            continue
        if isinstance(night, dict):
            nights.append(night)
    by_date: dict[str, dict[str, Any]] = {}
    for night in nights:
        by_date[str(night.get("date"))] = night  # the latest record of a date wins
    out = sorted(by_date.values(), key=lambda n: str(n.get("date")), reverse=True)
    for night in out:
        report = night.get("report")
        candidate = Path(report) if isinstance(report, str) else None
        if candidate is not None and not candidate.is_absolute():
            candidate = home.root / candidate
        own = home.night(str(night.get("date"))) / "report.json"
        for path in (own, candidate):
            if path is not None and path.is_file():
                data, _ = _read_json(path)
                if isinstance(data, dict):
                    night["report_data"] = data
                    break
    return out


def routing(nights: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The latest routing accuracy a night measured ({"accuracy", "n", ...})."""
    for night in nights:
        data = night.get("report_data") or {}
        value = data.get("routing") or (data.get("evaluate") or {}).get("routing")
        if isinstance(value, dict):
            return {**value, "date": night.get("date")}
    return None
