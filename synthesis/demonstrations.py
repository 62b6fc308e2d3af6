"""The registered environments' oracle demonstrations as OpenAI chat fine-tuning lines.

`tracegym export openai-ft --from demos` writes these beside the store's passing runs. They are
built here, above the store, because they read the environment registry; the line format, the
validation and the writer are the store's exporter's (`tracegym.store.exporters.openai_ft`).
Each one is built as training builds it (`registry.demonstration`, the environment's tool
schemas), on its train seeds only (never the held-out ones), and kept only when the verifier
passes it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from tracegym.store.exporters.chat_messages import to_openai, tool_schemas
from tracegym.store.exporters.openai_ft import Example, line_of, number_calls
from tracegym.synthesis import registry
from tracegym.synthesis.registry import RegistryError, demonstration


def demo_examples(
    home: str | Path, env_ids: Sequence[str] = (), *, per_env: int | None = None
) -> Iterator[Example]:
    """Oracle demonstrations of the registered environments (all, or `env_ids`) on their
    train seeds (the registered number, or at most `per_env`)."""
    entries = registry.list_envs(home)
    known = {e.env_id for e in entries}
    missing = [e for e in env_ids if e not in known]
    if missing:
        raise RegistryError(
            f"no environment {missing[0]!r} under {registry.envs_dir(home)} "
            f"(registered: {', '.join(sorted(known)) or 'none'})"
        )
    for item in entries:
        env_id = item.env_id
        if env_ids and env_id not in env_ids:
            continue
        try:
            env = registry.load(home, env_id)
        except (RegistryError, ValueError, TypeError) as exc:
            yield Example(env_id, "demo", None, f"cannot load the environment: {exc}")
            continue
        start, stop = env.spec.train_seeds if env.spec else (0, 0)
        count = item.tasks.train
        if per_env is not None:
            count = min(count, per_env)
        tools = tool_schemas(env.tool_schemas())
        for seed in range(start, min(stop, start + count)):
            source = f"{env_id}:{seed}"
            demo = demonstration(env, seed)
            if not demo["passed"]:
                yield Example(source, "demo", None, "the oracle's demonstration does not pass")
                continue
            messages = number_calls(to_openai(demo["messages"]))
            yield Example(source, "demo", line_of(messages, tools))
