"""What the GenAI message shape and the OpenInference attributes cost (docs/messages.md).

    .venv/bin/python benchmarks/messages_overhead.py [--spans 900] [--rounds 7] [--calls 2000]

1. Per span on the agent's thread: an agent loop of step + tool + chat (message capture on)
   through tracegym's pipeline into the spool, in alternating rounds at each OpenInference
   level (off, kinds, full); the fastest round's per-span time of each (the least disturbed by
   other work on a shared machine), and the spool's bytes per span (the same either way: the
   spool leaves the OpenInference copies out).
2. Per tool span: what deriving and setting the OpenInference attributes adds to an SDK span
   with a tool span's attributes (fastest of 15 repeats of 5,000).
3. Per LLM call: normalising 12 OpenAI-shaped messages and a response into the GenAI shape
   (`tracegym.tracer.messages`) against serialising them as they are (`to_json`, the old way);
   fastest of 15 repeats.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import timeit
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.tracer import semconv as sc
from tracegym.tracer.kinds import _openinference
from tracegym.tracer.messages import encode, input_messages, output_messages
from tracegym.tracer.operations import state
from tracegym.tracer.serialize import to_json

RESPONSE = {
    "model": "m",
    "choices": [
        {"message": {"role": "assistant", "content": "It shipped."}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 30, "completion_tokens": 4},
}
MESSAGES = [
    {"role": "system", "content": "rules " * 20},
    {"role": "user", "content": "Where is order W-1? " * 5},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"id": 3}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"ok": 1}'},
] * 3  # fmt: skip


@tg.tool
def get_order(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "status": "shipped", "items": [1, 2, 3]}


@tg.step
def plan(goal: str) -> str:
    return "look it up"


@tg.llm(model="m")
def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return RESPONSE


@tg.agent(name="bench")
def loop(request: str, turns: int) -> str:
    for i in range(turns):
        plan(request)
        get_order(f"W-{i}")
        ask(MESSAGES[:2])
    return "done"


def _spool_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in home.rglob("*") if p.is_file())


def spans(n: int, rounds: int) -> None:
    turns = max(1, n // 3)
    levels = ("off", "kinds", "full")
    times: dict[str, list[float]] = {level: [] for level in levels}
    sizes: dict[str, list[float]] = {level: [] for level in levels}
    for _ in range(rounds):
        for on in levels:
            home = Path(tempfile.mkdtemp())
            tg.init(home=home, provider=TracerProvider(), capture_messages=True)
            state.settings.openinference = on
            start = time.perf_counter()
            loop("Where is order W-1? " * 5, turns)
            times[on].append((time.perf_counter() - start) / (3 * turns + 1) * 1e6)
            tg.flush()
            sizes[on].append(_spool_bytes(home) / (3 * turns + 1))
    for on in levels:
        print(
            f"openinference={on:5}: {min(times[on]):6.1f} us per span on the agent's thread "
            f"({min(times[on]) - min(times['off']):+.1f}), "
            f"{statistics.median(sizes[on]):6.0f} spool bytes per span"
        )


def _fastest(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=15)) / number * 1e6


def tool_span(number: int) -> None:
    tracer = TracerProvider().get_tracer("bench")
    attrs = {sc.OPERATION: sc.OP_TOOL, sc.TOOL_NAME: "get_order", sc.TOOL_CALL_ID: "c1",
             sc.TOOL_ARGUMENTS: '{"order_id":"W-1"}', sc.TOOL_RESULT: '{"status":"shipped"}',
             sc.STEP_INDEX: 3, sc.AGENT_NAME: "bench"}  # fmt: skip

    def bare() -> None:
        tracer.start_span("execute_tool get_order", attributes=attrs).end()

    handle = SimpleNamespace(span=None, op=SimpleNamespace(operation=sc.OP_TOOL))

    def derived() -> None:
        handle.span = tracer.start_span("execute_tool get_order", attributes=attrs)
        _openinference(handle)  # type: ignore[arg-type]
        handle.span.end()

    base = _fastest(bare, number)
    for level in ("kinds", "full"):
        state.settings.openinference = level
        with_oi = _fastest(derived, number)
        print(f"tool span: bare SDK {base:.1f} us, with OpenInference {level} {with_oi:.1f} us "
              f"({with_oi - base:+.1f} us)")  # fmt: skip


def messages(calls: int) -> None:
    old = _fastest(lambda: (to_json(MESSAGES), to_json(RESPONSE)), calls)
    new = _fastest(
        lambda: (encode(input_messages(MESSAGES)), encode(output_messages(RESPONSE))), calls
    )
    print(f"12 messages + a response per LLM call: GenAI shape {new:.1f} us, as they are "
          f"(to_json) {old:.1f} us")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=900)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    spans(args.spans, args.rounds)
    tool_span(5000)
    messages(args.calls)
    tg.shutdown()


if __name__ == "__main__":
    main()
