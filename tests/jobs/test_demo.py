"""The main job end to end, reduced: the shop, the LM agent, and `tracegym demo` on a tiny model.

The full demo (SmolLM2, minutes per stage) is `benchmarks/demo_end_to_end.py`. Here the tiny
random model cannot solve anything on its own, so the dev runs get a competence the pipeline
can contrast: `think` is replaced by a scripted model that answers like the oracle except that it
refunds before looking the order up. Everything after the dev runs (compaction, analysis,
synthesis, training the tiny model's adapters, evaluation, the held-out runs, the report) is real.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("duckdb")

from tracegym.cli import app
from tracegym.examples.domains import SHOP
from tracegym.examples.shop import (
    KINDS,
    RULES,
    TOOL_SCHEMAS,
    Shop,
    demonstration,
    make_task,
    oracle_actions,
    oracle_answer,
    verify,
)
from tracegym.jobs import demo as demo_module
from tracegym.jobs.demo import DemoConfig, normalise_mix, parse_mix, run
from tracegym.synthesis import registry
from tracegym.testing import capture
from tracegym.training import adapters
from tracegym.training.capabilities import env_ids_of
from typer.testing import CliRunner

from tests.serving.fakes import completion

# Trains or runs real models: out of the quick loop (`pytest -m "not slow"`).
slow = pytest.mark.slow


# The shop ----------------------------------------------------------------------------------------
def test_tasks_are_seeded_and_every_kind_occurs():
    assert make_task(5) == make_task(5)
    assert make_task(5) != make_task(6)
    assert {make_task(s).kind for s in range(40)} == set(KINDS)
    skewed = [make_task(s, KINDS, [1, 0, 0, 0]).kind for s in range(20)]
    assert set(skewed) == {"status"}


@pytest.mark.parametrize("seed", range(40))
def test_the_oracle_passes_and_shortcuts_fail(seed):
    task = make_task(seed)
    shop = Shop(task)
    for name, arguments in oracle_actions(task):
        assert not shop.call(name, arguments).startswith("Error")
    assert verify(task, shop, oracle_answer(task)).passed
    lazy = Shop(task)  # answers without doing anything
    verdict = verify(task, lazy, "done")
    assert not verdict.passed and verdict.reasons


def test_tools_enforce_the_rules_and_never_raise():
    task = next(make_task(s) for s in range(100) if make_task(s).kind == "refund")
    shop = Shop(task)
    assert "find_user first" in shop.call("get_order", {"order_id": task.order_id})
    shop.call("find_user", {"email": task.email})
    assert "get_order first" in shop.call("refund_order", {"order_id": task.order_id})
    assert shop.call("nope", {}).startswith("Error: unknown tool")
    assert shop.call("get_order", "not json").startswith("Error")
    assert shop.call("get_order", {"wrong": "x"}).startswith("Error: bad arguments")
    assert shop.db == task.database()  # nothing changed


def test_a_demonstration_replays_the_oracle():
    task = make_task(11)
    messages = demonstration(task)
    calls = [m["tool_calls"][0]["function"]["name"] for m in messages if m.get("tool_calls")]
    assert calls == [name for name, _ in oracle_actions(task)]
    assert messages[-1]["content"] == oracle_answer(task)


# The pipeline ------------------------------------------------------------------------------------
class ScriptedBackend:
    """`tracegym serve`'s backend for the dev runs: oracle replies, except a refund skips
    get_order and an address change never calls update_address (two capability gaps to
    discover). The task is found by the request its conversation opens with."""

    def __init__(self, tasks) -> None:
        self.by_request = {task.request: task for task in tasks}

    async def complete(self, body):
        from tracegym.serving.backends import Reply

        messages = body["messages"]
        user = next(m["content"] for m in messages if m["role"] == "user")
        task = next(t for r, t in self.by_request.items() if user.startswith(r))
        calls = oracle_actions(task)
        if task.kind == "refund":
            calls = [calls[0], ("refund_order", {"order_id": task.order_id})]
        if task.kind == "address":
            calls = calls[:1]
        done = sum(m["role"] == "tool" for m in messages)
        if done == len(calls):
            return Reply(data=completion(body["model"], oracle_answer(task)))
        name, arguments = calls[done]
        call = {"id": f"call_{done}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
        return Reply(data=completion(body["model"], None, [call]))

    async def aclose(self) -> None:
        return None


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory):
    """One reduced demo for the module. Tracing goes through a private provider (the demo calls
    `tg.init`), restored afterwards like conftest's `tracer_setup` does."""
    import tracegym
    from opentelemetry.sdk.trace import TracerProvider
    from tracegym.tracer import setup

    home = tmp_path_factory.mktemp("demo")
    config = DemoConfig.quick(
        model="tiny", embedder="hash", dev_tasks=32, heldout_tasks=8, base_demos=8, base_steps=4,
        adapter_steps=6, adapter_train_seeds=6, eval_seeds=4, batch_size=4, max_new_tokens=16,
    )  # fmt: skip
    stages: list[str] = []
    provider = TracerProvider()
    patch = pytest.MonkeyPatch()
    init = tracegym.init
    patch.setattr(tracegym, "init", lambda **kw: init(provider=provider, **kw))
    original = demo_module.local_backend
    scripted = ScriptedBackend(dev_tasks(config))
    patch.setattr(demo_module, "local_backend", lambda *a, **k: scripted)

    # the dev runs are scripted; the model itself runs from the nightly on
    def stage(name):
        stages.append(name)
        if name == "nightly":
            patch.setattr(demo_module, "local_backend", original)

    try:
        report = run(home, config, stage=stage)
        yield home, config, report, stages
    finally:
        patch.undo()
        tracegym.uninstrument("openai")  # the demo's agent instrumented the openai client
        tracegym.shutdown()
        provider.shutdown()
        setup._installed.processor = None
        setup._installed.provider = None
        setup._installed.batches = []


@slow
def test_every_stage_ran_and_left_valid_artifacts(demo_home):
    home, config, report, stages = demo_home
    assert stages == ["prepare", "dev", "nightly", "heldout"]
    assert set(report["minutes"]) == set(stages)
    # the base model was prepared and cached
    assert (home / report["model"] / "tracegym_model.json").exists()
    # dev runs: traced into the store, with the scripted competence
    dev = report["dev"]
    assert dev["success"]["n"] == 32
    assert dev["by_kind"]["refund"]["rate"] == 0.0
    assert dev["by_kind"]["status"]["rate"] == 1.0
    # rehearsal data: the agent's own passing dev conversations, as the model saw them
    replay = [json.loads(line) for line in (home / "demo" / "stages" / "replay.jsonl").open()]
    assert len(replay) == dev["success"]["passed"]
    chats = [c["messages"] for c in replay]
    assert all(c[0]["role"] == "system" and c[1]["role"] == "user" for c in chats)
    assert all(c[-1]["role"] == "assistant" for c in chats)
    assert all(c["tools"] == [dict(t) for t in SHOP.tool_schemas] for c in replay)
    # analysis found the refund-before-lookup gap without being told
    names = [g["name"] for g in report["gaps"]]
    assert any("refund_order" in n for n in names), names
    gap = next(g for g in report["gaps"] if "refund_order" in g["name"])
    assert gap["coverage"] > 0 and gap["delta"] > 0
    assert gap["example"]["trace_id"]
    # and the address change it never makes: a tool never called, found from the requests
    assert "unserved_request_update_address" in names, names
    families = {e["family"] for e in report["environments"]}
    assert "requested_action" in families, report["environments"]
    # synthesis: environments that pass their checks
    envs = registry.list_envs(home)
    assert envs and report["environments"]
    for item in envs:
        env = registry.load(home, item.env_id)
        assert env.env_id == item.env_id
        # they follow the agent's conventions: its prompt, its tools, find the customer first
        task = env.make_task(env.spec.train_seeds[0])
        assert task.system_prompt.startswith(RULES)
        if env.family == "requested_action":
            assert "Hi, my email is" in task.instruction  # the users' own wording
        assert task.oracle[0]["name"] == "find_user" and task.goal.opening == ["find_user"]
        assert {s["function"]["name"]: s for s in env.tool_schemas()}["find_user"] in TOOL_SCHEMAS
    # training + evaluation: an adapter per capability (the environments of one action train
    # one), each with an evaluation row, stopped early only when its decision was clear
    metas = adapters.all_metadata(home)
    learnt = [env_id for m in metas for env_id in env_ids_of(m)]
    assert sorted(learnt) == sorted(e.env_id for e in envs)
    for meta in metas:
        row = meta.metrics.eval
        run = row.sequential.run
        assert row.base.n == row.adapter.n == run <= config.eval_seeds
        assert run == config.eval_seeds or row.sequential.stopped is not None
        assert isinstance(meta.promoted, bool) and meta.promotion
    # held-out: base and routed on the same tasks, with intervals
    heldout = report["heldout"]
    for side in ("base", "routed"):
        assert heldout[side]["n"] == 8
        low, high = heldout[side]["ci95"]
        assert 0 <= low <= heldout[side]["rate"] <= high <= 1
    assert set(heldout["routing"]["routes"]) == {f"shop:{s}" for s in range(1_000_000, 1_000_008)}
    # the agent's memory: a note per dev customer, written and read back as memory spans
    notes = json.loads((home / "demo" / "stages" / "notes.json").read_text())
    assert len(notes) == len({t.email for t in dev_tasks(config)})
    assert all(note.startswith("asked: Hi, my email is") for note in notes.values())


def dev_tasks(config):
    from tracegym.jobs.demo import _tasks

    return _tasks(SHOP, SHOP.dev_seeds, config.dev_tasks, config.seed)


def test_notes_are_read_back_when_a_customer_returns(tmp_path):
    from tracegym.examples.lm_agent import CustomerNotes

    with capture() as spans:
        notes = CustomerNotes(tmp_path / "notes.json")
        notes.write("ana1@mail.com", "asked: cancel O1 | did: cancel_order")
        assert notes.read("ana1@mail.com") is None  # reads see the notes as opened
        notes.save()
        again = CustomerNotes(tmp_path / "notes.json")
        assert again.read("ana1@mail.com") == "asked: cancel O1 | did: cancel_order"
    assert len(spans.by_operation("update_memory")) == 1
    assert len(spans.by_operation("search_memory")) == 2


@slow
def test_the_report_is_written_and_the_runs_are_queryable(demo_home):
    from tracegym.store.store import Store

    home, _, report, _ = demo_home
    text = (home / "demo" / "report.md").read_text()
    assert "Held-out success" in text and "## Gaps found" in text
    assert report["note"] and "learns nothing" in text  # the tiny model shows no gain
    assert json.loads((home / "demo" / "report.json").read_text())["heldout"] == report["heldout"]
    with Store(home) as store:
        rows = store.sql(
            "SELECT json_extract_string(outcome_labels, '$.split') AS split, count(*) FROM traces "
            "WHERE agent = ? GROUP BY 1 ORDER BY 1",
            [SHOP.agent_name],
        ).fetchall()
        tools = {r[0] for r in store.sql("SELECT DISTINCT tool FROM tool_calls").fetchall()}
    # the routed agent ran only the tasks the router sent to an adapter; the rest are the base's
    routed = 8 - report["heldout"]["routing"]["on_base"]
    expected = {"dev": 32, "heldout-base": 8, **({"heldout-routed": routed} if routed else {})}
    assert dict(rows) == expected
    assert f"routed {routed} of 8 held-out conversations to an adapter" in text
    assert {"find_user", "get_order"} <= tools


@slow
def test_a_second_run_reuses_the_model_and_the_dev_runs(demo_home, monkeypatch):
    home, config, report, _ = demo_home
    # (tg.init is still the fixture's, on its private provider)

    def no_training(*args, **kwargs):
        raise AssertionError("the base model should be cached")

    monkeypatch.setattr("tracegym.training.sft.train_adapter", no_training)
    again = run(home, config)
    assert again["model"] == report["model"]
    assert again["dev"] == report["dev"]


# The base fine-tune's mix -------------------------------------------------------------------------
def test_a_mix_is_parsed_normalised_and_completed():
    assert parse_mix("status=0.1,cancel=0.4,refund=0.1,address=0.4") == {
        "status": 0.1, "cancel": 0.4, "refund": 0.1, "address": 0.4,
    }  # fmt: skip
    # weights need not sum to 1; kinds not named get 0; spaces are fine
    assert parse_mix(" cancel = 3 , refund=1") == {
        "status": 0.0, "cancel": 0.75, "refund": 0.25, "address": 0.0,
    }  # fmt: skip
    assert DemoConfig().mix == normalise_mix(SHOP.base_mix)
    assert DemoConfig(mix={"address": 2}).mix["address"] == 1.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("status=0.5,billing=0.5", "unknown request kind 'billing'"),
        ("status=-0.1,cancel=1", "must be a finite number >= 0"),
        ("status=nan", "must be a finite number >= 0"),
        ("status=inf", "must be a finite number >= 0"),
        ("status=0,cancel=0", "at least one weight above 0"),
        ("status=lots", "not a number"),
        ("status", "expected KIND=WEIGHT"),
        ("", "expected KIND=WEIGHT"),
        ("status=0.5,,cancel=0.5", "expected KIND=WEIGHT"),
        ("status=0.5,status=0.5", "given twice"),
    ],
)
def test_a_bad_mix_is_refused_with_a_clear_error(text, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        parse_mix(text)
    # the command line says the same in one line, exit code 2, before anything runs
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "demo", "--mix", text])
    assert result.exit_code == 2, result.output
    assert "--mix" in result.output and message.split("'")[0] in result.output
    assert not (tmp_path / "h").exists()


def test_the_mix_is_part_of_the_model_cache_key(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    keys = {
        text: demo_module.base_settings(tmp_path, DemoConfig(mix=parse_mix(text)))[2]
        for text in ("status=0.4,cancel=0.4,refund=0.1,address=0.1", "status=4,cancel=4,refund=1,"
                     "address=1", "status=0.1,cancel=0.4,refund=0.1,address=0.4")
    }  # fmt: skip
    default = demo_module.base_settings(tmp_path, DemoConfig())[2]
    values = list(keys.values())
    assert values[0] == values[1] == default  # the same mix, however written: the same model
    assert values[2] != default


@slow
def test_the_mix_reaches_the_base_fine_tunes_task_draw(tmp_path, monkeypatch):
    """prepare_model draws its demonstrations with the mix (and nothing else is told)."""
    drawn: list[str] = []

    class Stop(Exception):
        pass

    def no_training(policy, conversations, *args, **kwargs):
        assert len(conversations) == len(drawn)
        requests = [c.messages[1]["content"] for c in conversations]
        assert requests == [t.request for t in demo_module.base_demos(config)]
        raise Stop

    monkeypatch.setattr("tracegym.training.sft.train_adapter", no_training)
    counts = {}
    for text in ("cancel=1", "status=0.1,cancel=0.4,refund=0.1,address=0.4"):
        config = DemoConfig(model="tiny", base_demos=200, mix=parse_mix(text))
        drawn[:] = [t.kind for t in demo_module.base_demos(config)]
        with pytest.raises(Stop):
            demo_module.prepare_model(tmp_path, config)
        counts[text] = {k: drawn.count(k) for k in KINDS}
    assert counts["cancel=1"] == {"status": 0, "cancel": 200, "refund": 0, "address": 0}
    uneven = counts["status=0.1,cancel=0.4,refund=0.1,address=0.4"]
    assert sum(uneven.values()) == 200
    # 80 expected of cancel and of address, 20 of status and of refund
    assert min(uneven["cancel"], uneven["address"]) > 2 * max(uneven["status"], uneven["refund"])


def test_the_tiny_model_gets_the_tiny_size_and_says_it_learns_nothing():
    config = DemoConfig.for_model("tiny-3", quick=True, dev_tasks=5)
    assert config.model == "tiny-3" and config.tiny_model and config.dev_tasks == 5
    assert config.base_steps < DemoConfig.quick().base_steps and config.embedder == "hash"
    assert not DemoConfig.for_model("smollm2").tiny_model
    assert DemoConfig.for_model("smollm2", quick=True) == DemoConfig.quick()
    report = {
        "note": demo_module.TINY_NOTE, "config": config.to_dict(), "gaps": [],
        "environments": [], "adapters": [], "minutes": {}, "nightly": {"dir": "x"},
        "dev": {"success": {"n": 5}},
        "heldout": {
            "base": {"n": 0}, "routed": {"n": 0}, "gain": 0.0, "p_value": 1.0,
            "intervals_disjoint": False,
            "by_kind": {side: {k: {"n": 0} for k in KINDS} for side in ("base", "routed")},
        },
    }  # fmt: skip
    text = demo_module.render_markdown(report)
    assert "learns nothing" in text and "not a gain" in text
    assert "nothing to train an adapter on" in text


def test_torch_threads_are_set_for_the_block_and_restored():
    import torch

    before = torch.get_num_threads()
    with demo_module.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with demo_module.torch_threads(None):
        assert torch.get_num_threads() == before


def _runs(passes):
    return [{"task_id": f"t{i}", "passed": p} for i, p in enumerate(passes)]


def test_the_paired_test_counts_fixed_and_broken_tasks():
    base = _runs([False, False, False, True, True, False])
    routed = _runs([True, True, True, False, True, False])
    paired = demo_module.paired_test(base, routed)
    assert paired == {"tasks": 6, "fixed": 3, "broken": 1, "p_value": round(5 / 16, 6)}
    # all six discordant tasks going the routed agent's way: 1 chance in 64
    assert demo_module.paired_test(_runs([False] * 6), _runs([True] * 6))["p_value"] == round(
        1 / 64, 6
    )
    assert demo_module.paired_test(_runs([True]), _runs([True]))["p_value"] == 1.0


@pytest.mark.parametrize(
    ("fixed", "gain", "disjoint", "verdict"),
    [
        (6, 0.25, True, "Strong evidence of a gain"),
        (6, 0.25, False, "significant at this size, but its size is uncertain"),
        (3, 0.12, False, "Weak evidence: not significant"),
        (0, 0.0, False, "No gain shown"),
    ],
)
def test_the_report_says_how_strong_the_evidence_is(fixed, gain, disjoint, verdict):
    base = _runs([False] * 24)
    routed = _runs([True] * fixed + [False] * (24 - fixed))
    paired = demo_module.paired_test(base, routed)
    heldout = {"base": {"n": 24}, "routed": {"n": 24}, "gain": gain, "p_value": 0.01,
               "intervals_disjoint": disjoint, "paired": paired}  # fmt: skip
    line = demo_module.evidence_line(heldout)
    assert verdict in line and "n = 24" in line and f"{fixed} fixed" in line
    assert ("do not overlap" in line) == disjoint
