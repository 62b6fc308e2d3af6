"""Building spool records and writing them, for everything that is not the live tracer.

The OTLP receiver and the importers produce the same lines as the tracer's spool exporter
(`tracegym.tracer.spool.span_record`), so compaction and the views treat all sources alike.
Two ways to write: `write_spool_file` (all or nothing: a batch becomes one new, complete spool
file by an atomic rename) and `SpoolAppender` (a long-lived writer such as the receiver: whole
lines per request in one append, under the same lock rule as the tracer).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tracegym.store.home import Home
from tracegym.tracer import semconv as sc
from tracegym.tracer.spool_files import SPOOL_VERSION, SpoolWriter

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def stable_id(*parts: Any, width: int = 32) -> str:
    """A deterministic hex id (trace ids: 32, span ids: 16) from `parts`, never all zeros.

    Importers derive ids from the source (file hash, run index, message index), so importing
    the same run twice yields the same spans.
    """
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:width]
    return digest if digest.strip("0") else "1".rjust(width, "0")


def random_id(width: int = 32) -> str:
    return secrets.token_hex(width // 2)


def _owned_dict(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """A plain dict as it is (records are encoded, never mutated), anything else copied."""
    return value if type(value) is dict else dict(value or {})


def span_record(
    *,
    trace_id: str,
    span_id: str,
    name: str,
    start_ns: int,
    end_ns: int,
    parent_span_id: str | None = None,
    kind: str = "INTERNAL",
    status: str = "UNSET",
    status_message: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    events: Iterable[Mapping[str, Any]] = (),
    links: Iterable[Mapping[str, Any]] = (),
    resource: Mapping[str, Any] | None = None,
    scope: str | None = None,
) -> dict[str, Any]:
    """One spool line, with the same fields as the tracer writes (see docs/spool.md).

    Plain dicts and lists are used as they are, not copied: the OTLP receiver builds a fresh
    one per span, and this sits on its hot path.
    """
    return {
        "v": SPOOL_VERSION,
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent_span_id,
        "name": name,
        "kind": kind,
        "start_ns": int(start_ns),
        "end_ns": int(end_ns),
        "status": status,
        "status_message": status_message,
        "attributes": _owned_dict(attributes),
        "events": events if type(events) is list else [dict(e) for e in events],
        "links": links if type(links) is list else [dict(link) for link in links],
        "resource": _owned_dict(resource),
        "scope": scope,
    }


def encode_records(records: Iterable[Mapping[str, Any]]) -> bytes:
    """Records as JSON lines, each ending in a newline."""
    return "".join(_encode(r) + "\n" for r in records).encode("utf-8", "replace")


def write_spool_file(home: Path, records: Iterable[Mapping[str, Any]], stem: str) -> Path:
    """Write `records` as one new spool file, all or nothing.

    The data goes to a temporary name, is fsynced, and is renamed into place: readers never see
    a half-written file, and a crash leaves only a `.tmp` that nothing reads.
    """
    return write_spool_bytes(home, encode_records(records), stem)


def write_spool_bytes(home: Path, data: bytes | Iterable[bytes], stem: str) -> Path:
    """`write_spool_file` for records already encoded (`encode_records`): one bytes object, or
    pieces written one after the other (never joined in memory)."""
    directory = Home.at(home).spool
    directory.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)[:120]
    final = directory / f"{safe}.jsonl"
    tmp = directory / f".{safe}.{secrets.token_hex(4)}.jsonl.tmp"
    with open(tmp, "wb") as handle:
        if isinstance(data, bytes):
            handle.write(data)
        else:
            handle.writelines(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    return final


class SpoolAppender:
    """Appends batches of records to this process's own spool file (the OTLP receiver)."""

    def __init__(self, home: Path, **writer_options: Any) -> None:
        self._writer = SpoolWriter(home, **writer_options)

    def append(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Append all of `records` in one write; returns how many. Raises OSError on failure."""
        records = list(records)
        if records:
            self._writer.write(encode_records(records))
        return len(records)

    def close(self) -> None:
        self._writer.close()


def outcome_record(
    target: str,
    *,
    time_ns: int,
    success: bool | None = None,
    reward: float | None = None,
    source: str = "import",
    labels: Any = None,
    resource: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An outcome as the tracer records it: a `tracegym.outcome` span in a trace of its own.

    `target` is the run id or trace id the outcome belongs to. The outcome's own ids derive
    from the target and content, so re-importing it yields the same span.
    """
    attributes: dict[str, Any] = {sc.OPERATION: sc.OP_OUTCOME, sc.OUTCOME_TARGET: target}
    if success is not None:
        attributes[sc.OUTCOME_SUCCESS] = bool(success)
    if reward is not None:
        attributes[sc.OUTCOME_REWARD] = float(reward)
    attributes[sc.OUTCOME_SOURCE] = source
    if labels is not None:
        attributes[sc.OUTCOME_LABELS] = labels if isinstance(labels, str) else _encode(labels)
    return span_record(
        trace_id=stable_id("outcome", target, source),
        span_id=stable_id("outcome", target, source, width=16),
        name=sc.OUTCOME_SPAN_NAME,
        start_ns=time_ns,
        end_ns=time_ns,
        attributes=attributes,
        resource=resource,
        scope="tracegym.import",
    )
