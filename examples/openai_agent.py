"""A support agent written the way users write agents: the `openai` client with `tools=`.

It serves any bundled domain (`examples/domains.py`: the shop, the clinic). Nothing in it is
tracegym's prompt format: the system prompt is the domain's rules, the tools go as
`tools=<the domain's schemas>`, calls come back as `tool_calls` and their results go back as `tool`
messages with their `tool_call_id`, and the server's chat template does the rest. Point
`base_url` at `tracegym serve` (or any OpenAI-compatible server) and the same loop runs on
whichever adapter the server routes the conversation to.

    agent = OpenAIAgent("http://127.0.0.1:8808/v1", domain=SHOP, notes=CustomerNotes(path))
    result = agent.run(SHOP.make_task(7))
    results = agent.run_many(tasks, concurrency=8)   # the server batches concurrent requests

Tracing is tracegym's, as a user adds it: `tg.instrument("openai")` records each model call
(messages, tool definitions, usage), the tools are `@tg.tool` spans (`examples/shop.py`), the
episode is an `@tg.agent` run with a run id of its own, and the verifier's verdict is recorded
against that id after the episode returns (`tg.record_outcome`). A model call that fails (an
error status, a timeout, no server) ends its episode as failed with the error in its reasons;
it never ends a batch.

    python -m tracegym.examples.openai_agent --base-url http://127.0.0.1:8808/v1 --tasks 20
"""

from __future__ import annotations

import argparse
import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import tracegym as tg
from tracegym.examples.domains import SHOP, Domain, Task, Tools, domain_named
from tracegym.examples.lm_agent import CustomerNotes, TaskResult

ADAPTER_HEADER = "x-tracegym-adapter"


@dataclass
class Episode:
    """One task's conversation: its tools, the OpenAI messages, and what the server said."""

    request: str
    tools: Tools
    answer: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    adapter: str | None = None
    generated_tokens: int = 0
    error: str | None = None  # the model call that failed, if one did


class ModelCallError(Exception):
    """A model call that gave no reply to read; it ends the episode, failed."""


@dataclass(frozen=True)
class ToolRequest:
    """One entry of a reply's `tool_calls`: arguments as the model wrote them (JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ModelReply:
    """A chat completion as the loop reads it."""

    message: dict[str, Any]  # the assistant message, as it goes back in the conversation
    content: str
    tool_calls: list[ToolRequest]
    adapter: str | None  # which adapter wrote it (None: the base model, or not said)
    completion_tokens: int


def _read(response: Any, adapter_header: str | None) -> ModelReply:
    """The first choice of `response`. The adapter is `tracegym serve`'s `x-tracegym-adapter`
    header ("" there: the base model), else the response's `model`. Raises on a reply that is
    not a chat completion (the client does not validate what servers send)."""
    message = response.choices[0].message
    calls = [
        ToolRequest(_text(call.id), _text(call.function.name), _json_text(call.function.arguments))
        for call in message.tool_calls or []
    ]
    if adapter_header is not None:
        adapter = adapter_header or None
    else:
        adapter = response.model if isinstance(response.model, str) and response.model else None
    usage = response.usage
    tokens = usage.completion_tokens if usage is not None else 0
    return ModelReply(
        message=message.model_dump(exclude_none=True),
        content=message.content if isinstance(message.content, str) else "",
        tool_calls=calls,
        adapter=adapter,
        completion_tokens=tokens if isinstance(tokens, int) else 0,
    )


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _json_text(arguments: Any) -> str:
    """Arguments as JSON text (servers that send an object instead are read too)."""
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


class OpenAIAgent:
    """A domain's agent over an OpenAI-compatible endpoint (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        domain: Domain = SHOP,
        model: str = "auto",
        max_turns: int = 6,
        max_tokens: int = 96,
        split: str = "",
        notes: CustomerNotes | None = None,
        timeout: float = 120.0,
        max_retries: int = 2,
        client: Any = None,
        instrument: bool = True,
    ) -> None:
        """`model`: "auto" lets `tracegym serve` route each conversation; an adapter's or the
        base model's name picks it. `client`: an `openai.OpenAI` of your own (then `base_url`,
        `timeout` and `max_retries` are its business). `instrument`: `tg.instrument("openai")`."""
        import openai

        if instrument:
            tg.instrument("openai", strict=False)
        self.client = client or openai.OpenAI(
            base_url=base_url, api_key="unused", timeout=timeout, max_retries=max_retries
        )
        self.domain = domain
        self.tool_schemas = [dict(t) for t in domain.tool_schemas]
        self.model = model
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.split = split
        self.notes = notes

    # One model call ---------------------------------------------------------------------------
    def complete(self, messages: list[dict[str, Any]]) -> ModelReply:
        """One chat completion, read; `ModelCallError` when there is none to read (an error
        status, a timeout, no server, a reply that is not a chat completion)."""
        import openai

        try:
            raw = self.client.chat.completions.with_raw_response.create(
                model=self.model,
                messages=messages,
                tools=self.tool_schemas,
                temperature=0,
                max_tokens=self.max_tokens,
            )
            response = raw.parse()
        except openai.OpenAIError as exc:
            raise ModelCallError(f"{type(exc).__name__}: {exc}") from exc
        try:
            return _read(response, raw.headers.get(ADAPTER_HEADER))
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise ModelCallError(f"an unreadable reply: {type(exc).__name__}: {exc}") from exc

    # One episode ------------------------------------------------------------------------------
    def solve(self, episode: Episode, run_id: str) -> None:
        """The episode as an `invoke_agent` run with id `run_id`: recall the customer, converse
        with the model and the tools, note what happened."""
        request = episode.request
        with tg.agent(self.domain.agent_name, run_id=run_id, input=request) as span:
            email = self.customer_of(request)
            note = self.notes.read(email) if self.notes is not None and email else None
            episode.messages += self.opening(request, note)
            self.converse(episode)
            if self.notes is not None and email:
                done = ", ".join(name for name, _, _ in episode.tools.calls) or "no tool"
                answer = episode.answer[:160]
                self.notes.write(email, f"asked: {request} | did: {done} | answered: {answer}")
            span.set_result(episode.error or episode.answer)

    def customer_of(self, request: str) -> str | None:
        """Who is asking (the key the agent's notes are kept under), when it keeps notes."""
        return customer_of(self.domain, request) if self.notes is not None else None

    def opening(self, request: str, note: str | None) -> list[dict[str, Any]]:
        return opening(self.domain, request, note)

    def converse(self, episode: Episode) -> None:
        """Ask, run the tools the reply calls, send their results back, until the model answers
        in plain text, runs out of turns, or a call fails."""
        messages = episode.messages
        for _ in range(self.max_turns):
            try:
                reply = self.complete(messages)
            except ModelCallError as exc:
                episode.error = f"the model call failed: {exc}"
                return
            episode.adapter = reply.adapter or episode.adapter
            episode.generated_tokens += reply.completion_tokens
            messages.append(reply.message)
            if not reply.tool_calls:
                episode.answer = reply.content
                return
            for call in reply.tool_calls:
                result = episode.tools.call(call.name, _arguments(call.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

    def run(self, task: Task) -> TaskResult:
        """Solve one task and record the verifier's outcome against the episode's run id."""
        started = time.perf_counter()
        episode = Episode(task.request, self.domain.tools_for(task))
        run_id = uuid.uuid4().hex
        self.solve(episode, run_id=run_id)
        verdict = self.domain.verify(task, episode.tools, episode.answer)
        reasons = [episode.error] if episode.error else []
        passed = verdict.passed and not reasons
        labels = {
            "task_id": task.task_id,
            "split": self.split,
            "adapter": episode.adapter or "none",
        }
        tg.record_outcome(
            run_id, success=passed, reward=verdict.reward, source="verifier", labels=labels
        )
        return TaskResult(
            task_id=task.task_id,
            seed=task.seed,
            kind=task.kind,
            passed=passed,
            reward=verdict.reward,
            reasons=reasons + verdict.reasons,
            answer=episode.answer,
            calls=[
                f"{name}({', '.join(map(str, args.values()))})"
                for name, args, _ in episode.tools.calls
            ],
            run_id=run_id,
            adapter=episode.adapter,
            generated_tokens=episode.generated_tokens,
            seconds=round(time.perf_counter() - started, 3),
            messages=episode.messages,
        )

    def run_many(
        self,
        tasks: Sequence[Task],
        *,
        concurrency: int = 8,
        on_done: Callable[[TaskResult], None] | None = None,
    ) -> list[TaskResult]:
        """`[run(t) for t in tasks]` on `concurrency` threads, each one conversation at a time
        (the server batches the requests in flight); results in the tasks' order."""

        def one(task: Task) -> TaskResult:
            result = self.run(task)
            if on_done is not None:
                on_done(result)
            return result

        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(one, tasks))


def customer_of(domain: Domain, request: str) -> str | None:
    """Who is asking, in the request's words (the domain's customer key)."""
    found = re.search(domain.customer_key, request)
    return found.group() if found else None


def opening(domain: Domain, request: str, note: str | None) -> list[dict[str, Any]]:
    """A conversation's first messages: the rules, and the request with the agent's note on
    this customer."""
    said = request + (f"\n(Your notes on this customer: {note})" if note else "")
    return [{"role": "system", "content": domain.rules}, {"role": "user", "content": said}]


def first_messages(
    domain: Domain, request: str, notes: CustomerNotes | None
) -> list[dict[str, Any]]:
    """What the first model call of `request`'s conversation sends, read without recording a
    memory read (a server's routing decision can be asked ahead of the conversation)."""
    key = customer_of(domain, request) if notes is not None else None
    note = notes.notes_as_opened().get(key) if notes is not None and key else None
    return opening(domain, request, note)


def _arguments(text: str) -> Any:
    """The call's arguments as the model wrote them: a JSON object when they parse (the shop
    refuses anything else, and the model reads why)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


__all__ = [
    "CustomerNotes",
    "Episode",
    "ModelCallError",
    "ModelReply",
    "OpenAIAgent",
    "TaskResult",
    "ToolRequest",
    "customer_of",
    "first_messages",
    "opening",
]


def main(argv: Sequence[str] | None = None) -> None:
    """Run the agent on demonstration tasks against a server and print the pass rate."""
    parser = argparse.ArgumentParser(description="An agent over an OpenAI-compatible server.")
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8808/v1")
    parser.add_argument("--domain", default="shop", help="shop or clinic")
    parser.add_argument("--model", default="auto")
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    try:
        domain = domain_named(args.domain)
    except ValueError as exc:
        parser.error(str(exc))
    tg.init()
    agent = OpenAIAgent(args.base_url, domain=domain, model=args.model, max_tokens=args.max_tokens)
    tasks = domain.tasks(domain.demo_seeds, args.tasks)
    started = time.perf_counter()
    results = agent.run_many(tasks, concurrency=args.concurrency)
    seconds = time.perf_counter() - started
    passed = sum(r.passed for r in results)
    tokens = sum(r.generated_tokens for r in results)
    print(
        f"{passed}/{len(results)} passed; {tokens} tokens generated in {seconds:.1f} s "
        f"({tokens / max(seconds, 1e-9):.0f} tokens/s, concurrency {args.concurrency})"
    )
    tg.flush(10)


if __name__ == "__main__":
    main()
