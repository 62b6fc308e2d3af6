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

Secrets are redacted before anything is written, through the tracer's one redaction path
(`tracegym.tracer.redact.redact_record`: span and event names, attributes at any depth, event
and link attributes, status messages, resources), as the OTLP receiver does.

Memory stays bounded by the input: a file larger than `max_bytes` (default `DEFAULT_MAX_BYTES`,
or TRACEGYM_IMPORT_MAX_BYTES) is refused before it is read, gzip input is unpacked by a
streaming reader that stops at the same limit of unpacked bytes (a gzip bomb is refused, never
unpacked), a format with an `iter_records` (the JSON-lines ones) is read and converted a line
at a time, and each record is kept as its encoded spool line, not as Python objects, until the
whole import has converted.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import io
import json
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracegym.store.home import Home
from tracegym.store.records import encode_records, write_spool_bytes
from tracegym.tracer.redact import Redactor, redact_records
from tracegym.tracer.semconv import OUTCOME_SPAN_NAME as OUTCOME
from tracegym.tracer.spool_files import iter_spool

DEFAULT_MAX_BYTES = 256 * 2**20  # per file, and per file unpacked from gzip
MAX_BYTES_ENV = "TRACEGYM_IMPORT_MAX_BYTES"

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
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


def max_bytes_from_env() -> int:
    """The per-file input limit: TRACEGYM_IMPORT_MAX_BYTES when set (a positive integer),
    else DEFAULT_MAX_BYTES."""
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_BYTES_ENV}={raw!r}: expected a number of bytes") from None
    if value <= 0:
        raise ValueError(f"{MAX_BYTES_ENV}={raw!r}: expected a positive number of bytes")
    return value


def _over(path: Path, what: str, limit: int) -> ImportFormatError:
    return ImportFormatError(
        path,
        f"{what} over the import limit of {limit} bytes "
        f"(raise it with --max-bytes or {MAX_BYTES_ENV})",
    )


def read_input(path: Path, limit: int) -> bytes:
    """The file's bytes, refused (before reading) when larger than `limit`."""
    size = path.stat().st_size
    if size > limit:
        raise _over(path, f"{size} bytes,", limit)
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:  # grew while we looked
        raise _over(path, "more than that many bytes,", limit)
    return data


def gunzip(path: Path, data: bytes, limit: int) -> bytes:
    """`data` unpacked when it is gzip, by a streaming reader that stops past `limit`
    unpacked bytes: a bomb (a few MB unpacking to GBs) is refused, never unpacked whole."""
    if data[:2] != _GZIP_MAGIC:
        return data
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            while chunk := stream.read(_CHUNK):
                out += chunk
                if len(out) > limit:
                    raise _over(path, "unpacks to", limit)
    except (OSError, EOFError, zlib.error) as exc:
        raise ImportFormatError(path, f"corrupt gzip data: {exc}") from None
    return bytes(out)


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
    """(line number, parsed object) for each non-empty line of a JSONL file, parsed as it is
    reached (a caller that drops each object holds one line's objects at a time)."""
    for number, line in enumerate(io.BytesIO(data), 1):
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


def _streaming_converter(fmt: str) -> Callable[..., Iterable[dict[str, Any]]]:
    """The format's `iter_records` (records as they are made) where it has one, else its
    `convert`."""
    module = importlib.import_module(FORMATS[fmt][0])
    streaming = getattr(module, "iter_records", None)
    return streaming if streaming is not None and fmt != "tau2-bench" else converter(fmt)


@dataclass(slots=True)
class _Line:
    """One converted record, kept encoded: what the duplicate checks need, and its spool
    line (a few times smaller than the record's Python objects)."""

    trace_id: str
    span_id: str
    outcome: tuple[Any, Any] | None  # an outcome's (time, attributes as stored)
    data: bytes


_ENCODE_CHUNK = 256  # records redacted together, then encoded and dropped


def _encode_chunk(
    chunk: list[dict[str, Any]], redactor: Redactor | None, lines: list[_Line]
) -> None:
    """Redact `chunk`, append its records to `lines` as encoded lines, and empty it."""
    if redactor is not None:
        redact_records(chunk, redactor)
    for record in chunk:
        stored = None
        if record["name"] == OUTCOME:  # as the store gives it back, to compare with its own
            attributes = json.loads(json.dumps(record["attributes"], default=str))
            stored = (record["start_ns"], attributes)
        encoded = encode_records([record])
        lines.append(_Line(record["trace_id"], record["span_id"], stored, encoded))
    chunk.clear()


def _convert(
    convert: Callable[..., Iterable[dict[str, Any]]],
    file: Path,
    data: bytes,
    kwargs: dict[str, Any],
    redactor: Redactor | None,
    skip_traces: set[str],
    runs: set[str],
) -> list[_Line]:
    """`convert(file, data)`'s records, redacted and encoded one at a time, less the spans of
    runs in `skip_traces`; `runs` gets the trace id of every run met. Hostile shapes are
    turned into the format error naming the file: json and every importer recurse over nested
    input, so a few KB of brackets would otherwise end the command in a RecursionError
    traceback."""
    lines: list[_Line] = []
    chunk: list[dict[str, Any]] = []
    try:
        for record in convert(file, data, **kwargs):
            if record["name"] != OUTCOME:
                runs.add(record["trace_id"])
                if record["trace_id"] in skip_traces:
                    continue
            chunk.append(record)
            if len(chunk) >= _ENCODE_CHUNK:
                _encode_chunk(chunk, redactor, lines)
        _encode_chunk(chunk, redactor, lines)
    except RecursionError:
        raise ImportFormatError(file, TOO_DEEP) from None
    except MemoryError:
        raise ImportFormatError(file, TOO_BIG) from None
    return lines


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
    paths = Home.at(home)
    if not trace_ids or not (paths.spool.is_dir() or paths.lake.is_dir()):
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
    home: Path, pending: list[tuple[str, list[_Line], set[str]]], report: ImportReport
) -> list[tuple[str, list[_Line], set[str]]]:
    """`pending` less what the store already holds (see the module docstring); `report` counts
    the records left out and corrects its run and span counts."""
    traces = {r.trace_id for _, lines, _ in pending for r in lines}
    spans, outcomes = _stored(home, traces)
    if not spans and not outcomes:
        return pending
    kept = []
    for digest, lines, runs in pending:
        counted = {r.trace_id for r in lines if r.outcome is None}
        fresh = []
        for r in lines:
            key = (r.trace_id, r.span_id)
            known = key in spans if r.outcome is None else r.outcome in outcomes.get(key, [])
            if known:
                report.repeated_spans += 1
                if r.outcome is None:
                    report.spans -= 1
            else:
                fresh.append(r)
        whole = counted - {r.trace_id for r in fresh if r.outcome is None}
        report.runs -= len(whole)
        report.repeated_runs += len(whole)
        kept.append((digest, fresh, runs))
    return kept


def import_path(
    fmt: str,
    path: Path | str,
    home: Path | str,
    *,
    labels: Path | str | None = None,
    redact: bool = True,
    max_bytes: int | None = None,
) -> ImportReport:
    """Import every file of `fmt` under `path` into the spool of `home`; all or nothing.

    A file already imported (same format, bytes and labels) is skipped; a run already imported
    from another file (same trace id) is not written again, though its outcome is, so labels
    given later still arrive (the latest outcome of a run wins in the views). Spans the store
    already holds (traced, received or imported) are not written again either; `repeated_spans`
    counts them, and a run all of whose spans were there counts in `repeated_runs`.

    Secrets are redacted before anything is written (`redact=False` keeps them). A file larger
    than `max_bytes` (default: TRACEGYM_IMPORT_MAX_BYTES, else DEFAULT_MAX_BYTES), or gzip
    unpacking to more, is an ImportFormatError, so nothing is imported.
    """
    limit = max_bytes_from_env() if max_bytes is None else max_bytes
    if limit <= 0:
        raise ValueError(f"max_bytes must be positive, got {limit}")
    convert = _streaming_converter(fmt)
    path, home = Path(path), Path(home)
    registry = Home.at(home).imports
    labels_bytes = Path(labels).read_bytes() if labels is not None else b""
    kwargs = {"labels": Path(labels)} if labels is not None else {}
    redactor = Redactor() if redact else None
    known = _known_traces(registry)
    report = ImportReport(fmt)
    pending: list[tuple[str, list[_Line], set[str]]] = []
    for file in _files(path, FORMATS[fmt][1]):
        data = read_input(file, limit)
        digest = hashlib.sha256(b"\0".join([fmt.encode(), data, labels_bytes])).hexdigest()[:20]
        if (registry / digest).exists():
            report.already_imported.append(file)
            continue
        data = gunzip(file, data, limit)
        runs: set[str] = set()
        try:
            lines = _convert(convert, file, data, kwargs, redactor, known, runs)
        except SkipFile as skip:
            report.skipped.append((file, skip.reason))
            continue
        del data
        repeated = runs & known
        if repeated:
            report.repeated_runs += len(repeated)
        known |= runs
        pending.append((digest, lines, runs))
        report.files += 1
        report.spans += sum(1 for r in lines if r.outcome is None)
        report.runs += len(runs - repeated)
    pending = _new_in_store(home, pending, report)
    registry.mkdir(parents=True, exist_ok=True)
    for digest, lines, runs in pending:
        if lines:  # a file whose every record the store holds adds no spool file
            data = (r.data for r in lines)
            report.spool_files.append(write_spool_bytes(home, data, f"import-{fmt}-{digest}"))
        (registry / digest).write_text("\n".join([fmt, *sorted(runs)]) + "\n")
    return report
