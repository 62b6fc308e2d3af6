"""Capabilities: the environments that train one adapter together.

Synthesis builds one environment per gap, and several gaps can be about the same action (the
demo's refunds: flailing after a refused refund, refunding the wrong order, never refunding).
Each such environment teaches the same tool from another side, so they make one capability and
train one adapter on their mixed demonstrations, instead of one adapter each: the night trains
and evaluates a capability once (the demo's full size went from four adapters to two).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracegym.training.adapters import AdapterMetadata, CapabilityRef, adapter_id_for

if TYPE_CHECKING:
    from tracegym.synthesis.base import Environment


@dataclass(frozen=True)
class Capability:
    """Environments (one or more) that one adapter learns; `action` the tool they teach."""

    adapter_id: str
    envs: tuple[Environment, ...]
    action: str | None

    @property
    def env_ids(self) -> list[str]:
        return [env.env_id for env in self.envs]

    def ref(self) -> CapabilityRef:
        """The adapter metadata's `capability` (its `env_id` is the first environment's,
        `env_ids` all of them)."""
        gaps = [(env.spec.gap if env.spec is not None else {}) or {} for env in self.envs]
        names = [str(g.get("name") or env.env_id) for g, env in zip(gaps, self.envs, strict=True)]
        ids = [str(g.get("id") or env.env_id) for g, env in zip(gaps, self.envs, strict=True)]
        single = len(self.envs) == 1
        return CapabilityRef(
            id=ids[0] if single else "+".join(ids),
            name=names[0] if single else f"{self.action}: {', '.join(names)}",
            env_id=self.envs[0].env_id,
            env_ids=tuple(self.env_ids),
            family="+".join(dict.fromkeys(env.family for env in self.envs)),
            action=self.action,
        )

    def meta(self) -> dict[str, Any]:
        """`ref()` as the JSON record meta.json keeps."""
        return self.ref().to_dict()


def action_of(env: Environment) -> str | None:
    spec = getattr(env, "spec", None)
    return (getattr(spec, "roles", None) or {}).get("action") or None


def capabilities(envs: Iterable[Environment], *, by_action: bool = True) -> list[Capability]:
    """Group `envs` into capabilities: with `by_action`, those teaching the same action train
    together; an environment alone in its group (or with no action) keeps the adapter id of
    one environment (`adapter_id_for(env_id)`), so nights without shared actions name their
    adapters as before. A group's id is its action and a hash of its environments, so a new
    environment for the action makes a new adapter rather than silently retraining an old one."""
    groups: dict[tuple[str | None, str], list[Environment]] = {}
    for env in envs:
        action = action_of(env) if by_action else None
        groups.setdefault((action, "" if action else env.env_id), []).append(env)
    out = []
    for (action, _), members in groups.items():
        if len(members) == 1:
            out.append(Capability(adapter_id_for(members[0].env_id), (members[0],), action))
            continue
        digest = hashlib.sha256("\n".join(sorted(e.env_id for e in members)).encode()).hexdigest()
        out.append(Capability(adapter_id_for(f"{action}-{digest[:10]}"), tuple(members), action))
    return out


def env_ids_of(meta: AdapterMetadata | Mapping[str, Any]) -> list[str]:
    """The environments an adapter's metadata says it learnt (older metadata: its one env_id).
    AdapterDocumentError when the metadata names none."""
    if isinstance(meta, AdapterMetadata):
        return list(meta.capability.env_ids)
    return list(CapabilityRef.from_dict(meta.get("capability") or {}).env_ids)


def split_seeds(n: int, envs: Sequence[Environment]) -> list[list[int]]:
    """`n` training seeds shared out over `envs` in turn, each from its env's own train range:
    a capability of k environments trains on as many demonstrations as one environment."""
    out: list[list[int]] = [[] for _ in envs]
    for i in range(n):
        k = i % len(envs)
        spec = envs[k].spec
        t0, t1 = spec.train_seeds if spec is not None else (0, 10_000)
        if t0 + len(out[k]) < t1:
            out[k].append(t0 + len(out[k]))
    return out


__all__ = ["Capability", "action_of", "capabilities", "env_ids_of", "split_seeds"]
