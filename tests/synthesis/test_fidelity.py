"""The fidelity check: generated worlds against the schema inferred from the traces.

A hand-built order world (`Orders`) is faithful to its traces and passes; each deliberate break
(an id in the wrong format, a date like 9872-24-24, an enum value never observed, a read that
returns another record, a write that changes nothing, a prompt that states the answer, ...)
fails it with the seed, the place and the problem. The facts the check needs are recorded by
`infer_catalog`; catalogs saved before them still load and skip those parts. The check gates
registration (`check_environment`'s "fidelity"), `envs check` shows it and `envs show` prints
the mined rules. On the shared tau-retail runs and the demo's shop runs, every family's
environment passes on 200 seeds (skipped where ../shared/data is absent).
"""

from __future__ import annotations

import json
import random
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from tracegym.synthesis.base import Environment, Task
from tracegym.synthesis.fidelity import FidelityReport, check_fidelity, prompt_leaks
from tracegym.synthesis.spec import Catalog, EnvironmentSpec, infer_catalog
from tracegym.synthesis.validity import Check, ValidityReport, check_environment
from tracegym.synthesis.world import ToolError

pytestmark = pytest.mark.timeout(180)

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
RETAIL = SHARED / "agentrx-tau-retail" / "tau_dataset_full.json"
NAMES = ("Desk Lamp", "Kettle", "Backpack", "Jacket", "Blender")
START = date(2024, 5, 1)
REASONS = ("no longer needed", "ordered by mistake")


def _call(tool: str, arguments: dict[str, Any], result: Any, error: bool = False) -> dict:
    return {"tool": tool, "arguments": json.dumps(arguments),
            "result": None if error else json.dumps(result), "error": error}  # fmt: skip


def order_traces(n: int = 40, seed: int = 0) -> list[list[dict[str, Any]]]:
    """An agent that looks orders up and cancels the pending ones."""
    rng = random.Random(seed)
    traces = []
    for _ in range(n):
        placed = START + timedelta(days=rng.randrange(30))
        record = {
            "order_id": f"#W{rng.randrange(10**6, 10**7)}",
            "status": rng.choice(("pending", "processed")),
            "placed": placed.isoformat(),
            "ships": (placed + timedelta(days=rng.randrange(1, 6))).isoformat(),
            "total": round(rng.uniform(10, 500), 2),
            "items": [{"item_id": str(rng.randrange(10**9, 10**10)), "name": rng.choice(NAMES)}
                      for _ in range(rng.randint(1, 3))],
        }  # fmt: skip
        calls = [_call("get_order", {"order_id": record["order_id"]}, record)]
        if record["status"] == "pending":
            reason = rng.choice(REASONS)
            done = {**record, "status": "cancelled", "cancel_reason": reason}
            arguments = {"order_id": record["order_id"], "reason": reason}
            calls.append(_call("cancel_order", arguments, done))
        traces.append(calls)
    return traces


BREAKS = {
    # break: (where the issue is, what it says)
    "id_format": ("get_order result.order_id", "does not match the recorded format"),
    "date": ("get_order result.placed", "'9872-24-24' is not a valid date"),
    "date_range": ("get_order result.placed", "is outside the recorded dates"),
    "date_order": ("get_order result.placed", "in the traces placed never came after ships"),
    "enum": ("get_order result.status", "is not a value the traces showed"),
    "number": ("get_order result.total", "is outside the recorded range"),
    "decimals": ("get_order result.total", "has more decimals than the recorded 2"),
    "type": ("get_order result.total", "is string"),
    "invented_field": ("get_order result.loyalty", "a field the traces never showed"),
    "nested": ("get_order result.items[0].item_id", "does not match the recorded format"),
    "read_other": ("get_order result.order_id", "returned the record of order_id"),
    "write_noop": ("cancel_order on orders[", "left the record it names unchanged"),
    "write_shape": ("cancel_order result", "is string"),
    "write_echo": ("cancel_order result.cancel_reason", "a write of reason 'no longer needed'"),
    "prompt_order": ("system prompt", "names the order of the oracle's calls"),
    "prompt_then": ("system prompt", "names the order of the oracle's calls"),
    "prompt_rule": ("system prompt", "states the 'pending'"),
    "prompt_argument": ("system prompt", "holds the oracle's argument"),
    "description": ("tool description cancel_order", "names the order of the oracle's calls"),
    "missing_field": ("get_order result", "lacks field(s) most recorded results had: ships"),
    "null": ("get_order result.total", "is null where the traces never showed null"),
    "crash": ("generation", "raised KeyError"),
    "tool_crash": ("oracle replay", "raised RuntimeError: backend down"),
}


class Orders(Environment):
    """Two orders of a customer; the user asks to cancel the first one. The `broken` knob
    breaks one thing (see BREAKS) in every task."""

    family = "orders_test"

    def default_knobs(self) -> dict[str, Any]:
        return {"broken": ""}

    def tool_schemas(self) -> list[dict[str, Any]]:
        schemas = [t.json_schema() for t in self.spec.catalog.tools.values()]
        if self.knobs["broken"] == "description":
            for schema in schemas:
                if schema["function"]["name"] == "cancel_order":
                    schema["function"]["description"] = "Cancels an order; get_order it first."
        return schemas

    def _record(self, rng: random.Random) -> dict[str, Any]:
        total = self.spec.catalog.tools["get_order"].result["properties"]["total"]
        placed = START + timedelta(days=rng.randrange(5, 25))
        return {
            "order_id": f"#W{rng.randrange(10**6, 10**7)}",
            "status": "pending",
            "placed": placed.isoformat(),
            "ships": (placed + timedelta(days=rng.randrange(1, 5))).isoformat(),
            "total": round(rng.uniform(total["min"], total["max"]), 2),
            "items": [{"item_id": str(rng.randrange(10**9, 10**10)), "name": rng.choice(NAMES)}],
        }

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        broken = self.knobs["broken"]
        records = [self._record(rng) for _ in range(2)]
        target = records[0]
        if broken == "id_format":
            target["order_id"] = f"W-{rng.randrange(100)}"
        changes = {
            "date": {"placed": "9872-24-24"},
            "date_range": {"placed": "2031-05-02", "ships": "2031-05-04"},
            "date_order": {"placed": "2024-05-20", "ships": "2024-05-02"},
            "enum": {"status": "round_way"},
            "number": {"total": 99_999.5},
            "decimals": {"total": 123.456},
            "type": {"total": "123.45"},
            "invented_field": {"loyalty": "gold"},
        }
        target.update(changes.get(broken, {}))
        if broken == "missing_field":
            del target["ships"]
        if broken == "null":
            target["total"] = None
        if broken == "nested":
            target["items"][0]["item_id"] = "n/a"
        if broken == "crash":
            raise KeyError("boom")
        oid = target["order_id"]
        prompt = "You are a support agent for a shop. Be brief."
        prompt += {
            "prompt_order": " Always call get_order before cancel_order.",
            "prompt_then": " Look the order up with get order, then cancel it.",
            "prompt_rule": " Use cancel_order only when the status is pending.",
            "prompt_argument": f" The order to cancel is {oid}.",
        }.get(broken, "")
        return Task(
            seed=seed,
            instruction=f"Please cancel order {oid}.",
            state={"orders": {r["order_id"]: r for r in records}, "writes": []},
            goal={},
            oracle=[
                {"name": "get_order", "arguments": {"order_id": oid}},
                {"name": "cancel_order", "arguments": {"order_id": oid, "reason": REASONS[0]}},
                {"answer": f"Order {oid} is cancelled."},
            ],
            max_steps=6,
            system_prompt=prompt,
        )

    def call_tool(self, state: dict[str, Any], name: str, arguments: Any) -> Any:
        orders = state["orders"]
        oid = arguments.get("order_id")
        if oid not in orders:
            raise ToolError(f"order {oid!r} not found")
        broken = self.knobs["broken"]
        if broken == "tool_crash":
            raise RuntimeError("backend down")
        if name == "get_order":
            if broken == "read_other":
                return next(r for k, r in orders.items() if k != oid)
            return orders[oid]
        if name == "cancel_order":
            if broken != "write_noop":
                orders[oid] = {**orders[oid], "status": "cancelled"}
            state["writes"].append({"tool": name, "arguments": {"order_id": oid}})
            if broken == "write_shape":
                return "cancelled"
            reason = REASONS[1] if broken == "write_echo" else arguments.get("reason")
            return {**orders[oid], "status": "cancelled", "cancel_reason": reason}
        raise ToolError(f"unknown tool {name!r}", invalid=True)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return infer_catalog(order_traces())


def orders_env(catalog: Catalog, broken: str = "", **extra: Any) -> Orders:
    spec = EnvironmentSpec(
        env_id=f"orders-{broken or 'clean'}",
        family=Orders.family,
        entry_point=f"{Orders.__module__}:Orders",
        catalog=catalog,
        knobs={"broken": broken},
        extra=extra,
    )
    return Orders(spec)


# The facts the check needs ----------------------------------------------------------------------
def test_the_catalog_records_enums_dates_ranges_and_echoes(catalog):
    order = catalog.tools["get_order"]
    props = order.result["properties"]
    assert props["status"]["enum"] == ["pending", "processed"]
    assert props["placed"]["dates"]["kind"] == "date"
    assert START.isoformat() <= props["placed"]["dates"]["min"] < props["placed"]["dates"]["max"]
    assert props["placed"]["dates"]["max"] < (START + timedelta(days=30)).isoformat()
    assert order.result["date_order"] == [["placed", "ships"]]
    assert props["total"]["count"] == 40 and 10 <= props["total"]["min"] < props["total"]["max"]
    assert "enum" not in props["order_id"]  # ids are never enums
    assert order.echoes == {"order_id": "order_id"}
    cancel = catalog.tools["cancel_order"]
    assert cancel.echoes == {"order_id": "order_id", "reason": "cancel_reason"}
    assert order.arguments["order_id"].shape["formats"][0]["regex"] == r"^\#W\d{7}$"
    assert catalog.facts >= 1
    again = Catalog.from_dict(json.loads(json.dumps(catalog.to_dict())))
    assert again.to_dict() == catalog.to_dict()


def test_an_echo_under_another_name_and_mixed_types_are_recorded():
    traces = [
        [_call("get_booking", {"booking_id": f"BK-{n}"},
               {"id": f"BK-{n}", "seat": "3C", "gate": n if n % 2 else "tbd"})]
        for n in range(1000, 1006)
    ]  # fmt: skip
    tool = infer_catalog(traces).tools["get_booking"]
    assert tool.echoes == {"booking_id": "id"}
    assert tool.result["properties"]["gate"]["types"] == ["integer", "string"]


def test_a_catalog_saved_before_the_facts_still_loads_and_says_what_it_skips(catalog):
    old = catalog.to_dict()
    old.pop("facts")
    for tool in old["tools"].values():
        tool.pop("echoes")
        for arg in tool["arguments"].values():
            arg.pop("shape")
    loaded = Catalog.from_dict(old)
    assert loaded.facts == 0
    clean = check_fidelity(orders_env(loaded), n_seeds=20)
    assert clean.ok and clean.skipped and "enum values" in clean.skipped[0]
    assert "not checked" in clean.detail()
    # a date is still a date (the layout comes from the recorded examples), ids still echo
    assert not check_fidelity(orders_env(loaded, "date"), n_seeds=5).ok
    assert not check_fidelity(orders_env(loaded, "read_other"), n_seeds=5).ok
    # the enum part needs the facts: skipped, as the report says
    assert check_fidelity(orders_env(loaded, "enum"), n_seeds=5).ok


# The check --------------------------------------------------------------------------------------
def test_a_faithful_world_passes_on_200_seeds_quickly(catalog):
    env = orders_env(catalog)
    started = time.perf_counter()
    report = check_fidelity(env)
    assert time.perf_counter() - started < 5
    assert isinstance(report, FidelityReport)
    assert report.ok, report.detail()
    assert (report.seeds, report.clean, report.problems, report.issues) == (200, 200, 0, [])
    assert report.share_clean == 1.0 and report.to_dict()["ok"] is True


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_a_broken_world_fails_with_the_seed_the_place_and_the_problem(catalog, broken):
    where, problem = BREAKS[broken]
    report = check_fidelity(orders_env(catalog, broken), n_seeds=30)
    assert not report.ok and report.clean == 0 and report.share_clean == 0
    hits = [i for i in report.issues if i.where.startswith(where) and problem in i.problem]
    assert hits, [i.to_dict() for i in report.issues]
    assert hits[0].seed == 0
    assert problem in report.detail()
    assert report.to_dict()["issues"][0].keys() == {"seed", "where", "problem"}


def test_issues_are_kept_a_few_per_place_and_all_counted(catalog):
    report = check_fidelity(orders_env(catalog, "date"), n_seeds=50)
    assert report.problems >= 50 and len(report.issues) < report.problems
    at_placed = [i for i in report.issues if i.where == "get_order result.placed"]
    assert [i.seed for i in at_placed] == [0, 1, 2]


def test_the_prompt_check_names_leaks_and_only_leaks():
    tools = ["get_order", "cancel_order"]
    assert prompt_leaks("Use the tools to look records up and act on them.", tools) == []
    assert prompt_leaks("You can call get_order to see an order.", tools) == []
    assert prompt_leaks("First, greet the customer.", tools) == []  # no tool named
    leaks = prompt_leaks(
        "Be kind. Before you cancel_order, call get_order. Never cancel a processed order.",
        tools,
        decisive=["processed"],
    )
    assert len(leaks) == 1 and "names the order" in leaks[0] and "Before you" in leaks[0]
    assert prompt_leaks("Only cancel order when its status is pending.", tools, ["pending"])
    assert prompt_leaks("The refund is 12.50 dollars.", tools, arguments=["12.50"])
    # an oracle of one tool has no call order to give away
    assert prompt_leaks("Press the button the ticket asks for, then reply done.", ["press"]) == []
    assert prompt_leaks("After each press, check it with get_order.", ["press", "get_order"])


def test_the_agents_own_recorded_instructions_are_not_a_leak(catalog):
    recorded = "Rules: always call get_order before cancel_order."
    env = orders_env(catalog, "", conventions={"system_prompt": recorded})
    original = env.generate

    def generate(seed: int) -> Task:
        task = original(seed)
        task.system_prompt = recorded + " " + task.system_prompt
        return task

    env.generate = generate  # type: ignore[method-assign]
    assert check_fidelity(env, n_seeds=10).ok  # the agent ran with these very instructions
    invented = orders_env(catalog, "prompt_order", conventions={"system_prompt": recorded})
    assert not check_fidelity(invented, n_seeds=10).ok


def test_records_the_oracle_never_reads_are_checked_too():
    """A chain world's distractor records (never looked up by the oracle) are held to the
    lookup's recorded shape."""
    from tracegym.synthesis.families import FAMILIES, build_spec
    from tracegym.synthesis.fixtures import gap, shop_traces
    from tracegym.synthesis.world import NotSynthesizable

    shop = infer_catalog(shop_traces(40))
    try:
        spec = build_spec(gap("invalid_invocation", ["cancel_pending_order"]), shop)
    except NotSynthesizable as exc:
        pytest.skip(f"the family builds no environment on the shop fixture: {exc}")
    base = FAMILIES[spec.family]

    class Broken(base):  # type: ignore[misc, valid-type]
        def generate(self, seed: int) -> Task:
            task = super().generate(seed)
            targets = set(task.meta.get("targets") or [])
            for eid, record in task.state.entities.items():
                if eid not in targets:
                    record["status"] = "9872-24-24"
            return task

    env = Broken(spec, distractors=1)
    before = {
        (i.where, i.problem) for i in check_fidelity(base(spec, distractors=1), None, 10).issues
    }
    report = check_fidelity(env, n_seeds=10)
    new = [i for i in report.issues if (i.where, i.problem) not in before]
    assert new and all(i.where.startswith("get_order_details record[#W") for i in new)
    assert any("'9872-24-24' is not a value the traces showed" in i.problem for i in new)


# The gate and the commands ----------------------------------------------------------------------
def test_the_fidelity_check_gates_registration(catalog, tmp_path):
    from tracegym.synthesis.registry import list_envs, register

    report = check_environment(orders_env(catalog, "date"), 20, cheat_seeds=5)
    fidelity = next(c for c in report.checks if c.name == "fidelity")
    assert not fidelity.ok and fidelity.value == 0.0 and "9872-24-24" in fidelity.detail
    assert any(f.startswith("fidelity: ") for f in report.failures)
    with pytest.raises(ValueError, match=r"failed validity: .*fidelity"):
        register(tmp_path, orders_env(catalog, "date"), validity=report)
    assert list_envs(tmp_path) == []
    clean = check_environment(orders_env(catalog), 20, cheat_seeds=5)
    assert next(c for c in clean.checks if c.name == "fidelity").value == 1.0


RULE = {
    "detector": "forbidden_action", "kind": "precondition", "tool": "cancel_order",
    "statement": "cancel_order is never called on an order whose status is processed",
    "read_tool": "get_order", "path": "status", "values": ["processed"], "above": None,
    "below": None, "argument": None, "relation": None, "support": 17, "abstained": 4,
    "confidence": 0.94, "failed_runs": 6, "evidence_runs": ["t1", "t2", "t3"],
}  # fmt: skip


def test_envs_show_prints_the_rules_and_envs_check_the_fidelity(catalog, tmp_path):
    from tracegym.cli import app
    from tracegym.synthesis.registry import register
    from typer.testing import CliRunner

    passing = ValidityReport("x", ok=True, checks=[Check("fidelity", True, "given")])
    with_rule = orders_env(catalog, "", rules=[RULE])
    register(tmp_path, with_rule, validity=passing, n_train=3, n_heldout=3)
    register(tmp_path, orders_env(catalog, "enum"), validity=passing, n_train=3, n_heldout=3)
    runner = CliRunner()
    shown = runner.invoke(app, ["--home", str(tmp_path), "envs", "show", "orders-clean"])
    assert shown.exit_code == 0, shown.output
    assert "rules: 1 mined" in shown.stdout
    assert RULE["statement"] in shown.stdout
    assert "support 17, abstained 4, confidence 0.94, failed runs 6, evidence 3 run(s)" in (
        shown.stdout.replace("\n", " ")
    )
    bare = runner.invoke(app, ["--home", str(tmp_path), "envs", "show", "orders-enum"])
    assert bare.exit_code == 0 and "rules: none mined" in bare.stdout
    checked = runner.invoke(
        app, ["--home", str(tmp_path), "envs", "check", "orders-enum", "--seeds", "10"]
    )
    assert checked.exit_code == 1
    line = next(x for x in checked.stdout.splitlines() if "fidelity" in x)
    assert "FAIL" in line and "0/10 seeds faithful" in line


# Real runs --------------------------------------------------------------------------------------
def _family_names() -> list[str]:
    from tracegym.synthesis.families import FAMILIES

    return sorted(FAMILIES)


def shop_runs(n: int = 300) -> list[list[dict[str, Any]]]:
    """The demo's shop (`tracegym.examples.shop`) run by its oracle: the runs its agent makes
    when it gets every request right (and the refusals of writes on the wrong status)."""
    from tracegym.examples.shop import KINDS, Shop, make_task, oracle_actions

    traces = []
    for seed in range(n):
        task = make_task(seed)
        shop = Shop(task)
        calls = []
        actions = oracle_actions(task)
        if task.kind in ("cancel", "refund") and len(actions) == 2:  # refused: try anyway
            actions.append((f"{task.kind}_order", {"order_id": task.order_id or ""}))
        for name, arguments in actions:
            out = shop.call(name, arguments)
            failed = out.startswith("Error")
            calls.append(_call(name, arguments, None if failed else json.loads(out), failed))
        traces.append(calls)
    assert {make_task(s).kind for s in range(n)} == set(KINDS)
    return traces


@pytest.fixture(scope="module")
def real_catalogs(tmp_path_factory) -> dict[str, tuple[Catalog, str, str]]:
    """dataset -> (catalog, lookup, action)."""
    from tracegym.synthesis.spec import catalog_from_store
    from tracegym.tests.fixtures.seat_agent import write_seat_agent

    out = {"demo-shop": (infer_catalog(shop_runs()), "get_order", "cancel_order")}
    seats = tmp_path_factory.mktemp("seats")
    write_seat_agent(seats)  # issue 15's small agent of one's own
    out["seat-agent"] = (catalog_from_store(seats), "get_booking", "change_seat")
    if RETAIL.is_file():
        from tracegym.store.importers import import_path

        home = tmp_path_factory.mktemp("retail")
        import_path("tau-bench", RETAIL, home)
        out["tau-retail"] = (catalog_from_store(home), "get_order_details", "cancel_pending_order")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["tau-retail", "demo-shop", "seat-agent"])
@pytest.mark.parametrize("family", _family_names())
def test_every_family_is_faithful_on_real_runs(real_catalogs, dataset, family):
    from tracegym.synthesis.families import FAMILIES
    from tracegym.synthesis.fixtures import gap
    from tracegym.synthesis.world import NotSynthesizable

    if dataset not in real_catalogs:
        pytest.skip(f"{RETAIL} is absent")
    catalog, lookup, action = real_catalogs[dataset]
    cls = FAMILIES[family]
    detector = cls.detectors[0]
    tools = [lookup, action] if detector == "wrong_tool_order" else [action]
    data = gap(detector, tools)
    status = catalog.status_rules.get(action)
    if detector == "forbidden_action" and status:  # the precondition the runs show, as mined
        data["rules"] = [{
            "detector": detector, "kind": "precondition", "tool": action,
            "statement": f"{action} is never called on a record whose status is "
                         f"{' or '.join(status.refused)}",
            "read_tool": status.lookup, "path": status.field, "values": status.refused,
            "support": 10, "confidence": 1.0, "failed_runs": 3, "evidence_runs": ["t1"],
        }]  # fmt: skip
    lists = [
        f
        for f in catalog.flows
        if f.source == lookup
        and "[*]" in f.path
        and catalog.tools[f.target].arguments[f.argument].type == "array"
    ]
    if detector == "wrong_list" and lists:  # a list the runs copy from the lookup, as mined
        flow = lists[0]
        data = gap(detector, [flow.target])
        data["rules"] = [{
            "detector": detector, "kind": "list", "tool": flow.target, "statement": "x",
            "read_tool": lookup, "path": flow.path, "argument": flow.argument,
            "relation": "subset", "support": 10, "confidence": 1.0, "evidence_runs": ["t1"],
        }]  # fmt: skip
    try:
        spec = cls.build_spec(_as_gap(data), catalog)
    except NotSynthesizable as exc:
        pytest.skip(f"{family} builds no environment on {dataset}: {exc}")
    report = check_fidelity(cls(spec), n_seeds=200)
    assert report.ok, report.detail()


def _as_gap(data: dict[str, Any]) -> Any:
    from tracegym.analysis.gap import as_gap

    return as_gap(data)


def test_a_write_whose_effect_the_traces_never_show_is_logged_not_invented(tmp_path):
    """The support agent's refund_order changes nothing its lookups show: a world logs the call
    (the state the verifier compares) instead of inventing a changed field, and passes; the
    family whose check after the write needs a visible effect says why it builds nothing."""
    import tracegym as tg
    from opentelemetry.sdk.trace import TracerProvider
    from tracegym.analysis.pipeline import analyze
    from tracegym.benchmarks.planted_causes import ExactSignatures
    from tracegym.examples.support_agent import run_demo
    from tracegym.synthesis import registry
    from tracegym.synthesis.pipeline import synthesize
    from tracegym.tracer.operations import state

    saved = state.tracer, state.settings
    tg.init(home=tmp_path, provider=TracerProvider(), capture_messages=True)
    try:
        run_demo(n_tasks=40, seed=1)
    finally:
        tg.shutdown()
        state.tracer, state.settings = saved
    analyze(tmp_path, embedder=ExactSignatures())
    report = synthesize(tmp_path, n_train=10, n_heldout=10, validity_seeds=20)
    built = [e for e in report.environments if e.action == "refund_order"]
    assert built and all(e.validity["fidelity"].startswith("20/20") for e in built)
    env = registry.load(tmp_path, built[0].env_id)
    task = env.make_task(0)
    world = env.fork_state(task.state)
    for action in task.oracle:
        if action.get("name"):
            env.call_tool(world, action["name"], action.get("arguments") or {})
    assert world.entities == task.state.entities  # no field the traces never showed
    assert [w["tool"] for w in world.writes].count("refund_order") >= 1
    refused = [w for w in report.without_environment if w.detector == "premature_finish"]
    assert refused and "what refund_order does to the order is unknown" in refused[0].reason
