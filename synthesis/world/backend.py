"""The backend: tool semantics over a world's state."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from tracegym.synthesis.spec import (
    ArgSchema,
    Catalog,
    ToolSchema,
    is_id_name,
    json_type,
    matches_format,
)
from tracegym.synthesis.world.arithmetic import (
    calculate,
)
from tracegym.synthesis.world.builder import (
    echo_field,
    leaf_paths_cached,
)
from tracegym.synthesis.world.errors import (
    MEMORY_SEARCH,
    MEMORY_UPDATE,
    ToolError,
)
from tracegym.synthesis.world.json_paths import (
    canonical,
    canonical_value,
    path_tokens,
    set_at,
)
from tracegym.synthesis.world.roles import (
    Roles,
)
from tracegym.synthesis.world.state import (
    WorldState,
)
from tracegym.synthesis.world.values import (
    Gen,
)

# The backend ------------------------------------------------------------------------------------
MEMORY_TOOLS = {
    MEMORY_SEARCH: ToolSchema(
        MEMORY_SEARCH,
        {"query": ArgSchema("query", "string", True)},
        {"type": "array"},
        read=True,
        description="Search your notes (shared across conversations). Returns matching notes "
        "with their key, content and the source they were written from.",
    ),
    MEMORY_UPDATE: ToolSchema(
        MEMORY_UPDATE,
        {"key": ArgSchema("key", "string", True), "content": ArgSchema("content", "string", True)},
        {"type": "string"},
        read=False,
        description="Write (or overwrite) the note under `key`.",
    ),
}


class ToolWorld:
    """Executes tool calls against a task's state (a `WorldState`).

    Public state (what the verifier hashes): `owners`, `entities`, `memory`, `writes`. The other
    fields are the backend's own bookkeeping (finder attributes, flaky reads, silent failures)
    and never reach the hash. A read returns the record asked for; the action stores
    what its arguments name and answers in its recorded result shape.
    """

    def __init__(
        self, catalog: Catalog, roles: Roles, *, memory: bool = False, strict_formats: bool = False
    ) -> None:
        self.catalog = catalog
        self.roles = roles
        self.strict_formats = strict_formats
        names = [n for n in (roles.finder, roles.owner, roles.lookup, roles.action) if n]
        names += [n for n in roles.others if n not in names]
        if roles.answer_tool:
            names.append(roles.answer_tool)
        self.schemas: dict[str, ToolSchema] = {n: catalog.tools[n] for n in names}
        if memory:
            self.schemas.update(MEMORY_TOOLS)
        # which result field echoes which argument, per read (the record asked for)
        self.echoes: dict[str, list[tuple[str, str]]] = {}
        for n, schema in self.schemas.items():
            pairs = [(a, echo_field(schema, a)) for a in schema.arguments]
            self.echoes[n] = [(a, f) for a, f in pairs if f]
        # what the action stores in the record it acts on (see `write_paths`, `write_fills`)
        acts = roles.action in self.schemas
        self.sets = write_paths(catalog, roles) if acts else {}
        self.fills = write_fills(catalog, roles) if acts else {}

    def json_schemas(self) -> list[dict[str, Any]]:
        out = []
        for schema in self.schemas.values():
            item = schema.json_schema()
            if not schema.description:  # none recorded: not one that repeats the tool's name
                item["function"]["description"] = "Read-only." if schema.read else "Changes state."
            if schema.name == self.roles.answer_tool:
                item["function"]["description"] = (
                    "Send the final answer to the user (ends the task)."
                )
            out.append(item)
        return out

    # validation
    def check_arguments(self, name: str, arguments: Any) -> dict[str, Any]:
        schema = self.schemas.get(name)
        if schema is None:
            raise ToolError(f"unknown tool {name!r}", invalid=True)
        if not isinstance(arguments, Mapping):
            raise ToolError(f"{name}: arguments must be an object", invalid=True)
        missing = [a for a in schema.required if a not in arguments]
        if missing:
            raise ToolError(
                f"{name}: missing required argument(s) {', '.join(missing)}", invalid=True
            )
        unknown = [a for a in arguments if a not in schema.arguments]
        if unknown:
            raise ToolError(
                f"{name}: unexpected argument(s) {', '.join(map(str, unknown))}", invalid=True
            )
        for key, value in arguments.items():
            arg = schema.arguments[key]
            kind = json_type(value)
            ok = kind == arg.type or (arg.type == "number" and kind == "integer")
            if ok and arg.type == "array":
                want = arg.items or "string"
                ok = all(
                    json_type(v) == want or (want == "number" and json_type(v) == "integer")
                    for v in value
                )
            if not ok:
                raise ToolError(
                    f"{name}: {key} must be {arg.type}"
                    + (f" of {arg.items}" if arg.type == "array" else "")
                    + f", got {kind}",
                    invalid=True,
                )
            if self.strict_formats and arg.formats and name == self.roles.action:
                values = value if isinstance(value, list) else [value]
                bad = [
                    v for v in values if isinstance(v, str) and not matches_format(v, arg.formats)
                ]
                if bad:
                    raise ToolError(
                        f"{name}: {key}={bad[0]!r} does not match {arg.formats[0]['regex']}",
                        invalid=True,
                    )
            if arg.enum and value not in arg.enum:
                raise ToolError(f"{name}: {key} must be one of {arg.enum}", invalid=True)
        return dict(arguments)

    # execution
    def call(self, state: WorldState, name: str, arguments: Any) -> Any:
        args = self.check_arguments(name, arguments)
        r = self.roles
        if name == MEMORY_SEARCH:
            query = str(args.get("query", "")).casefold()
            notes = [{"key": k, **v} for k, v in sorted(state.memory.items())]
            return [n for n in notes if query in canonical(n).casefold()] if query else notes
        if name == MEMORY_UPDATE:
            state.memory[str(args["key"])] = {"content": str(args["content"])}
            return "saved"
        if name == r.finder:
            return self._find(state, args)
        if name == r.owner:
            oid = args.get(r.owner_arg)
            if oid not in state.owners:
                raise ToolError(f"{r.owner_arg} {oid!r} not found")
            return state.owners[oid]
        if name == r.lookup:
            eid = args.get(r.lookup_arg)
            if eid not in state.entities:
                raise ToolError(f"{r.lookup_arg} {eid!r} not found")
            flaky = state.flaky
            if flaky.get(eid, 0) > 0:
                flaky[eid] -= 1
                raise ToolError(f"{name}: upstream timeout, try again")
            return state.entities[eid]
        if name == r.action:
            return self._act(state, args)
        schema = self.schemas[name]
        lowered = name.lower()
        if lowered.startswith("calculate") or lowered.startswith("compute"):
            expression = next((v for v in args.values() if isinstance(v, str)), "")
            return calculate(expression)
        if lowered.startswith("think"):
            return ""
        rng = random.Random(f"{state.seed}:{name}:{canonical(args)}")
        result = Gen(rng).value(schema.result)
        if isinstance(result, dict):  # the record asked for: its id is the one requested
            for arg, field_name in self.echoes.get(name, ()):
                if arg in args:
                    result[field_name] = args[arg]
        if not schema.read:
            state.writes.append({"tool": name, "arguments": canonical_value(args)})
        return result

    def _find(self, state: WorldState, args: Mapping[str, Any]) -> Any:
        wanted = {k: str(v).strip().casefold() for k, v in args.items()}
        for oid, attrs in state.finder.items():
            if all(str(attrs.get(k, "")).strip().casefold() == v for k, v in wanted.items()):
                tokens = path_tokens(self.roles.finder_path)
                if not tokens:
                    return oid
                return set_at({}, tokens, oid)
        raise ToolError("no matching record found")

    def _act(self, state: WorldState, args: Mapping[str, Any]) -> Any:
        r = self.roles
        eid = args.get(r.id_arg)
        record = state.entities.get(eid)
        if record is None:
            raise ToolError(f"{r.id_arg} {eid!r} not found")
        status = state.status
        silent = state.silent
        if status:
            current = record.get(status["field"])
            if state.guard and current not in status["allowed"]:
                raise ToolError(f"{r.action}: not allowed while {status['field']} is {current!r}")
        changed = dict(record)
        for name, tokens in self.sets.items():
            if name in args:
                changed = replace_at(changed, tokens, canonical_value(args[name]))
        if self.fills:  # what the recorded results held where lookups showed nothing
            made = Gen(random.Random(f"{state.seed}:{r.action}:{canonical(args)}:fill"))
            for key, shape in self.fills.items():
                changed[key] = made.value(shape)
        if status and status.get("after"):
            changed[status["field"]] = status["after"]
        if silent.get(eid, 0) > 0:  # reports success, saves nothing
            silent[eid] -= 1
            return self._action_result(state, changed, args)
        state.entities[eid] = changed
        state.writes.append({"tool": r.action, "arguments": canonical_value(args)})
        return self._action_result(state, changed, args)

    def _action_result(
        self, state: WorldState, record: dict[str, Any], args: Mapping[str, Any]
    ) -> Any:
        """What the real tool returned, in its recorded shape: the record's fields (after the
        write) and the call's arguments where the shape has them, the rest generated."""
        shape = self.schemas[self.roles.action].result
        kind = shape.get("type")
        if kind == "object":
            props = shape.get("properties") or {}
            if not props:
                return dict(record)
            echoed = {f: args[a] for a, f in self.echoes.get(self.roles.action, ()) if a in args}
            out = {}
            missing = []
            for key in shape.get("required", props):
                if key in echoed:  # the field the recorded results held the argument in
                    out[key] = echoed[key]
                elif key in record:
                    out[key] = record[key]
                elif key in args:
                    out[key] = args[key]
                else:
                    missing.append(key)
            if missing:  # generated only when needed: a large result shape costs a step
                rng = random.Random(f"{state.seed}:{self.roles.action}:{canonical(args)}")
                made = Gen(rng).value(shape)
                for key in missing:
                    out[key] = made.get(key) if isinstance(made, dict) else None
            return out
        if kind == "string":
            examples = shape.get("examples") or ()
            return examples[0] if examples else "ok"  # "ok" only where nothing was recorded
        rng = random.Random(f"{state.seed}:{self.roles.action}:{canonical(args)}")
        return Gen(rng).value(shape)


def write_paths(catalog: Catalog, roles: Roles) -> dict[str, list[str]]:
    """The action's arguments a call stores in the record it acts on, with where: an argument
    named like one field of the record (`seat`; `address1` -> `address.address1`; ids excepted:
    an id names a record, it is not a value to store), and an argument whose value the recorded
    results echoed in a field the record has (`payment_method_id` ->
    `exchange_payment_method_id`). Only where the field is the one so named."""
    r = roles
    lookup = catalog.tools.get(r.lookup) if r.lookup else None
    action = catalog.tools.get(r.action)
    if lookup is None or action is None:
        return {}
    out: dict[str, list[str]] = {}
    for name in action.arguments:
        if name in (r.id_arg, r.lookup_arg) or is_id_name(name):
            continue
        paths = leaf_paths_cached(lookup.result, name)
        if len(paths) == 1:
            out[name] = path_tokens(paths[0])
    for name, field_name in (getattr(action, "echoes", None) or {}).items():
        if name in (r.id_arg, r.lookup_arg) or name in out or name not in action.arguments:
            continue
        paths = leaf_paths_cached(lookup.result, field_name)
        if len(paths) == 1:
            out[name] = path_tokens(paths[0])
    return out


def write_fills(catalog: Catalog, roles: Roles) -> dict[str, dict[str, Any]]:
    """The record's fields the action fills, with their recorded shape: those every lookup
    showed empty (`exchange_items: null` before an exchange) and the action's recorded results
    held a value in (`exchange_items: ["4153505238"]`), where no argument says what goes there."""
    lookup = catalog.tools.get(roles.lookup) if roles.lookup else None
    action = catalog.tools.get(roles.action)
    if lookup is None or action is None or action.result.get("type") != "object":
        return {}
    before = lookup.result.get("properties") or {}
    after = action.result.get("properties") or {}
    stored = {tokens[0] for tokens in write_paths(catalog, roles).values() if len(tokens) == 1}
    return {
        k: after[k]
        for k in action.result.get("required", after)
        if k in after
        and k not in stored
        and before.get(k, {}).get("type") == "null"
        and after[k].get("type") not in (None, "null")
    }


def replace_at(record: dict[str, Any], tokens: list[str], value: Any) -> dict[str, Any]:
    """`record` with the (fan-free) path set to `value`, copying every object on the way: the
    state's records are forked one level deep, so nested objects are shared with the parent."""
    out = dict(record)
    node = out
    for token in tokens[:-1]:
        child = node.get(token)
        child = dict(child) if isinstance(child, dict) else {}
        node[token] = child
        node = child
    node[tokens[-1]] = value
    return out


def public_state(state: WorldState | Mapping[str, Any], memory: bool = False) -> dict[str, Any]:
    """What the verifier's state hash covers: records and writes, without the backend's own
    bookkeeping (a `WorldState`'s private fields; a plain dict state's `_` keys) and, unless
    asked, without memory (free text: checked separately). Writes in a canonical order."""
    if isinstance(state, WorldState):
        out = state.to_dict(memory=memory)
    else:
        out = {
            k: v for k, v in state.items() if not k.startswith("_") and (memory or k != "memory")
        }
    if "writes" in out:
        out["writes"] = sorted(out["writes"], key=canonical)
    return out
