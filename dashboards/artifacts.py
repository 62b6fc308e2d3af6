"""The batch job's files the dashboard shows: gaps.json, the environment and adapter
registries, the nightly history. Read on demand (they are small), never written; a missing or
broken file reads as empty plus a note, so one bad artifact never takes a page down."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracegym.analysis.gap import Gap, GapsDocument
from tracegym.store.home import GAPS_FILE, DocumentError, Home, read_json

if TYPE_CHECKING:
    from tracegym.synthesis.pipeline import LastSynthesis
    from tracegym.synthesis.registry import EnvironmentDetail, EnvironmentEntry
    from tracegym.training.adapters import AdapterMetadata
    from tracegym.training.evaluate import EvaluationRow
    from tracegym.training.router import RoutingAccuracy


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


def last_synthesis(home: Path) -> tuple[LastSynthesis | None, str | None]:
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
class EnvironmentView:
    """What the environment page shows: the registry's detail (entry, spec, validity report,
    calibration record) and a sample task with its oracle episode, or why there is none."""

    detail: EnvironmentDetail
    sample: dict[str, Any] | None
    sample_error: str | None = None


def environment_detail(home: Path, env_id: str) -> EnvironmentView:
    """One environment, and a sample task with its oracle episode (computed by the
    environment's own code, deterministic per seed). RegistryError (a LookupError) when it is
    not registered."""
    from tracegym.synthesis import registry

    detail = registry.detail(home, env_id)
    try:
        return EnvironmentView(detail, registry.sample(home, env_id))
    except Exception as exc:  # the page shows the rest and says why
        return EnvironmentView(detail, None, f"{type(exc).__name__}: {exc}")


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


@dataclass(frozen=True)
class Night:
    """One night of the batch job as the pages show it: the stages' statuses from its line of
    `nightly/history.jsonl` (the latest line of its date), and from its report.json the
    held-out evaluation rows, the routing accuracy and the gaps synthesis gave no environment.

    The nightly's own document types (jobs.nightly) sit on the jobs' floor, beside the
    dashboard's and not below it, so the report is read here down to the typed rows it holds:
    `training.evaluate.EvaluationRow`, `training.router.RoutingAccuracy`, and the
    `synthesis.pipeline.GapWithoutEnvironment` records (parsed where they are shown)."""

    date: str
    stages: dict[str, str] = field(default_factory=dict)
    evaluation: tuple[EvaluationRow, ...] = ()
    routing: RoutingAccuracy | None = None
    without_environment: tuple[Mapping[str, Any], ...] = ()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _night(record: Mapping[str, Any], report: Mapping[str, Any]) -> Night:
    """A history line and its report (empty when unreadable); parts that do not read as their
    type are left out, so one damaged row never hides the night."""
    from tracegym.training.evaluate import EvaluationRow
    from tracegym.training.router import RoutingAccuracy

    rows = []
    for row in report.get("evaluation") or []:
        try:
            rows.append(EvaluationRow.from_dict(row))
        except (ValueError, TypeError):  # EvaluationError, or a number that is not one
            continue
    measured = report.get("routing") or _mapping(report.get("evaluate")).get("routing")
    try:
        accuracy = RoutingAccuracy.from_dict(measured) if isinstance(measured, Mapping) else None
    except ValueError:  # RoutingError
        accuracy = None
    synthesize = _mapping(_mapping(report.get("stages")).get("synthesize"))
    without = synthesize.get("without_environment")
    return Night(
        date=str(record["date"]),
        stages={str(k): str(v) for k, v in _mapping(record.get("stages")).items()},
        evaluation=tuple(rows),
        routing=accuracy,
        without_environment=tuple(
            item
            for item in (without if isinstance(without, list) else [])
            if isinstance(item, Mapping)
        ),
    )


def nightly_history(home: Path) -> list[Night]:
    """`<home>/nightly/history.jsonl`, newest first, each night with its report.json when
    readable; lines that are not a night (cut short, edited by hand) are skipped."""
    paths = Home.at(home)
    if not paths.nightly_history.exists():
        return []
    by_date: dict[str, Mapping[str, Any]] = {}
    for line in paths.nightly_history.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, Mapping) and isinstance(record.get("date"), str):
            by_date[record["date"]] = record  # the latest record of a date wins
    out = []
    for date in sorted(by_date, reverse=True):
        record = by_date[date]
        named = record.get("report")
        candidate = Path(named) if isinstance(named, str) else None
        if candidate is not None and not candidate.is_absolute():
            candidate = paths.root / candidate
        report: Mapping[str, Any] = {}
        for where in (paths.night_report(date), candidate):
            if where is not None and where.is_file():
                data, _ = _read_json(where)
                if isinstance(data, Mapping):
                    report = data
                    break
        out.append(_night(record, report))
    return out


def routing(nights: list[Night]) -> dict[str, Any] | None:
    """The latest routing accuracy a night measured ({"accuracy", "n", "date"})."""
    for night in nights:
        if night.routing is not None:
            return {"accuracy": night.routing.accuracy, "n": night.routing.n, "date": night.date}
    return None
