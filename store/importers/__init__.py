"""`tracegym import FORMAT PATH`: recorded runs of other agents, turned into traces.

Each format is a module with one function,

    convert(path: Path, data: bytes, *, labels: Path | None = None) -> list[dict]

returning spool records (`tracegym.store.records.span_record` / `outcome_record`) for one
source file, or raising `ImportFormatError` that names the file and the record (`SkipFile`, a
kind of it, for a file that is of the format but holds no run: the driver imports the others and
reports it with the reason). The driver
here converts every file first and writes nothing if any fails (nothing half-imported); input
nested deeper than Python can recurse (a few KB of `[[[...]]]`), or too big for memory, is such
a format error too, whichever importer meets it (`_convert`). Each
source file then becomes one spool file, written atomically, named after the hash of its bytes,
and remembered under `<home>/imports/`, so importing the same file twice adds nothing.
Span and trace ids derive from the file hash and positions, so they are stable too.

Nothing already in the store is written again, whatever brought it there (the tracer, the OTLP
receiver, an earlier import): a span whose trace and span ids the store holds is skipped, and an
outcome only when the store holds the same one (same ids, time and attributes: a later import
with new labels reuses the outcome's ids, and its labels must still arrive). This is what makes
`tracegym export otlp-json` output importable back into the home it came from. The check reads
the store's views (lake and spool) where DuckDB is installed, else the spool alone (a lake is
only ever written with DuckDB).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracegym.store.records import write_spool_file
from tracegym.tracer.semconv import OUTCOME_SPAN_NAME as OUTCOME
from tracegym.tracer.spool_files import iter_spool

# Format name -> (module, file suffixes looked for when PATH is a folder).
FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tau-bench": ("tracegym.store.importers.tau", (".json",)),
    "tau2-bench": ("tracegym.store.importers.tau", (".json",)),
    "whowhen": ("tracegym.store.importers.whowhen", (".json",)),
    "agentracer": ("tracegym.store.importers.agentracer", (".json",)),
    "medagentbench": ("tracegym.store.importers.medagentbench", (".json",)),
    "swe-agent": ("tracegym.store.importers.swe_agent", (".traj", ".json")),
    "openai-chat": ("tracegym.store.importers.openai_chat", (".json", ".jsonl")),
    "otlp-json": ("tracegym.store.importers.otlp_json", (".json", ".jsonl")),
}


class ImportFormatError(ValueError):
    """The input is not what the format expects; the message names the file and record."""

    def __init__(self, path: Path | str, message: str, record: Any = None) -> None:
        where = f"{path}" if record is None else f"{path} (record {record})"
        super().__init__(f"{where}: {message}")
        self.path = Path(path)
        self.record = record


class SkipFile(ImportFormatError):
    """The file is of the format but holds no run (e.g. a SWE-agent demonstration): the driver
    imports the other files and reports this one, with the reason, in `ImportReport.skipped`."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(path, reason)
        self.reason = reason


@dataclass
class ImportReport:
    format: str
    files: int = 0
    runs: int = 0
    spans: int = 0
    repeated_runs: int = 0  # runs another file, or the store, had already brought in whole
    repeated_spans: int = 0  # spans (and outcomes) already in the store, not written again
    already_imported: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (file, why it holds no run)
    spool_files: list[Path] = field(default_factory=list)


def _files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
    raise FileNotFoundError(f"{path}: no such file or folder")


TOO_DEEP = "nested too deeply to import (deeper than Python's recursion limit)"
TOO_BIG = "too large to import (out of memory)"


def load_json(path: Path, data: bytes) -> Any:
    """Parse JSON, turning errors into ImportFormatError with the position."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ImportFormatError(path, f"JSON {TOO_DEEP}") from None
    except UnicodeDecodeError as exc:
        raise ImportFormatError(path, f"not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise ImportFormatError(
            path, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


def iter_json_lines(path: Path, data: bytes) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each non-empty line of a JSONL file."""
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except RecursionError:
            raise ImportFormatError(path, f"JSON {TOO_DEEP}", record=f"line {number}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ImportFormatError(path, f"invalid JSON: {exc}", record=f"line {number}") from None


def converter(fmt: str) -> Callable[..., list[dict[str, Any]]]:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    module = importlib.import_module(FORMATS[fmt][0])
    return module.convert if fmt != "tau2-bench" else module.convert_tau2


def _convert(convert: Callable[..., list[dict[str, Any]]], file: Path, data: bytes,
             kwargs: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    """`convert(file, data)`, with hostile shapes turned into the format error naming the file:
    json and every importer recurse over nested input, so a few KB of brackets would otherwise
    end the command in a RecursionError traceback. (Records are encoded later, when written:
    what a converter keeps nested is shallower than what parsed, so that cannot recurse.)"""
    try:
        return convert(file, data, **kwargs)
    except RecursionError:
        raise ImportFormatError(file, TOO_DEEP) from None
    except MemoryError:
        raise ImportFormatError(file, TOO_BIG) from None


def _known_traces(registry: Path) -> set[str]:
    """Trace ids of every run imported so far (the registry files list them after the format)."""
    known: set[str] = set()
    if registry.is_dir():
        for entry in registry.iterdir():
            known.update(entry.read_text().split()[1:])
    return known


def _stored(
    home: Path, trace_ids: set[str]
) -> tuple[set[tuple[str, str]], dict[tuple[str, str], list[tuple[Any, Any]]]]:
    """What the store under `home` holds of `trace_ids`: the (trace id, span id) of its spans,
    and per outcome's ids the (time, attributes) of each copy it holds."""
    spans: set[tuple[str, str]] = set()
    outcomes: dict[tuple[str, str], list[tuple[Any, Any]]] = {}
    if not trace_ids or not any((home / d).is_dir() for d in ("spool", "lake")):
        return spans, outcomes
    try:
        from tracegym.store.store import Store
    except ImportError:  # no DuckDB: no lake either, the spool is all there is
        for record in iter_spool(home):
            if record.get("trace_id") not in trace_ids:
                continue
            key = (record["trace_id"], record["span_id"])
            if record.get("name") == OUTCOME:
                outcomes.setdefault(key, []).append((record.get("start_ns"), record["attributes"]))
            else:
                spans.add(key)
        return spans, outcomes
    wanted = {"traces": sorted(trace_ids)}
    with Store(home, compact_on_open=False) as store:
        query = "SELECT trace_id, span_id FROM spans WHERE trace_id IN (SELECT unnest($traces))"
        spans.update((r["trace_id"], r["span_id"]) for r in store.rows(query, wanted))
        query = (
            "SELECT trace_id, span_id, start_ns, attributes FROM _outcome_spans "
            "WHERE trace_id IN (SELECT unnest($traces))"
        )
        for r in store.rows(query, wanted):
            copy = (r["start_ns"], json.loads(r["attributes"] or "{}"))
            outcomes.setdefault((r["trace_id"], r["span_id"]), []).append(copy)
    return spans, outcomes


def _new_in_store(
    home: Path, pending: list[tuple[str, list[dict[str, Any]], set[str]]], report: ImportReport
) -> list[tuple[str, list[dict[str, Any]], set[str]]]:
    """`pending` less what the store already holds (see the module docstring); `report` counts
    the records left out and corrects its run and span counts."""
    traces = {r["trace_id"] for _, records, _ in pending for r in records}
    spans, outcomes = _stored(home, traces)
    if not spans and not outcomes:
        return pending
    kept = []
    for digest, records, runs in pending:
        counted = {r["trace_id"] for r in records if r["name"] != OUTCOME}
        fresh = []
        for r in records:
            key = (r["trace_id"], r["span_id"])
            if r["name"] == OUTCOME:
                copy = (r["start_ns"], json.loads(json.dumps(r["attributes"], default=str)))
                known = copy in outcomes.get(key, [])
            else:
                known = key in spans
            if known:
                report.repeated_spans += 1
                if r["name"] != OUTCOME:
                    report.spans -= 1
            else:
                fresh.append(r)
        whole = counted - {r["trace_id"] for r in fresh if r["name"] != OUTCOME}
        report.runs -= len(whole)
        report.repeated_runs += len(whole)
        kept.append((digest, fresh, runs))
    return kept


def import_path(
    fmt: str, path: Path | str, home: Path | str, *, labels: Path | str | None = None
) -> ImportReport:
    """Import every file of `fmt` under `path` into the spool of `home`; all or nothing.

    A file already imported (same format, bytes and labels) is skipped; a run already imported
    from another file (same trace id) is not written again, though its outcome is, so labels
    given later still arrive (the latest outcome of a run wins in the views). Spans the store
    already holds (traced, received or imported) are not written again either; `repeated_spans`
    counts them, and a run all of whose spans were there counts in `repeated_runs`.
    """
    convert = converter(fmt)
    path, home = Path(path), Path(home)
    registry = home / "imports"
    labels_bytes = Path(labels).read_bytes() if labels is not None else b""
    kwargs = {"labels": Path(labels)} if labels is not None else {}
    known = _known_traces(registry)
    report = ImportReport(fmt)
    pending: list[tuple[str, list[dict[str, Any]], set[str]]] = []
    for file in _files(path, FORMATS[fmt][1]):
        data = file.read_bytes()
        digest = hashlib.sha256(b"\0".join([fmt.encode(), data, labels_bytes])).hexdigest()[:20]
        if (registry / digest).exists():
            report.already_imported.append(file)
            continue
        try:
            records = _convert(convert, file, data, kwargs)
        except SkipFile as skip:
            report.skipped.append((file, skip.reason))
            continue
        runs = {r["trace_id"] for r in records if r["name"] != OUTCOME}
        repeated = runs & known
        if repeated:
            records = [r for r in records if r["name"] == OUTCOME or r["trace_id"] not in known]
            report.repeated_runs += len(repeated)
        known |= runs
        pending.append((digest, records, runs))
        report.files += 1
        report.spans += sum(1 for r in records if r["name"] != OUTCOME)
        report.runs += len(runs - repeated)
    pending = _new_in_store(home, pending, report)
    registry.mkdir(parents=True, exist_ok=True)
    for digest, records, runs in pending:
        if records:  # a file whose every record the store holds adds no spool file
            report.spool_files.append(write_spool_file(home, records, f"import-{fmt}-{digest}"))
        (registry / digest).write_text("\n".join([fmt, *sorted(runs)]) + "\n")
    return report
