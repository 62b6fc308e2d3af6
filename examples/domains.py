"""The bundled domains the demo can run on, each as one typed `Domain` descriptor.

Why: the demo's loop (trace the agent, analyze, synthesize, train, route, held-out gain) must run
on a second domain by the same code path. Everything the demo needs of a domain is here, so a
caller takes `DOMAINS[name]` instead of importing one domain's module:

    domain = DOMAINS["clinic"]
    task = domain.make_task(7)                  # .task_id .seed .kind .request
    tools = domain.tools_for(task)              # traced tools: .call(name, arguments) -> str
    verdict = domain.verify(task, tools, answer)
    conversation = domain.demonstration(task)   # OpenAI messages of the oracle's episode

| domain | module             | kinds                            | base mix: common / rare   |
|--------|--------------------|----------------------------------|---------------------------|
| shop   | examples/shop.py   | status, cancel, refund, address  | status, cancel / refund,  |
|        |                    |                                  | address                   |
| clinic | examples/clinic.py | when, cancel, book, move         | when, move / cancel, book |
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from tracegym.examples import clinic, shop
from tracegym.examples.shop import Verdict

SeedRange = tuple[int, int]  # [start, stop)


class Task(Protocol):
    """What the demo reads of a domain's task."""

    @property
    def task_id(self) -> str: ...

    seed: int
    kind: str

    @property
    def request(self) -> str: ...


class Tools(Protocol):
    """A task's tools as the agent uses them: `call` never raises (a refusal is "Error: ...");
    `calls` is every call made, as (name, arguments, ok)."""

    calls: list[tuple[str, dict[str, Any], bool]]

    def call(self, name: Any, arguments: Any) -> str: ...


@dataclass(frozen=True, eq=False)
class Domain:
    """One bundled domain: its tasks, tools, rules, oracle and verifier (see the module
    docstring). `base_mix` is the base fine-tune's task mix: common kinds weigh more, and the
    rare ones are the base agent's weaknesses nothing downstream is told of."""

    name: str
    agent_name: str
    kinds: tuple[str, ...]
    dev_seeds: SeedRange
    demo_seeds: SeedRange
    heldout_seeds: SeedRange
    rules: str
    tool_schemas: tuple[Mapping[str, Any], ...]
    base_mix: Mapping[str, float]
    make_task: Callable[..., Any]  # (seed, kinds=..., weights=None) -> Task
    tools_for: Callable[[Any], Any]  # Task -> traced Tools
    verify: Callable[[Any, Any, str], Verdict]  # (Task, Tools, answer) -> Verdict
    demonstration: Callable[[Any], list[dict[str, Any]]]  # Task -> OpenAI messages
    oracle_actions: Callable[[Any], list[tuple[str, dict[str, str]]]]  # Task -> calls, in order
    oracle_answer: Callable[[Any], str]  # Task -> the oracle's final answer
    # who is asking, in the request's words (the agent's notes are kept per match): a regex
    customer_key: str = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"

    def __post_init__(self) -> None:
        if set(self.base_mix) != set(self.kinds):
            raise ValueError(f"{self.name}: the base mix must weigh every kind {self.kinds}")
        ranges = sorted((self.dev_seeds, self.demo_seeds, self.heldout_seeds))
        if any(a[1] > b[0] for a, b in itertools.pairwise(ranges)):
            raise ValueError(f"{self.name}: the dev, demo and held-out seeds must not overlap")
        object.__setattr__(self, "base_mix", MappingProxyType(dict(self.base_mix)))
        object.__setattr__(self, "tool_schemas", tuple(self.tool_schemas))

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tool_schemas)

    def tasks(
        self, seeds: SeedRange, n: int, offset: int = 0, weights: Sequence[float] | None = None
    ) -> list[Any]:
        """`n` tasks from the start (plus `offset`) of a seed range."""
        start = seeds[0] + offset
        if start + n > seeds[1]:
            raise ValueError(f"{n} tasks from {start} leave the seed range {seeds}")
        return [self.make_task(s, self.kinds, weights) for s in range(start, start + n)]


SHOP = Domain(
    name="shop",
    agent_name="shop-agent",
    kinds=shop.KINDS,
    dev_seeds=shop.DEV_SEEDS,
    demo_seeds=shop.DEMO_SEEDS,
    heldout_seeds=shop.HELDOUT_SEEDS,
    rules=shop.RULES,
    tool_schemas=tuple(shop.TOOL_SCHEMAS),
    base_mix={"status": 0.4, "cancel": 0.4, "refund": 0.1, "address": 0.1},
    make_task=shop.make_task,
    tools_for=shop.ShopTools,
    verify=shop.verify,
    demonstration=shop.demonstration,
    oracle_actions=shop.oracle_actions,
    oracle_answer=shop.oracle_answer,
)

CLINIC = Domain(
    name="clinic",
    agent_name="clinic-agent",
    kinds=clinic.KINDS,
    dev_seeds=clinic.DEV_SEEDS,
    demo_seeds=clinic.DEMO_SEEDS,
    heldout_seeds=clinic.HELDOUT_SEEDS,
    rules=clinic.RULES,
    tool_schemas=tuple(clinic.TOOL_SCHEMAS),
    base_mix={"when": 0.4, "cancel": 0.1, "book": 0.1, "move": 0.4},
    make_task=clinic.make_task,
    tools_for=clinic.ClinicTools,
    verify=clinic.verify,
    demonstration=clinic.demonstration,
    oracle_actions=clinic.oracle_actions,
    oracle_answer=clinic.oracle_answer,
    customer_key=r"\b\d{3}-\d{4}\b",  # the patient's phone
)

DOMAINS: Mapping[str, Domain] = MappingProxyType({d.name: d for d in (SHOP, CLINIC)})


def domain_named(name: str) -> Domain:
    """The bundled domain `name`; ValueError naming the known ones otherwise."""
    try:
        return DOMAINS[name]
    except KeyError:
        raise ValueError(f"unknown domain {name!r} (known: {', '.join(DOMAINS)})") from None


__all__ = ["CLINIC", "DOMAINS", "SHOP", "Domain", "SeedRange", "Task", "Tools", "domain_named"]
