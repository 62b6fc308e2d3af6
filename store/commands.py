"""The store's commands: `tracegym sql`, `traces`, `show`, `compact`, `doctor`, `import`,
`collect`, `export`.

Registered on the main `tracegym` app by `register(app)`; DuckDB and friends are imported
inside each command, so the bare (tracer-only) install keeps a working CLI.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from tracegym.cli_options import HomeOption, existing_home, table_console, writable_home
from tracegym.store.pricing import usd
from tracegym.store.show import clean, clip

# The columns of `tracegym traces`; the last two share what width the others leave.
TRACES_COLUMNS = ("run", "trace", "agent", "started", "ms", "tools", "llm", "errors", "cost",
                  "outcome", "reward", "request", "first error")  # fmt: skip
_NUMERIC = {"ms", "tools", "llm", "errors", "cost", "reward"}


class FtSource(str, Enum):
    runs = "runs"
    demos = "demos"
    all = "all"


class Dialect(str, Enum):
    """The SQL dialects `tracegym views` prints the views in."""

    duckdb = "duckdb"
    spark = "spark"


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"  # one JSON array of row objects
    jsonl = "jsonl"  # one row object per line
    parquet = "parquet"


def _open_store(home: Path, fail: Any, *, compact_on_open: bool = True) -> Any:
    try:
        from tracegym.store.store import Store
    except ImportError as exc:
        fail(f"the store needs the analysis extra: pip install 'tracegym[analysis]' ({exc.name})")
    try:
        return Store(home, compact_on_open=compact_on_open)
    except Exception as exc:  # a broken lake file, a permission problem ...
        fail(f"cannot open the store under {home}: {exc}")


def counted(n: int, noun: str, many: str | None = None) -> str:
    """'1 run', '2 runs', '0 runs': a count with its noun agreeing."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"


def query_error(exc: BaseException) -> str:
    """DuckDB's error in one line, with what to do when the query names an extension."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else repr(exc)
    if "extension" in text.lower() and ("not in the catalog" in text or "not loaded" in text):
        line += " (the store loads no DuckDB extensions: query the views with built-in functions)"
    return line


def _json_default(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def print_rows(columns: list[str], rows: list[tuple], fmt: OutputFormat, console: Console) -> None:
    """Rows as a Rich table (values as plain `Text`, control characters escaped: trace
    content is untrusted, no markup or emoji codes in it are rendered), CSV, a JSON array
    (`json`, what `json.load` reads) or JSON lines (`jsonl`, one object per row)."""
    if fmt is OutputFormat.csv:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
        sys.stdout.write(buffer.getvalue())
    elif fmt in (OutputFormat.json, OutputFormat.jsonl):
        objects = [dict(zip(columns, row, strict=True)) for row in rows]
        if fmt is OutputFormat.json:
            sys.stdout.write(json.dumps(objects, default=_json_default, ensure_ascii=False) + "\n")
        for item in objects if fmt is OutputFormat.jsonl else ():
            sys.stdout.write(json.dumps(item, default=_json_default, ensure_ascii=False) + "\n")
    else:
        table = Table(*columns)
        for row in rows:
            table.add_row(*(Text("" if v is None else clean(str(v), keep_newlines=True))
                            for v in row))  # fmt: skip
        console.print(table)
        console.print(f"{len(rows)} row{'s' if len(rows) != 1 else ''}", style="dim")


def _trace_cell(run_id: str | None, trace_id: str) -> str:
    """The trace column's cell: the trace id's first 12 digits where the run has an id of its
    own; empty where the run id is the trace id (it is in the run column already)."""
    return trace_id[:12] if run_id and run_id != trace_id else ""


def traces_table(rows: list[tuple], requests: dict[str, str], width: int) -> Table:
    """`tracegym traces` rows (trace_id, run_id, then TRACES_COLUMNS after `trace` but request)
    as a table `width` wide: one line per run, ids whole, request and first error cut to fit.
    The trace column lists only trace ids that differ from the run id, and is left out when
    none does (a run without an id of its own is named by its trace id)."""
    cells = []
    for trace_id, run_id, agent, started, ms, *counts, cost, error, verdict, reward in rows:
        cells.append([
            clean(run_id or trace_id[:12]), _trace_cell(run_id, trace_id), clean(agent or "-"),
            started or "-", "-" if ms is None else f"{ms:.1f}", *(str(n) for n in counts),
            usd(cost),
            verdict, "-" if reward is None else f"{reward:g}",
            clip(requests.get(trace_id) or "-", 80, count=False),
            clip(error, 120, count=False) if error else "-",
        ])  # fmt: skip
    names = list(TRACES_COLUMNS)
    if not any(row[1] for row in cells):
        names.remove("trace")
        cells = [[row[0], *row[2:]] for row in cells]
    fixed = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(names[:-2])]
    room = max(24, width - sum(fixed) - 3 * len(names) - 1)
    wanted = [max([len(name), *(len(row[i]) for row in cells)])
              for i, name in enumerate(names) if i >= len(fixed)]  # fmt: skip
    half = room // 2
    if wanted[0] < half:
        wanted[1] = min(wanted[1], room - wanted[0])
    elif wanted[1] < half:
        wanted[0] = min(wanted[0], room - wanted[1])
    else:
        wanted = [half, half]
    table = Table()
    for i, name in enumerate(names):
        table.add_column(
            name, justify="right" if name in _NUMERIC else "left", no_wrap=True,
            overflow="ellipsis", min_width=fixed[i] if i < len(fixed) else None,
            max_width=wanted[i - len(fixed)] if i >= len(fixed) else None,
        )  # fmt: skip
    styles = {"trace": "dim", "outcome": {"failure": "red", "success": "green"}}
    for row in cells:
        texts = []
        for name, value in zip(names, row, strict=True):
            style = styles.get(name, "")
            style = style.get(value, "") if isinstance(style, dict) else style
            if name in ("errors", "first error") and value not in ("0", "-"):
                style = "red"
            texts.append(Text(value, style=style))
        table.add_row(*texts)
    return table


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def text_json(relation: Any) -> Any:
    """`relation` with its JSON columns as VARCHAR, so a Parquet file written from it holds
    plain strings (Polars and Spark read DuckDB's JSON logical type as binary)."""
    columns = list(relation.columns)
    kinds = [str(kind) for kind in relation.types]
    if "JSON" not in kinds:
        return relation
    return relation.project(
        ", ".join(
            f"CAST({_quoted(c)} AS VARCHAR) AS {_quoted(c)}" if k == "JSON" else _quoted(c)
            for c, k in zip(columns, kinds, strict=True)
        )
    )


def register(app: typer.Typer, home_of: Any, fail: Any) -> None:
    """Add the store commands to `app`. `home_of(ctx, home)` resolves --home; `fail(msg)`
    prints a one-line error and exits with code 2."""

    @app.command()
    def sql(
        ctx: typer.Context,
        query: Annotated[str, typer.Argument(help="A read-only SQL query over the views.")],
        fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
        output: Annotated[
            Path | None, typer.Option("--output", "-o", help="File to write (parquet needs one).")
        ] = None,
        home: HomeOption = None,
    ) -> None:
        """Run read-only SQL over spans, traces, tool_calls, llm_calls, memory_ops, outcomes.
        --format json prints one JSON array, jsonl one JSON object per line."""
        from tracegym.store.store import ReadOnlyError

        if fmt is OutputFormat.parquet and output is None:
            fail("--format parquet writes a file: give --output FILE")
        store = _open_store(existing_home(home_of(ctx, home), fail), fail)
        try:  # planned and fetched in one retry: a compaction may move files in between
            if fmt is OutputFormat.parquet:
                store.run(query, None, lambda rel: text_json(rel).write_parquet(str(output)))
                typer.echo(f"wrote {output}")
                return
            columns, rows = dataclasses.astuple(store.fetch(query))
        except ReadOnlyError as exc:
            fail(str(exc))
        except Exception as exc:  # DuckDB's own errors say what is wrong with the query
            fail(query_error(exc))
        if output is not None:
            with open(output, "w", encoding="utf-8") as handle:
                saved, sys.stdout = sys.stdout, handle
                try:
                    print_rows(columns, rows, fmt, Console(file=handle))
                finally:
                    sys.stdout = saved
            typer.echo(f"wrote {counted(len(rows), 'row')} to {output}")
            return
        print_rows(columns, rows, fmt, table_console())

    @app.command()
    def traces(
        ctx: typer.Context,
        limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 20,
        failed: Annotated[bool, typer.Option("--failed", help="Only failed runs.")] = False,
        home: HomeOption = None,
    ) -> None:
        """List the most recent runs: run id, request, counts, first error, outcome."""
        from tracegym.store.show import requests_of

        store = _open_store(existing_home(home_of(ctx, home), fail), fail)
        where = "WHERE success = false" if failed else ""
        rows = store.fetch(
            "SELECT trace_id, run_id, agent, "
            "strftime(start_time, '%m-%d %H:%M:%S') AS started, round(duration_ms, 1) AS ms, "
            "tool_calls AS tools, llm_calls AS llm, errors, cost, first_error, "
            "CASE success WHEN true THEN 'success' WHEN false THEN 'failure' ELSE '-' END "
            "AS outcome, reward "
            f"FROM traces {where} ORDER BY start_time DESC, trace_id LIMIT $limit",
            {"limit": limit},
        ).rows
        requests = requests_of(store, [row[0] for row in rows])
        console = table_console()
        console.print(traces_table(rows, requests, console.width))
        console.print(f"{len(rows)} run{'s' if len(rows) != 1 else ''}", style="dim")

    @app.command()
    def show(
        ctx: typer.Context,
        trace: Annotated[str, typer.Argument(help="Run id, trace id or a unique trace-id prefix.")],
        full: Annotated[
            bool,
            typer.Option(
                "--full",
                help="Everything: no truncation, all messages, stacks, framework plumbing spans.",
            ),
        ] = False,
        home: HomeOption = None,
    ) -> None:
        """Tell the story of one run: request, each step with its arguments, result or error,
        LLM calls as chat lines, memory, the last analysis' findings (decisive step marked),
        outcome."""
        from tracegym.store.show import load_story, render_story

        store = _open_store(existing_home(home_of(ctx, home), fail), fail)
        ids = (
            store.fetch(
                "SELECT DISTINCT trace_id FROM traces WHERE run_id = $id",
                {"id": trace},
            ).rows
            or store.fetch(
                "SELECT DISTINCT trace_id FROM traces WHERE starts_with(trace_id, $p)",
                {"p": trace.lower()},
            ).rows
        )
        if not ids:
            fail(f"no run with trace id or run id {trace!r} under {store.home}")
        if len(ids) > 1:
            fail(f"{trace!r} matches {len(ids)} runs; give more of the trace id")
        story = load_story(store, ids[0][0])
        table_console().print(render_story(story, full=full))

    @app.command()
    def compact(
        ctx: typer.Context,
        to: Annotated[
            str | None,
            typer.Option(
                "--to",
                help="A lake on object storage (s3://bucket/prefix, any fsspec URL) to compact "
                "into from now on, kept in the home's lake.json (docs/object_storage.md).",
            ),
        ] = None,
        iceberg: Annotated[
            Path | None,
            typer.Option(
                "--iceberg",
                help="Then append the lake's new parts to Iceberg tables in a SQL catalog kept "
                "in this folder (catalog.db and warehouse/; the iceberg extra; "
                "docs/lake_engines.md). Many homes may publish into one catalog at once.",
            ),
        ] = None,
        home: HomeOption = None,
    ) -> None:
        """Move complete spool files into the Parquet lake (queries also do this first)."""
        import duckdb

        target = existing_home(home_of(ctx, home), fail)
        if to is not None:
            from tracegym.store.object_lake import configured, set_lake

            try:
                set_lake(target, configured(target, to))
            except ValueError as exc:
                fail(str(exc))
        store = _open_store(target, fail, compact_on_open=False)
        try:
            report = store.compact(wait=False)
            if report.busy:  # another process is compacting: queue behind it
                typer.echo("another process is compacting this store: waiting for it", err=True)
                report = store.compact(wait=True)
        except (OSError, duckdb.Error) as exc:
            fail(
                f"could not compact {target}: {query_error(exc)} (nothing is lost: spool files "
                "stay until their spans are in the lake)",
                1,
            )
        typer.echo(
            f"compacted {counted(report.files, 'spool file')}, {counted(report.spans, 'span')}, "
            f"{counted(report.parts, 'part')}{f' into {store.lake.url}' if store.lake else ''}"
            f" under {target}; {counted(len(report.skipped_live), 'file')} still being written"
        )
        if report.bad_lines or report.truncated_lines:  # skipped, not stored as empty spans
            typer.echo(
                f"skipped {counted(report.bad_lines, 'line')} that are no span and "
                f"{counted(report.truncated_lines, 'line')} cut short (see docs/spool.md)",
                err=True,
            )
        if iceberg is not None:
            _publish_iceberg(target, iceberg, fail)

    @app.command()
    def views(
        ctx: typer.Context,
        dialect: Annotated[
            Dialect, typer.Option("--dialect", help="duckdb (what `sql` queries) or spark.")
        ] = Dialect.duckdb,
        home: HomeOption = None,
    ) -> None:
        """Print every view's SQL; `--dialect spark`: a Spark SQL script creating them over
        this home's lake (tracegym.store.spark.register_views runs it on a SparkSession)."""
        try:
            from tracegym.store.dialects import views_script

            typer.echo(views_script(home_of(ctx, home), dialect.value), nl=False)
        except ImportError as exc:
            fail(f"{exc.name} is missing: pip install 'tracegym[spark]'")

    @app.command()
    def doctor(
        ctx: typer.Context,
        repair: Annotated[
            bool,
            typer.Option(
                "--repair",
                help="Move corrupt lake parts into lake/quarantine/ (never deleted) and remove "
                "dead compactions' staging folders.",
            ),
        ] = False,
        home: HomeOption = None,
    ) -> None:
        """Check the store's files: corrupt lake parts (every row is read), spool files cut
        mid-line, dead compactions' staging, the quarantine; on an object lake, its commits
        (each read, none missing) and the parts they name (present, footers with the rows the
        commit says) and this host's copies of them. Exit code 1 while a corrupt part is still
        in the lake or the object lake has a problem. Writes nothing without --repair."""
        try:
            from tracegym.store.health import examine
            from tracegym.store.health import repair as fix
        except ImportError as exc:
            fail(f"doctor needs the analysis extra: pip install 'tracegym[analysis]' ({exc.name})")
        target = existing_home(home_of(ctx, home), fail)
        health = examine(target)
        if repair:
            health = fix(health)
        for line in doctor_lines(health):
            typer.echo(line)
        if health.problems:
            raise typer.Exit(1)

    @app.command("import")
    def import_(
        ctx: typer.Context,
        fmt: Annotated[
            str,
            typer.Argument(
                metavar="FORMAT",
                help="tau-bench, tau2-bench, whowhen, agentracer, swe-agent, openai-chat or "
                "otlp-json.",
            ),
        ],
        path: Annotated[Path, typer.Argument(help="A file or a folder of files.")],
        labels: Annotated[
            Path | None,
            typer.Option("--labels", help="Failure labels (AgentRx style) for tau-bench runs."),
        ] = None,
        max_bytes: Annotated[
            int | None,
            typer.Option(
                "--max-bytes",
                min=1,
                help="Refuse a file (or gzip unpacking) larger than this; default "
                "TRACEGYM_IMPORT_MAX_BYTES, else 256 MiB.",
            ),
        ] = None,
        home: HomeOption = None,
    ) -> None:
        """Import recorded runs of other agents as traces with outcomes (all or nothing).

        Creates the home when it is missing."""
        from tracegym.store.importers import FORMATS, ImportFormatError, import_path

        if fmt not in FORMATS:
            fail(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
        if not path.exists():
            fail(f"{path}: no such file or folder")
        if labels is not None and not labels.is_file():
            fail(f"--labels {labels}: no such file")
        target = writable_home(home_of(ctx, home), fail)
        try:
            report = import_path(fmt, path, target, labels=labels, max_bytes=max_bytes)
        except (ImportFormatError, ValueError, OSError) as exc:
            fail(f"nothing imported: {exc}")
        typer.echo(
            f"imported {counted(report.runs, 'run')} ({counted(report.spans, 'span')}) from "
            f"{counted(report.files, 'file')} as {fmt} into {target}"
            + (
                f"; {counted(len(report.already_imported), 'file')} already imported"
                if report.already_imported
                else ""
            )
            + (
                f"; {counted(report.repeated_runs, 'run')} already in the store"
                if report.repeated_runs
                else ""
            )
            + (
                f"; {counted(report.repeated_spans, 'span')} already in the store"
                if report.repeated_spans
                else ""
            )
        )
        for skipped, reason in report.skipped:
            typer.echo(f"skipped {skipped}: {reason}")

    register_export(app, home_of, fail)

    @app.command()
    def collect(
        ctx: typer.Context,
        host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port (OTLP/HTTP's default is 4318).")] = 4318,
        token: Annotated[
            str | None,
            typer.Option(
                envvar="TRACEGYM_COLLECT_TOKEN", help="Require 'Authorization: Bearer TOKEN'."
            ),
        ] = None,
        no_redact: Annotated[
            bool,
            typer.Option(
                "--no-redact",
                help="Store received spans as they are: received spans are redacted by default.",
            ),
        ] = False,
        max_body_bytes: Annotated[
            str,
            typer.Option(
                "--max-body-bytes",
                metavar="SIZE",
                help="Largest request body, framed or unpacked (413 past it); bytes, or with "
                "KiB, MiB or GiB.",
            ),
        ] = "20MiB",
        max_buffered_bytes: Annotated[
            str | None,
            typer.Option(
                "--max-buffered-bytes",
                metavar="SIZE",
                help="Bytes of the bodies being read, all connections together (503 while "
                "full); at least --max-body-bytes; default 2 x --max-body-bytes.",
                show_default=False,
            ),
        ] = None,
        body_deadline: Annotated[
            str,
            typer.Option(
                "--body-deadline",
                metavar="SECONDS",
                help="A body must arrive whole this long after its request line (408 past it); "
                "at least 0.1.",
            ),
        ] = "30",
        home: HomeOption = None,
    ) -> None:
        """Receive OTLP/HTTP traces (protobuf or JSON at /v1/traces) into the spool.

        Received spans are redacted by default (secrets replaced before anything is written;
        --no-redact turns that off). Creates the home when it is missing."""
        from tracegym.store.receiver import Receiver

        limits = collect_limits(max_body_bytes, max_buffered_bytes, body_deadline, fail)
        target = writable_home(home_of(ctx, home), fail)
        receiver = Receiver(
            target,
            host=host,
            port=port,
            token=token,
            redact=not no_redact,
            max_body_bytes=limits.max_body_bytes,
            max_buffered_bytes=limits.max_buffered_bytes,
            body_deadline_s=limits.body_deadline_s,
        )
        typer.echo(f"receiving OTLP at http://{host}:{port}/v1/traces into {target} (Ctrl-C stops)")
        try:
            receiver.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            receiver.stop()


_SIZE = re.compile(r"(\d{1,15})\s*(KiB|MiB|GiB)?", re.IGNORECASE)
_UNITS = {None: 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


@dataclasses.dataclass(frozen=True)
class CollectLimits:
    """`tracegym collect`'s receiver limits, checked: the receiver itself would quietly clamp
    a bad value (a budget below the body limit, a deadline under 0.1 s) instead of saying so."""

    max_body_bytes: int
    max_buffered_bytes: int
    body_deadline_s: float


def _publish_iceberg(home: Path, catalog_dir: Path, fail: Any) -> None:
    """`compact --iceberg DIR`: the home's lake parts no snapshot names yet, appended to the
    Iceberg tables of the SQL catalog in DIR (store.iceberg: exactly once across writers)."""
    try:
        from tracegym.store.iceberg import IcebergTarget, publish
    except ImportError as exc:
        fail(f"--iceberg needs the iceberg extra (pip install 'tracegym[iceberg]'): {exc}")
    try:
        report = publish(home, IcebergTarget.sqlite(catalog_dir))
    except ImportError as exc:
        fail(f"--iceberg needs the iceberg extra (pip install 'tracegym[iceberg]'): {exc}")
    except (OSError, RuntimeError, ValueError) as exc:
        fail(f"could not publish {home}'s lake to the Iceberg catalog in {catalog_dir}: {exc}", 1)
    rows = sum(report.rows.values())
    parts = sum(report.parts.values())
    tables = ", ".join(f"{name} {n}" for name, n in sorted(report.rows.items())) or "nothing new"
    typer.echo(
        f"published {counted(rows, 'row')} from {counted(parts, 'part')} to the Iceberg catalog "
        f"in {catalog_dir} ({tables}; {counted(report.conflicts, 'commit')} lost to other "
        "writers and retried)"
    )


def parse_size(option: str, text: str, fail: Any) -> int:
    """A positive byte count: plain digits, or with KiB / MiB / GiB."""
    match = _SIZE.fullmatch(text.strip())
    size = int(match[1]) * _UNITS[match[2] and match[2].lower()] if match else 0
    if size <= 0:
        fail(f"{option} {text!r}: expected a positive number of bytes (e.g. 20MiB)")
    return size


def collect_limits(
    max_body: str, max_buffered: str | None, deadline: str, fail: Any
) -> CollectLimits:
    """The three options checked (a one-line `fail` for the first bad one)."""
    body = parse_size("--max-body-bytes", max_body, fail)
    buffered = (
        2 * body if max_buffered is None else parse_size("--max-buffered-bytes", max_buffered, fail)
    )
    if buffered < body:
        fail(
            f"--max-buffered-bytes {max_buffered!r} is smaller than --max-body-bytes "
            f"{max_body!r}: one body must fit"
        )
    try:
        seconds = float(deadline)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0.1):
        fail(f"--body-deadline {deadline!r}: expected a number of seconds, at least 0.1")
    return CollectLimits(body, buffered, seconds)


def doctor_lines(health: Any) -> list[str]:
    """`tracegym doctor`'s report (paths relative to the home), as plain lines."""

    def rel(path: Path) -> str:
        return str(path.relative_to(health.home)) if path.is_relative_to(health.home) else str(path)

    lines = [f"tracegym store: {health.home}"]
    local = "local lake parts" if health.object_lake is not None else "lake parts"
    lines.append(f"{local}: {health.parts} read whole, {len(health.corrupt)} corrupt")
    for bad in health.corrupt:
        moved = health.moved.get(bad.path)
        fate = f"moved to {rel(moved)}" if moved else "still in the lake (--repair moves it)"
        lines.append(f"  corrupt: {rel(bad.path)}: {bad.reason}; {fate}")
    lines.append(
        f"spool: {counted(health.spool_files, 'file')} ({health.live_files} being written), "
        f"{len(health.cut_tails)} with a cut last line (compaction drops that line)"
    )
    lines.extend(f"  cut last line: {rel(path)}" for path in health.cut_tails)
    if health.compacting:
        lines.append("staging: a compaction is running")
    else:
        state = "removed" if health.staging_removed else "--repair removes them"
        lines.append(
            f"staging: {counted(len(health.staging), 'folder')} left by dead compactions"
            + (f" ({state})" if health.staging else "")
        )
    lines.append(f"quarantine: {counted(len(health.quarantine), 'file')}")
    lines.extend(f"  {rel(path)}" for path in health.quarantine)
    if health.object_lake is not None:
        from tracegym.store.object_health import object_lake_lines

        lines.extend(object_lake_lines(health.object_lake))
    lines.append("status: " + ("; ".join(health.problems) or "ok"))
    return lines


def parse_params(pairs: list[str] | None, fail: Any) -> dict[str, Any]:
    """`--param NAME=VALUE` pairs; a value that parses as JSON (a number, true, a list ...)
    is bound as that, anything else as text."""
    params: dict[str, Any] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            fail(f"--param {pair!r}: expected NAME=VALUE")
        try:
            params[name.strip()] = json.loads(value)
        except ValueError:
            params[name.strip()] = value
    return params


@contextlib.contextmanager
def output_stream(output: Path | None) -> Iterator[IO[str]]:
    """stdout, or a file written whole or not at all (a temporary name, renamed at the end)."""
    if output is None or str(output) == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            yield handle
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)


# The export commands' selection and output options (module level: the annotations are
# evaluated in this module's namespace).
RunIds = Annotated[
    list[str] | None,
    typer.Argument(help="Run ids, trace ids or unique trace-id prefixes (default: every run)."),
]
Where = Annotated[
    str | None,
    typer.Option(
        "--where",
        help='SQL condition over the traces view, e.g. "agent = $agent AND errors = 0"; '
        "values come from --param.",
    ),
]
Params = Annotated[
    list[str] | None,
    typer.Option("--param", "-p", help="NAME=VALUE bound to $NAME in --where (repeatable)."),
]
Output = Annotated[
    Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")
]


def register_export(app: typer.Typer, home_of: Any, fail: Any) -> None:
    """`tracegym export otlp-json` and `tracegym export openai-ft`."""
    export = typer.Typer(
        help="Runs out of the store: OTLP/JSON, OpenAI fine-tuning JSONL.", no_args_is_help=True
    )
    app.add_typer(export, name="export")

    def chosen(store: Any, ids: list[str] | None, where: str | None, params: dict, extra=None):
        from tracegym.store.exporters import SelectionError, select_runs

        if params and not where:
            fail("--param values are bound in --where: give --where too")
        try:
            return select_runs(store, ids or [], where=where, params=params, extra=extra)
        except SelectionError as exc:
            fail(str(exc))

    @export.command("otlp-json")
    def export_otlp_json(
        ctx: typer.Context,
        ids: RunIds = None,
        where: Where = None,
        param: Params = None,
        output: Output = None,
        no_outcomes: Annotated[
            bool, typer.Option("--no-outcomes", help="Leave the runs' recorded outcomes out.")
        ] = False,
        home: HomeOption = None,
    ) -> None:
        """Write runs as OTLP/JSON lines, one request per run (with its outcomes).

        For any OpenTelemetry backend or the Collector; `tracegym import otlp-json` reads
        them back as the same spans."""
        from tracegym.store.exporters.otlp_json import write_otlp_json

        store = _open_store(existing_home(home_of(ctx, home), fail), fail)
        runs = chosen(store, ids, where, parse_params(param, fail))
        with output_stream(output) as out:
            report = write_otlp_json(store, runs, out, outcomes=not no_outcomes)
        typer.echo(
            f"exported {counted(report.runs, 'run')} ({counted(report.spans, 'span')}, "
            f"{counted(report.outcomes, 'outcome')})"
            f" as OTLP/JSON to {output if output else 'stdout'}",
            err=True,
        )

    @export.command("openai-ft")
    def export_openai_ft(
        ctx: typer.Context,
        ids: RunIds = None,
        where: Where = None,
        param: Params = None,
        output: Output = None,
        source: Annotated[
            FtSource,
            typer.Option(
                "--from",
                help="runs: verifier-passing runs in the store; demos: registered "
                "environments' oracle demonstrations (train seeds); all: both.",
            ),
        ] = FtSource.all,
        env: Annotated[
            list[str] | None,
            typer.Option("--env", help="Only these environments' demonstrations (repeatable)."),
        ] = None,
        per_env: Annotated[
            int | None,
            typer.Option("--per-env", min=1, help="At most this many demonstrations each."),
        ] = None,
        home: HomeOption = None,
    ) -> None:
        """Write OpenAI chat fine-tuning JSONL from passing runs and oracle demonstrations.

        One {"messages", "tools"} object per line; lines that fail the format check are
        skipped and counted with their reason."""
        import itertools

        from tracegym.store.exporters.openai_ft import PASSED, run_examples, write_examples

        target = existing_home(home_of(ctx, home), fail)
        params = parse_params(param, fail)
        if source is FtSource.demos and (ids or where):
            fail("run ids and --where select runs: use them with --from runs or all")
        if source is FtSource.runs and (env or per_env):
            fail("--env and --per-env select demonstrations: use them with --from demos or all")
        sources: list[Any] = []
        if source is not FtSource.demos:
            store = _open_store(target, fail)
            sources.append(run_examples(store, chosen(store, ids, where, params, PASSED)))
        if source is not FtSource.runs:
            # The demonstrations read the environment registry, a floor above the store: the
            # one import up from this room (see the import contracts in pyproject.toml).
            from tracegym.synthesis.demonstrations import demo_examples
            from tracegym.synthesis.registry import RegistryError

            try:
                demos = demo_examples(target, env or [], per_env=per_env)
                first = list(itertools.islice(demos, 1))  # an unknown --env fails here
            except RegistryError as exc:
                fail(str(exc))
            sources.append(itertools.chain(first, demos))
        with output_stream(output) as out:
            report = write_examples(itertools.chain(*sources), out)
        typer.echo(
            f"wrote {counted(report.written, 'example')} ({report.runs} from runs, "
            f"{report.demos} from demonstrations) to {output if output else 'stdout'}; "
            f"skipped {sum(report.skipped.values())}",
            err=True,
        )
        for reason, count in report.skipped.most_common():
            typer.echo(f"  skipped {count}: {reason}", err=True)
