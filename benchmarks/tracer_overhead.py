"""Tracer overhead: tracegym's decorated tool call against a hand-written OpenTelemetry span.

Measured in one run, alternating rounds of:
  plain     an undecorated tool call inside an undecorated agent loop;
  raw_sdk   the same call inside a hand-written OTel SDK span carrying the same attributes
            (operation, tool name, call id, step index, agent name, JSON arguments and result),
            under a hand-written agent span, through a BatchSpanProcessor into the spool;
  tracegym  the same call decorated with @tg.tool under @tg.agent, content capture on, through
            tracegym's own pipeline (redaction, the same BatchSpanProcessor settings, the spool).
Prints the per-call overhead of each over `plain`, and tracegym's as a ratio to raw_sdk's.
Goal: ratio <= 1.2. Then 50,000 decorated calls in a tight loop: nothing may be dropped.

    .venv/bin/python benchmarks/tracer_overhead.py [--calls 5000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import tracegym as tg
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from tracegym.tracer import internal
from tracegym.tracer import semconv as sc
from tracegym.tracer.spool import SpoolSpanExporter, iter_spool

ORDERS = {
    f"W{i:06d}": {"id": f"W{i:06d}", "total": i * 1.5, "status": "delivered"} for i in range(64)
}
KEYS = list(ORDERS)
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def get_order(order_id: str) -> dict:
    return ORDERS[order_id]


def plain_round(calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        get_order(KEYS[i & 63])
    return time.perf_counter() - start


def raw_round(tracer: trace.Tracer, calls: int) -> float:
    start = time.perf_counter()
    with tracer.start_as_current_span(
        "invoke_agent bench", attributes={sc.OPERATION: sc.OP_AGENT, sc.AGENT_NAME: "bench"}
    ):
        for i in range(calls):
            order_id = KEYS[i & 63]
            with tracer.start_as_current_span(
                "execute_tool get_order",
                attributes={
                    sc.OPERATION: sc.OP_TOOL,
                    sc.TOOL_NAME: "get_order",
                    sc.STEP_INDEX: i,
                    sc.AGENT_NAME: "bench",
                    sc.TOOL_CALL_ID: f"call_{random.getrandbits(64):016x}",
                    sc.TOOL_ARGUMENTS: _dumps({"order_id": order_id}),
                },
            ) as span:
                result = get_order(order_id)
                span.set_attribute(sc.TOOL_RESULT, _dumps(result))
    return time.perf_counter() - start


traced_get_order = tg.tool(get_order)


@tg.agent(name="bench")
def traced_agent(calls: int) -> None:
    for i in range(calls):
        traced_get_order(KEYS[i & 63])


def traced_round(calls: int) -> float:
    start = time.perf_counter()
    traced_agent(calls)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000, help="tool calls per round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tight-loop", type=int, default=50_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        raw_provider = TracerProvider()
        raw_provider.add_span_processor(
            BatchSpanProcessor(
                SpoolSpanExporter(Path(tmp) / "raw"),
                max_queue_size=65536,
                schedule_delay_millis=1000,
            )
        )
        raw_tracer = raw_provider.get_tracer("bench")
        tg_provider = TracerProvider()
        tg.init(service="bench", home=Path(tmp) / "tracegym", provider=tg_provider)

        samples: dict[str, list[float]] = {"plain": [], "raw_sdk": [], "tracegym": []}
        for _ in range(2):  # warm-up
            plain_round(200), raw_round(raw_tracer, 200), traced_round(200)
        for _ in range(args.rounds):
            for name, run in (
                ("plain", lambda: plain_round(args.calls)),
                ("raw_sdk", lambda: raw_round(raw_tracer, args.calls)),
                ("tracegym", lambda: traced_round(args.calls)),
            ):
                gc.collect()
                gc.disable()  # as timeit does: no collector pauses inside a timed round
                try:
                    samples[name].append(run() / args.calls * 1e6)
                finally:
                    gc.enable()
                raw_provider.force_flush()  # export outside the timed region, for both
                tg.flush()

        per_call = {name: statistics.median(v) for name, v in samples.items()}
        raw_overhead = per_call["raw_sdk"] - per_call["plain"]
        tg_overhead = per_call["tracegym"] - per_call["plain"]
        print(f"per call (median of {args.rounds} rounds x {args.calls} calls):")
        for name, value in per_call.items():
            print(f"  {name:9s} {value:8.2f} us")
        print(f"overhead raw_sdk   {raw_overhead:8.2f} us/call")
        print(f"overhead tracegym  {tg_overhead:8.2f} us/call")
        ratio = tg_overhead / raw_overhead
        print(f"ratio tracegym/raw_sdk overhead: {ratio:.3f}  (goal <= 1.2)")

        internal.reset()
        home = Path(tmp) / "tight"
        tg.init(service="bench", home=home, provider=tg_provider)
        start = time.perf_counter()
        traced_agent(args.tight_loop)
        elapsed = time.perf_counter() - start
        tg.flush()
        stats = tg.stats()
        spans = sum(1 for r in iter_spool(home) if r["name"] == "execute_tool get_order")
        print(
            f"tight loop: {args.tight_loop} calls in {elapsed:.2f} s, "
            f"{spans} tool spans in the spool, dropped {stats.spans_dropped}, "
            f"failed {stats.spans_failed}, internal errors {stats.internal_errors}"
        )
        tg.shutdown()
        raw_provider.shutdown()


if __name__ == "__main__":
    main()
