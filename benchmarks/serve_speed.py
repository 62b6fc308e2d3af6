"""The latency `tracegym serve` adds in front of an upstream: p50 and p95 of a chat completion
sent to a fake upstream directly (the baseline) and through `serve` (routing a new
conversation each time, or a remembered one), in the same run, with the same client. Goal: the
added p50 under 2 ms.

The fake upstream answers at once with a fixed completion, so what is measured is serve's own
work: parse, route (the router's hashed embeddings, `--embedder hash`), forward over loopback,
rewrite `model`. Both servers run on loopback in this process's threads (uvicorn), the client is
one `httpx.Client` with keep-alive; rounds interleave the three paths so that a noisy neighbour
hits them alike.

`--local N` also measures the local backend (the batching engine, `serving/engine.py`): N
conversations at once, each `--turns` turns of up to `--max-tokens` new tokens (a reply, then a
scripted tool result as the next user turn), sent by N client threads through `serve` with the
openai client, non-streaming (requests/s) and then streaming (time to the first content chunk),
against the same conversations run in process with `map_batched` and rollout-style token
sessions (each turn appends the reply's tokens and the next message's, so a lane feeds only its
new tokens), in the same run. It prints the ratio and the engine's KV-reuse hit rate (second
and later turns that continued their slot's cache) and the share of prompt tokens not fed
again. The tiny random ChatML model by default; `--model DIR` for a real one (e.g. SmolLM2,
with `--chat-template` when its own template cannot express tools); `--model smollm2-shaped`
for random weights of SmolLM2-135M's shape on the tiny tokenizer (a real model's compute).

    .venv/bin/python benchmarks/serve_speed.py [--requests 300] [--local 8 --turns 4] [--json]
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


ASKS = [
    "please press the red button",
    "refund order 7",
    "where is my parcel, it was due yesterday",
    "cancel my subscription",
    "what is the price of the blue lamp",
    "change the address on order 12",
    "I want to return the shoes I bought",
    "is the green kettle in stock",
]
SYSTEM = "You are the shop's agent. Use the tools when needed and answer briefly. " * 4


def conversation(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{ASKS[i % len(ASKS)]} (customer {i})"},
    ]


def tool_result(turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"[tool result {turn}] ok, status {turn * 7}"}


def load_model(model_dir: str | None, chat_template: str | None) -> tuple[object, object]:
    """(policy, ChatFormat): the tiny random model with the ChatML tool template, or a folder."""
    from tracegym.generation.chat_format import ChatFormat, template_text

    if model_dir is None or model_dir == "smollm2-shaped":
        from tracegym.generation.model import tiny_model

        policy = tiny_model(seed=3)
        if model_dir is not None:  # SmolLM2-135M's layers, random, on the tiny vocabulary
            policy = smollm2_shaped(policy)
        return policy, ChatFormat(policy.tokenizer, template_text("chatml"))
    from tracegym.generation.model import load_policy, require_tool_template
    from tracegym.serving.local import fmt_with

    fmt = require_tool_template(model_dir, chat_template)
    policy = load_policy(model_dir)
    return policy, fmt_with(fmt, policy.tokenizer)


def smollm2_shaped(tiny: object) -> object:
    """A random Llama with SmolLM2-135M's shape (576 wide, 30 layers, 9 query and 3 key/value
    heads, 1536 MLP) over the tiny tokenizer (384 tokens instead of 49152): a real model's
    compute per token without its weights, which this machine cannot download."""
    import torch
    from tracegym.generation.model import Policy
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny.tokenizer  # type: ignore[attr-defined]
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        max_position_embeddings=2048, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    return Policy(model, tokenizer, "smollm2-shaped")


def in_process(policy: object, fmt: object, n: int, turns: int, max_tokens: int) -> dict:
    """The baseline: `map_batched` over the conversations, each turn appending tokens."""
    from tracegym.generation.batching import map_batched
    from tracegym.serving.local import stop_token

    stop = stop_token(fmt)
    latencies: list[float] = []

    def run(lane: object, i: int) -> list[str]:
        messages = conversation(i)
        ids = fmt.render_ids(messages)  # type: ignore[attr-defined]
        texts = []
        for turn in range(turns):
            start = time.perf_counter()
            reply, _ = lane.generate(ids, max_tokens, stop)  # type: ignore[attr-defined]
            latencies.append((time.perf_counter() - start) * 1000)
            text = fmt.tokenizer.decode(reply, skip_special_tokens=False)  # type: ignore[attr-defined]
            content = fmt.parse_reply(text).content or ""  # type: ignore[attr-defined]
            texts.append(content)
            done = [*messages, {"role": "assistant", "content": content}]
            before = fmt.render(done, add_generation_prompt=False)  # type: ignore[attr-defined]
            messages = [*done, tool_result(turn)]
            after = fmt.render(messages)  # type: ignore[attr-defined]
            suffix = after[len(before) :] if after.startswith(before) else after
            closing = [] if reply and reply[-1] == stop else [stop]
            ids = (
                ids + reply + closing + fmt.tokenizer(suffix, add_special_tokens=False)["input_ids"]
            )  # type: ignore[attr-defined]
        return texts

    start = time.perf_counter()
    stats: dict[str, int] = {}
    map_batched(policy, run, range(n), batch_size=n, stats=stats)  # type: ignore[arg-type]
    wall = time.perf_counter() - start
    return {"wall_s": wall, "latency_ms": latencies, "stats": stats}


def through_serve(
    url: str, n: int, turns: int, max_tokens: int, stream: bool, start_at: int = 0
) -> dict:
    """N client threads, one conversation each (numbered from `start_at`), through `serve` with
    the openai client."""
    import threading

    import openai

    latencies: list[float] = []
    firsts: list[float] = []
    lock = threading.Lock()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def converse(i: int) -> None:
        messages = conversation(start_at + i)
        for turn in range(turns):
            start = time.perf_counter()
            first = None
            if stream:
                parts = []
                for chunk in client.chat.completions.create(
                    model="base", messages=messages, max_tokens=max_tokens, stream=True
                ):
                    delta = chunk.choices[0].delta if chunk.choices else None
                    if delta is not None and (delta.content or delta.tool_calls):
                        first = first or time.perf_counter() - start
                        parts.append(delta.content or "")
                content = "".join(parts)
            else:
                reply = client.chat.completions.create(
                    model="base", messages=messages, max_tokens=max_tokens
                )
                content = reply.choices[0].message.content or ""
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed * 1000)
                firsts.append((first or elapsed) * 1000)
            messages = [*messages, {"role": "assistant", "content": content}, tool_result(turn)]

    start = time.perf_counter()
    threads = [threading.Thread(target=converse, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"wall_s": wall, "latency_ms": latencies, "first_ms": firsts}


def local_rows(args: argparse.Namespace) -> dict:
    """The local backend's conversations through serve against `map_batched` in process,
    interleaved over `--rounds` rounds (each path once per round, other conversations each
    time) so that a noisy neighbour hits them alike; medians over the rounds."""
    from tracegym.serving import ConversationRouter, create_app
    from tracegym.serving.engine import EngineStats
    from tracegym.serving.local import LocalBackend
    from tracegym.serving.server import running

    policy, fmt = load_model(args.model, args.chat_template)
    n, turns, max_tokens = args.local, args.turns, args.max_tokens
    requests = n * turns
    later = n * (turns - 1)
    rps: dict[str, list[float]] = {"in_process": [], "serve_plain": [], "serve_stream": []}
    reply_ms: dict[str, list[float]] = {name: [] for name in rps}
    first_ms: list[float] = []
    hits: list[float] = []
    engine: dict[str, float] = {}
    backend = LocalBackend(policy.model, fmt, slots=max(n, 1))  # type: ignore[attr-defined]
    with running(create_app(backend, ConversationRouter(None, [], "base"))) as url:
        in_process(policy, fmt, n, 1, 4)  # warm-up (kernels, allocator)
        through_serve(url, n, 1, 4, False, start_at=100_000)
        for r in range(args.rounds):
            base = in_process(policy, fmt, n, turns, max_tokens)
            rps["in_process"].append(requests / base["wall_s"])
            reply_ms["in_process"] += base["latency_ms"]
            for stream in (False, True):
                name = "serve_stream" if stream else "serve_plain"
                backend.engine.stats = EngineStats()
                run = through_serve(
                    url, n, turns, max_tokens, stream, start_at=1000 * r + 500 * stream
                )
                rps[name].append(requests / run["wall_s"])
                reply_ms[name] += run["latency_ms"]
                if stream:
                    first_ms += run["first_ms"]
                stats = backend.engine.stats
                if later:
                    hits.append(stats.continued / later)
                engine["rows_per_forward"] = stats.rows_per_forward
                engine["max_batch"] = max(engine.get("max_batch", 0), stats.max_batch)
                engine["prompt_tokens_reused"] = stats.reused_share
    ratios = [s / b for s, b in zip(rps["serve_plain"], rps["in_process"], strict=True)]
    ratios_stream = [s / b for s, b in zip(rps["serve_stream"], rps["in_process"], strict=True)]
    return {
        "conversations": n,
        "turns": turns,
        "max_tokens": max_tokens,
        "rounds": args.rounds,
        "model": args.model or "tiny random ChatML",
        "requests_per_s": {k: [round(v, 2) for v in vs] for k, vs in rps.items()},
        "x_in_process": {
            "serve_plain": round(statistics.median(ratios), 2),
            "serve_stream": round(statistics.median(ratios_stream), 2),
        },
        "p50_reply_ms": {k: round(statistics.median(v), 1) for k, v in reply_ms.items()},
        "p50_first_token_ms_stream": round(statistics.median(first_ms), 1),
        "kv_reuse_hit_rate": round(min(hits), 3) if hits else None,
        "prompt_tokens_reused_last": round(engine["prompt_tokens_reused"], 3),
        "rows_per_forward_last": round(engine["rows_per_forward"], 2),
        "max_batch": int(engine["max_batch"]),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def proxy_rows(requests: int) -> dict[str, dict[str, float]]:
    """serve's added latency in front of a fake upstream (see the module's docstring)."""
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
                for i in range(requests + 20):
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
    base = statistics.median(times["direct"])
    return {
        name: {
            "p50_ms": round(statistics.median(values), 3),
            "p95_ms": round(percentile(values, 0.95), 3),
            "p50_ratio": round(statistics.median(values) / base, 2),
            "added_p50_ms": round(statistics.median(values) - base, 3),
        }
        for name, values in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="0: skip the proxy part")
    parser.add_argument("--local", type=int, default=0, metavar="N", help="conversations")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--model", default=None, metavar="DIR")
    parser.add_argument("--chat-template", default=None, metavar="FILE")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    rows = proxy_rows(args.requests) if args.requests else {}
    local = local_rows(args) if args.local else None
    if args.json:
        print(json.dumps({"requests": args.requests, "goal_ms": GOAL_MS, "rows": rows,
                          "local": local}, indent=1))  # fmt: skip
        return
    if rows:
        print(f"{args.requests} requests per path, fake upstream on loopback")
        print(f"{'path':<20} {'p50 ms':>8} {'p95 ms':>8} {'x direct':>9} {'added p50 ms':>13}")
        for name, row in rows.items():
            print(
                f"{name:<20} {row['p50_ms']:>8.3f} {row['p95_ms']:>8.3f} "
                f"{row['p50_ratio']:>9.2f} {row['added_p50_ms']:>13.3f}"
            )
        worst = max(rows["serve, new"]["added_p50_ms"], rows["serve, remembered"]["added_p50_ms"])
        print(f"goal: added p50 under {GOAL_MS} ms: {'met' if worst < GOAL_MS else 'NOT met'}")
    if local:
        print(
            f"\nlocal backend ({local['model']}): {local['conversations']} conversations at once, "
            f"{local['turns']} turns of up to {local['max_tokens']} new tokens, "
            f"{local['rounds']} rounds interleaved"
        )
        print(f"{'path':<22} {'req/s per round':<28} {'x in-proc':>9} {'p50 reply ms':>13}")
        for name, values in local["requests_per_s"].items():
            ratio = local["x_in_process"].get(name, 1.0)
            shown = " ".join(f"{v:.2f}" for v in values)
            print(f"{name:<22} {shown:<28} {ratio:>9.2f} {local['p50_reply_ms'][name]:>13.1f}")
        print(
            f"time to first token (streaming, p50): {local['p50_first_token_ms_stream']:.1f} ms; "
            f"in process a reply comes whole ({local['p50_reply_ms']['in_process']:.1f} ms)"
        )
        print(
            f"KV reuse: {local['kv_reuse_hit_rate']} of later turns continued their slot (lowest "
            f"round); {local['prompt_tokens_reused_last']} of prompt tokens not fed again; "
            f"{local['rows_per_forward_last']} rows per forward, max batch {local['max_batch']}"
        )


if __name__ == "__main__":
    main()
