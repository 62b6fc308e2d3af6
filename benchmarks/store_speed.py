"""Store throughput and query speed, each beside a floor measured in the same run.

Prints: spans/s through compaction (spool JSON lines -> Parquet lake); spans/s through the
OTLP receiver on loopback (protobuf batches from a client thread); and, over a lake of
`--spans` spans, the time of three queries through the store's views next to the same query run
by DuckDB directly on one equivalent Parquet file (the floor): count by tool, p95 duration per
tool, and walking parent links for 1,000 traces. Goals: compaction >= 100,000 spans/s, receiver
>= 20,000 spans/s, queries within 1.5x of the floor.

    .venv/bin/python benchmarks/store_speed.py [--spans 1000000]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import duckdb
from tracegym.store import lake
from tracegym.store.store import Store
from tracegym.tracer.spool import spool_dir

BASE_NS = 1_764_460_800_000_000_000
TOOLS = ["get_order", "find_user", "refund", "cancel", "search", "get_policy", "notify", "lookup"]
SPANS_PER_TRACE = 20


def write_synthetic_spool(home: Path, spans: int, files: int = 8) -> None:
    """Agent runs of SPANS_PER_TRACE spans (an agent root, tool and llm children)."""
    rng = random.Random(0)
    directory = spool_dir(home)
    directory.mkdir(parents=True, exist_ok=True)
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    per_file = spans // files
    n = 0
    for f in range(files):
        lines = []
        for _ in range(per_file):
            t, i = divmod(n, SPANS_PER_TRACE)
            trace_id = f"{t + 1:032x}"
            start = BASE_NS + n * 1_000_000
            if i == 0:
                attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "bench"}
                name, parent = "invoke_agent bench", None
            elif i % 4 == 0:
                attrs = {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "m",
                    "gen_ai.usage.input_tokens": 100,
                    "gen_ai.usage.output_tokens": 20,
                }
                name, parent = "chat m", f"{t + 1:016x}"
            else:
                tool = TOOLS[rng.randrange(len(TOOLS))]
                attrs = {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.arguments": '{"id":"W1"}',
                    "tracegym.step.index": i,
                }
                name, parent = f"execute_tool {tool}", f"{t + 1:016x}"
            span_id = f"{t + 1:016x}" if i == 0 else f"{n + 1:016x}"
            lines.append(
                dumps(
                    {
                        "v": 1,
                        "trace_id": trace_id,
                        "span_id": span_id,
                        "parent_span_id": parent,
                        "name": name,
                        "kind": "INTERNAL",
                        "start_ns": start,
                        "end_ns": start + int(rng.expovariate(1 / 2_000_000)),
                        "status": "UNSET",
                        "status_message": None,
                        "attributes": attrs,
                        "events": [],
                        "links": [],
                        "resource": {"service.name": "bench"},
                        "scope": "tracegym",
                    }
                )
            )
            n += 1
        (directory / f"bench-{f:03d}.jsonl").write_text("\n".join(lines) + "\n")


def best_of(runs: int, fn) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


QUERIES = {
    "count by tool": "SELECT tool, count(*) FROM {tools} GROUP BY tool",
    "p95 duration per tool": (
        "SELECT tool, quantile_cont(duration_ms, 0.95) FROM {tools} GROUP BY tool"
    ),
    "parent walk, 1,000 traces": """
        WITH RECURSIVE walk AS (
            SELECT trace_id, span_id, 0 AS depth FROM {spans}
            WHERE parent_span_id IS NULL AND trace_id IN (SELECT DISTINCT trace_id FROM {spans}
                                                          ORDER BY trace_id LIMIT 1000)
            UNION ALL
            SELECT s.trace_id, s.span_id, w.depth + 1 FROM {spans} s
            JOIN walk w ON s.trace_id = w.trace_id AND s.parent_span_id = w.span_id
        )
        SELECT count(*), max(depth) FROM walk
    """,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--compaction-spans", type=int, default=200_000)
    parser.add_argument("--receiver-spans", type=int, default=100_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "compaction"
        write_synthetic_spool(home, args.compaction_spans)
        start = time.perf_counter()
        report = lake.compact(home)
        elapsed = time.perf_counter() - start
        print(
            f"compaction: {report.spans} spans in {elapsed:.2f} s = "
            f"{report.spans / elapsed:,.0f} spans/s (goal >= 100,000)"
        )

        rate = receiver_rate(Path(tmp) / "receiver", args.receiver_spans)
        if rate is not None:
            print(f"receiver:   {args.receiver_spans} spans = {rate:,.0f} spans/s (goal >= 20,000)")

        home = Path(tmp) / "lake"
        write_synthetic_spool(home, args.spans)
        lake.compact(home)
        store = Store(home)
        floor_file = Path(tmp) / "floor.parquet"
        store.con.execute(f"COPY (SELECT * FROM spans) TO '{floor_file}' (FORMAT parquet)")
        floor = duckdb.connect()
        floor.execute(f"CREATE VIEW f AS SELECT * FROM read_parquet('{floor_file}')")
        floor.execute("CREATE VIEW ft AS SELECT * FROM f WHERE operation = 'execute_tool'")
        print(f"queries over {args.spans:,} spans (best of 5; store / floor):")
        for label, query in QUERIES.items():
            ours = best_of(
                5, lambda q=query: store.sql(q.format(tools="tool_calls", spans="spans")).fetchall()
            )
            base = best_of(5, lambda q=query: floor.sql(q.format(tools="ft", spans="f")).fetchall())
            print(
                f"  {label:28s} {ours * 1e3:8.1f} ms  {base * 1e3:8.1f} ms  "
                f"ratio {ours / base:.2f} (goal <= 1.5)"
            )


def receiver_rate(home: Path, spans: int) -> float | None:
    """Spans/s posted as protobuf batches of 512 (7 attributes a span) to a Receiver on
    loopback, one new connection per request (urllib)."""
    try:
        from tracegym.store.receiver import Receiver
    except ImportError:
        print("receiver:   not available")
        return None
    import urllib.request

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    batch = 512
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    for i in range(batch):
        span = scope_spans.spans.add()
        span.trace_id = (i // 16 + 1).to_bytes(16, "big")
        span.span_id = (i + 1).to_bytes(8, "big")
        span.name = "execute_tool lookup"
        span.start_time_unix_nano = BASE_NS + i
        span.end_time_unix_nano = BASE_NS + i + 1000
        for key, value in (
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", "lookup"),
            ("gen_ai.tool.call.id", f"call_{i:016x}"),
            ("gen_ai.tool.call.arguments", '{"order_id": "W000123", "reason": "damaged"}'),
            ("gen_ai.tool.call.result", '{"status": "refunded", "amount": 12.5}'),
            ("gen_ai.agent.name", "support"),
        ):
            attr = span.attributes.add()
            attr.key, attr.value.string_value = key, value
        step = span.attributes.add()
        step.key, step.value.int_value = "tracegym.step.index", i % 40
    body = request.SerializeToString()
    receiver = Receiver(home, port=0)
    receiver.start()
    try:
        url = f"http://127.0.0.1:{receiver.port}/v1/traces"
        posts = max(1, spans // batch)
        start = time.perf_counter()
        for _ in range(posts):
            req = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/x-protobuf"}
            )
            with urllib.request.urlopen(req) as response:
                response.read()
        elapsed = time.perf_counter() - start
    finally:
        receiver.stop()
    return posts * batch / elapsed


if __name__ == "__main__":
    main()
