"""The chain world's state: what `ToolWorld` reads and changes, as typed fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Record = dict[str, Any]


@dataclass
class WorldState:
    """One task's world. Public (what the verifier hashes, `to_dict`): the owner records, the
    entity records (each by its id), the notes and the writes that landed. The rest is the
    backend's own bookkeeping and never reaches the hash: the seed its generated values come
    from, the finder's attributes per owner id, reads that fail before they answer (`flaky`:
    entity id -> failures left), writes that report success and save nothing (`silent`: entity
    id -> how many), the status rule writes are held to (`Roles.status`: `field`, `allowed`,
    `refused`, `after`), and whether a write outside `allowed` is refused (`guard`)."""

    owners: dict[str, Record] = field(default_factory=dict)
    entities: dict[str, Record] = field(default_factory=dict)
    memory: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> {"content", ...}
    writes: list[dict[str, Any]] = field(default_factory=list)  # {"tool", "arguments"}
    seed: int = 0
    finder: dict[str, dict[str, Any]] = field(default_factory=dict)
    flaky: dict[str, int] = field(default_factory=dict)
    silent: dict[str, int] = field(default_factory=dict)
    status: dict[str, Any] | None = None
    guard: bool = False

    def fork(self) -> WorldState:
        """A copy tool calls can change without touching this one. The backend only replaces
        top-level fields of records, notes and counters, and appends writes: copying those
        levels is enough (and much cheaper than a deep copy). The seed, finder attributes and
        status rule are shared (never changed by a call)."""
        return WorldState(
            owners={k: dict(v) for k, v in self.owners.items()},
            entities={k: dict(v) for k, v in self.entities.items()},
            memory=dict(self.memory),
            writes=list(self.writes),
            seed=self.seed,
            finder=self.finder,
            flaky=dict(self.flaky),
            silent=dict(self.silent),
            status=self.status,
            guard=self.guard,
        )

    def to_dict(self, memory: bool = True) -> dict[str, Any]:
        """The public state as plain JSON-like data (the records themselves, not copies):
        `owners`, `entities`, `memory` (unless `memory=False`) and `writes` in call order."""
        out: dict[str, Any] = {"owners": self.owners, "entities": self.entities}
        if memory:
            out["memory"] = self.memory
        out["writes"] = self.writes
        return out


__all__ = ["Record", "WorldState"]
