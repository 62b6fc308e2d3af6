"""The latency `tracegym serve` adds in front of an upstream: p50 and p95 of a chat completion
sent to a fake upstream directly (the baseline) and through `serve` (routing a new
conversation each time, or a remembered one), in the same run, with the same client. Goal: the
added p50 under 2 ms.

The fake upstream answers at once with a fixed completion, so what is measured is serve's own
work: parse, route (the router's hashed embeddings, `--embedder hash`), forward over loopback,
rewrite `model`. Both servers run on loopback in this process's threads (uvicorn), the client is
one `httpx.Client` with keep-alive; rounds interleave the three paths so that a noisy neighbour
hits them alike.

`--local N` also measures the local backend on a tiny random ChatML model (`tiny_family_policy`,
a rank-4 LoRA adapter): N requests of `max_tokens` 16 one after another through `serve` (the
openai client, non-streaming: requests/s; streaming: time to the first chunk), against
the same generation called directly (`LocalBackend.generate_text` on the same rendered prompt),
interleaved in the same run. The local backend streams only once the reply is whole, so its
time to first token is the whole request's.

    .venv/bin/python benchmarks/serve_speed.py [--requests 300] [--local 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

GOAL_MS = 2.0


def fake_upstream() -> object:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    answer = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "x",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    }

    async def completions(request: object) -> JSONResponse:
        await request.body()  # type: ignore[attr-defined]
        return JSONResponse(answer)

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def make_home(root: Path) -> Path:
    from tracegym.store.home import Home, write_json

    texts = {
        "press": ["press the red button", "please press the blue button", "button panel"],
        "refund": ["refund the order", "issue a refund for order", "refund money to customer"],
    }
    for adapter_id, router_texts in texts.items():
        folder = Home.at(root).adapters / adapter_id
        folder.mkdir(parents=True)
        write_json(
            folder / "meta.json",
            {
                "version": 2,
                "adapter_id": adapter_id,
                "capability": {"env_id": adapter_id},
                "base_model": {"name": "base"},
                "promoted": True,
            },
        )
        write_json(folder / "router.json", {"version": 1, "texts": router_texts})
    return root


def local_times(n: int) -> dict[str, list[float]]:
    """Per request (ms): the generation alone, a request through serve, and the time to the
    first streamed content chunk through serve."""
    import openai
    import peft
    from tracegym.generation.chat_format import CHATML, ChatFormat
    from tracegym.generation.tiny_families import tiny_family_policy
    from tracegym.serving import ConversationRouter, create_app
    from tracegym.serving.local import LocalBackend
    from tracegym.serving.server import running

    policy = tiny_family_policy(CHATML, 0)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(policy.model, config, adapter_name="press")
    model.eval()
    backend = LocalBackend(model, ChatFormat(policy.tokenizer))
    messages = [{"role": "user", "content": "please press the red button"}]
    prompt = backend.fmt.render_ids(messages)
    out: dict[str, list[float]] = {
        "local: generate": [],
        "local: serve": [],
        "local: serve, first chunk": [],
    }
    app = create_app(backend, ConversationRouter(None, ["press"], "base"))
    with running(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for i in range(n + 3):
            start = time.perf_counter()
            backend.generate_text(prompt, "press", 16, 0.0)
            generate = time.perf_counter() - start
            start = time.perf_counter()
            client.chat.completions.create(model="press", messages=messages, max_tokens=16)
            served = time.perf_counter() - start
            start = time.perf_counter()
            first = None
            for chunk in client.chat.completions.create(
                model="press", messages=messages, max_tokens=16, stream=True
            ):
                if first is None and chunk.choices:  # the role chunk: nothing comes sooner
                    first = time.perf_counter() - start
            if i >= 3:  # warm-up
                out["local: generate"].append(generate * 1000)
                out["local: serve"].append(served * 1000)
                out["local: serve, first chunk"].append((first or 0.0) * 1000)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--local", type=int, default=0, metavar="N")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import httpx
    from tracegym.serving.commands import build_app
    from tracegym.serving.server import running

    system = "You are the shop's agent. " * 40  # a realistic system prompt's size (~1 KB)
    times: dict[str, list[float]] = {"direct": [], "serve, new": [], "serve, remembered": []}
    with tempfile.TemporaryDirectory() as tmp, running(fake_upstream()) as upstream:
        home = make_home(Path(tmp))
        with running(build_app(home, f"{upstream}/v1", "base", embedder="hash")) as serve:
            targets = {
                "direct": f"{upstream}/v1/chat/completions",
                "serve, new": f"{serve}/v1/chat/completions",
                "serve, remembered": f"{serve}/v1/chat/completions",
            }
            with httpx.Client(timeout=30) as client:
                for i in range(args.requests + 20):
                    for name, url in targets.items():
                        first = "please press the red button"
                        if name != "serve, remembered":
                            first += f" number {i}"  # a new conversation each time
                        body = {
                            "model": "auto",
                            "messages": [
                                {"role": "system", "content": system},
                                {"role": "user", "content": first},
                            ],
                        }
                        start = time.perf_counter()
                        reply = client.post(url, json=body)
                        elapsed = time.perf_counter() - start
                        reply.raise_for_status()
                        if i >= 20:  # the first rounds warm the connections up
                            times[name].append(elapsed * 1000)
    if args.local:
        times.update(local_times(args.local))
    base = statistics.median(times["direct"])
    rows = {
        name: {
            "p50_ms": round(statistics.median(values), 3),
            "p95_ms": round(percentile(values, 0.95), 3),
            "p50_ratio": round(statistics.median(values) / base, 2),
            "added_p50_ms": round(statistics.median(values) - base, 3),
        }
        for name, values in times.items()
    }
    if args.json:
        print(json.dumps({"requests": args.requests, "goal_ms": GOAL_MS, "rows": rows}, indent=1))
        return
    print(f"{args.requests} requests per path, fake upstream on loopback")
    print(f"{'path':<20} {'p50 ms':>8} {'p95 ms':>8} {'x direct':>9} {'added p50 ms':>13}")
    for name, row in rows.items():
        if name.startswith("local"):
            continue
        print(
            f"{name:<20} {row['p50_ms']:>8.3f} {row['p95_ms']:>8.3f} {row['p50_ratio']:>9.2f} "
            f"{row['added_p50_ms']:>13.3f}"
        )
    if args.local:
        gen = statistics.median(times["local: generate"])
        print(f"\nlocal backend, tiny model, {args.local} requests of 16 new tokens each")
        print(f"{'path':<28} {'p50 ms':>8} {'req/s':>7} {'x generate':>11}")
        for name in ("local: generate", "local: serve", "local: serve, first chunk"):
            p50 = statistics.median(times[name])
            print(f"{name:<28} {p50:>8.2f} {1000 / p50:>7.1f} {p50 / gen:>11.2f}")
    worst = max(rows["serve, new"]["added_p50_ms"], rows["serve, remembered"]["added_p50_ms"])
    print(f"goal: added p50 under {GOAL_MS} ms: {'met' if worst < GOAL_MS else 'NOT met'}")


if __name__ == "__main__":
    main()
