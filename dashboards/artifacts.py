"""The batch job's files the dashboard shows: gaps.json, the environment and adapter
registries, the nightly history. Read on demand (they are small), never written; a missing or
broken file reads as empty plus a note, so one bad artifact never takes a page down."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracegym.analysis.gap import Gap, GapsDocument
from tracegym.store.home import GAPS_FILE, DocumentError, Home, read_json

if TYPE_CHECKING:
    from tracegym.jobs.nightly import NightlyReport, NightRecord
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
    """One night of the batch job as the pages show it: its line of `nightly/history.jsonl`
    (the latest line of its date) and its report.json, as jobs.nightly reads them."""

    record: NightRecord
    report: NightlyReport  # the parts of report.json that read; empty when there is none

    @property
    def date(self) -> str:
        return self.record.date

    @property
    def stages(self) -> dict[str, str]:
        """Each stage's status, from the history line."""
        return self.record.stages

    @property
    def evaluation(self) -> tuple[EvaluationRow, ...]:
        return tuple(self.report.evaluation)

    @property
    def routing(self) -> RoutingAccuracy | None:
        return self.report.routing

    @property
    def without_environment(self) -> tuple[Mapping[str, Any], ...]:
        """The synthesis stage's `synthesis.pipeline.GapWithoutEnvironment` records, parsed
        where they are shown (a record this version cannot read is shown as it is)."""
        from tracegym.jobs.nightly import SynthesizeResult

        synthesize = self.report.stages.get("synthesize")
        if not isinstance(synthesize, SynthesizeResult):
            return ()
        records = synthesize.without_environment or []
        return tuple(item for item in records if isinstance(item, Mapping))


def _report(date: str, data: Mapping[str, Any]) -> NightlyReport:
    """report.json as a NightlyReport; when it does not read whole, the parts that do (each
    evaluation row, the routing accuracy, each stage's result), so one damaged row never hides
    the night."""
    from tracegym.jobs.nightly import NightlyReport, stage_result
    from tracegym.training.evaluate import EvaluationRow
    from tracegym.training.router import RoutingAccuracy

    try:
        return NightlyReport.from_dict(data)
    except Exception:  # a damaged part: read the parts the pages show one by one
        pass
    rows = []
    for row in data.get("evaluation") or []:
        try:
            rows.append(EvaluationRow.from_dict(row))
        except (ValueError, TypeError):
            continue
    try:
        accuracy = RoutingAccuracy.from_dict(data["routing"]) if data.get("routing") else None
    except ValueError:  # RoutingError
        accuracy = None
    stages = data.get("stages")
    results = {}
    for name, result in stages.items() if isinstance(stages, Mapping) else ():
        try:
            results[str(name)] = stage_result(str(name), result)
        except Exception:  # a damaged stage's result must not hide the rest
            continue
    return NightlyReport(date=date, stages=results, evaluation=rows, routing=accuracy)


def nightly_history(home: Path) -> list[Night]:
    """The nights of `<home>/nightly/history.jsonl` (`jobs.nightly.read_history`), newest
    first, each with its report.json when readable; lines that are not a night (cut short,
    edited by hand) are skipped."""
    from tracegym.jobs.nightly import NightlyReport, read_history

    paths = Home.at(home)
    records = read_history(paths, skip_damaged=True)
    by_date = {record.date: record for record in records}  # the latest record of a date wins
    out = []
    for date in sorted(by_date, reverse=True):
        record = by_date[date]
        candidate = Path(record.report) if isinstance(record.report, str) else None
        if candidate is not None and not candidate.is_absolute():
            candidate = paths.root / candidate
        report = NightlyReport(date=date)
        for where in (paths.night_report(date), candidate):
            if where is not None and where.is_file():
                data, _ = _read_json(where)
                if isinstance(data, Mapping):
                    report = _report(date, data)
                    break
        out.append(Night(record, report))
    return out


def routing(nights: list[Night]) -> dict[str, Any] | None:
    """The latest routing accuracy a night measured ({"accuracy", "n", "date"})."""
    for night in nights:
        if night.routing is not None:
            return {"accuracy": night.routing.accuracy, "n": night.routing.n, "date": night.date}
    return None
