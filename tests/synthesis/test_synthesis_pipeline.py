"""Synthesis pipeline: gaps.json -> registered environments (files, index, exports, demos),
not-synthesizable gaps, bad gaps.json, the `synthesize` / `envs` commands, and the AgentRx
tau-retail runs end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from tracegym.synthesis import registry
from tracegym.synthesis.base import run_actions
from tracegym.synthesis.fixtures import gap, shop_traces
from tracegym.synthesis.pipeline import GapsFileError, load_gaps, synthesize
from tracegym.synthesis.policies import NoisyOraclePolicy
from tracegym.synthesis.spec import infer_catalog
from typer.testing import CliRunner

pytestmark = pytest.mark.timeout(180)

RETAIL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "agentrx-tau-retail"
ACTION = "cancel_pending_order"
RETURN = "return_delivered_order_items"


@pytest.fixture(scope="module")
def catalog():
    return infer_catalog(shop_traces(40))


def write_gaps(path: Path, gaps: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"version": 1, "gaps": gaps, "rejected": []}), encoding="utf-8")
    return path


GAPS = [
    gap("wrong_tool_order", ["get_order_details", ACTION]),
    gap("ungrounded_argument", [RETURN], argument_patterns=[f"{RETURN}(order_id=<id>)"]),
    gap("my_custom_detector", [ACTION]),  # no family for it
    {**gap("wrong_tool_order", ["send_reply"]), "id": "gap-cluster", "detector": None,
     "key": "cluster:7", "kind": "cluster"},  # no detector, no evidence
]  # fmt: skip


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory, catalog):
    home = tmp_path_factory.mktemp("synth")
    report = synthesize(home, write_gaps(home / "gaps.json", GAPS), catalog=catalog,
                        n_train=40, n_heldout=20, validity_seeds=40)  # fmt: skip
    return home, report


def test_synthesize_registers_environments(synthesized):
    home, report = synthesized
    assert [e.family for e in report.environments] == ["tool_order", "grounding"]
    assert report.rejected == []
    reasons = {n.gap_id: n.reason for n in report.not_synthesizable}
    assert "no family exercises detector 'my_custom_detector'" in reasons[GAPS[2]["id"]]
    assert "names no detector" in reasons["gap-cluster"]
    listed = registry.list_envs(home)
    assert [e.env_id for e in listed] == sorted(e.env_id for e in report.environments)
    for item in listed:
        folder = home / "envs" / item.env_id
        assert {p.name for p in folder.iterdir()} == {
            "spec.json", "tasks_train.jsonl", "tasks_heldout.jsonl", "demos_train.jsonl",
            "validity.json"}  # fmt: skip
        assert item.validity.ok and item.tasks == registry.TaskCounts(train=40, heldout=20)


def test_exported_tasks_and_demonstrations(synthesized):
    home, report = synthesized
    env_id = report.environments[1].env_id
    folder = home / "envs" / env_id
    train = [json.loads(line) for line in (folder / "tasks_train.jsonl").open()]
    heldout = [json.loads(line) for line in (folder / "tasks_heldout.jsonl").open()]
    assert len(train) == 40 and len(heldout) == 20
    first = train[0]
    assert set(first) >= {"seed", "system_prompt", "tools", "observation", "max_steps"}
    assert first["observation"]["role"] == "user"
    assert {t["function"]["name"] for t in first["tools"]} >= {"get_order_details", RETURN}
    assert not {t["seed"] for t in train} & {t["seed"] for t in heldout}
    assert not {t["fingerprint"] for t in train} & {t["fingerprint"] for t in heldout}
    demos = [json.loads(line) for line in (folder / "demos_train.jsonl").open()]
    assert [d["seed"] for d in demos] == [t["seed"] for t in train]
    assert all(d["passed"] and d["reward"] == 1.0 for d in demos)
    messages = demos[0]["messages"]
    assert messages[0] == {"role": "system", "content": first["system_prompt"]}
    assert messages[1] == {"role": "user", "content": first["observation"]["content"]}
    call = messages[2]["tool_calls"][0]
    assert messages[3]["tool_call_id"] == call["id"] and messages[3]["role"] == "tool"
    assert json.loads(call["function"]["arguments"]) == demos[0]["actions"][0]["arguments"]
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"]


def test_registered_environment_loads_and_runs(synthesized):
    home, report = synthesized
    env = registry.load(home, report.environments[0].env_id)
    seed = env.spec.heldout_seeds[0]
    _, verdict = run_actions(env, seed, env.oracle(seed))
    assert verdict.passed
    shown = registry.show(home, env.env_id)
    assert shown["spec"]["roles"]["action"] == ACTION and shown["validity"]["ok"]
    sample = registry.sample(home, env.env_id, seed=3)
    assert sample["task"]["seed"] == 3 and sample["oracle"]["passed"]
    with pytest.raises(registry.RegistryError, match="outside the train range"):
        registry.sample(home, env.env_id, seed=seed)
    with pytest.raises(registry.RegistryError, match="no environment 'nope'"):
        registry.load(home, "nope")


def test_calibration_against_a_policy(tmp_path, catalog):
    gaps = write_gaps(tmp_path / "gaps.json", [gap("premature_finish", [ACTION])])
    report = synthesize(tmp_path, gaps, lambda: NoisyOraclePolicy(p=0.04, seed=2),
                        catalog=catalog, n_train=10, n_heldout=10, validity_seeds=30,
                        calibration_seeds=20, k=2)  # fmt: skip
    (env,) = report.environments
    assert env.calibration.in_band and 0.2 <= env.calibration.pass_at_1 <= 0.6
    saved = json.loads((Path(env.path) / "calibration.json").read_text())
    assert saved["knobs"] == env.knobs == registry.load_spec(tmp_path, env.env_id).knobs
    assert env.knobs["targets"] > 1  # harder than the default


def test_patterns_only_when_the_store_has_no_calls(tmp_path):
    gaps = write_gaps(tmp_path / "gaps.json", [
        gap("wrong_tool_order", ["get_order", "refund_order"],
            argument_patterns=["refund_order(order_id=<id>)", "get_order(order_id=<id>)"]),
    ])  # fmt: skip
    report = synthesize(tmp_path, gaps, n_train=5, n_heldout=5, validity_seeds=20)
    assert report.catalog_source == "the gaps' argument patterns"
    # patterns hold no result: a world would invent every field of the records it looks up
    assert report.environments == [], report
    (why,) = report.not_synthesizable
    assert "no recorded result of get_order shows the order's record" in why.reason


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist: run `tracegym analyze` first"),
        ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at "
                      "line 1 column 2"),
        ("[]", "expected a JSON object with a 'gaps' list"),
        ('{"version": 2, "gaps": []}', "gaps.json version 2 is not supported"),
        ('{"version": 1, "gaps": {}}', "'gaps' must be a list, got dict"),
        ('{"version": 1, "gaps": [3]}', "gaps[0] must be an object, got int"),
        ('{"version": 1, "gaps": [{"key": "x"}]}', "gaps[0] has no 'id' string"),
        ('{"version": 1, "gaps": [{"id": "g"}]}', "gaps[0] (g) has neither 'key' nor 'detector'"),
        ('{"version": 1, "gaps": [{"id": "g", "key": "k", "tools": "a"}]}',
         "gaps[0] (g): 'tools' must be a list"),
    ],
)  # fmt: skip
def test_bad_gaps_file(tmp_path, content, message):
    path = tmp_path / "gaps.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(GapsFileError) as info:
        load_gaps(path)
    assert message in str(info.value) and str(path) in str(info.value)
    with pytest.raises(GapsFileError):
        synthesize(tmp_path)


def test_empty_gaps_file_is_fine(tmp_path):
    report = synthesize(tmp_path, write_gaps(tmp_path / "gaps.json", []))
    assert report.environments == [] == report.not_synthesizable


# The commands -----------------------------------------------------------------------------------
def _app() -> typer.Typer:
    """The real `tracegym` command, which registers these commands with the others."""
    from tracegym.cli import app

    return app


def test_envs_commands(synthesized):
    home, report = synthesized
    app, runner = _app(), CliRunner()
    env_id = report.environments[0].env_id
    result = runner.invoke(app, ["--home", str(home), "envs", "list", "--json"])
    assert result.exit_code == 0, result.output
    assert [e["env_id"] for e in json.loads(result.stdout)] == sorted(
        e.env_id for e in report.environments)  # fmt: skip
    result = runner.invoke(app, ["--home", str(home), "envs", "list"])
    assert result.exit_code == 0 and env_id in result.stdout
    result = runner.invoke(app, ["--home", str(home), "envs", "show", env_id])
    assert result.exit_code == 0 and "lookup" in result.stdout and "oracle passed" in result.stdout
    result = runner.invoke(app, ["--home", str(home), "envs", "sample", env_id, "--seed", "2"])
    assert (
        result.exit_code == 0
        and "oracle episode" in result.stdout
        and "reward 1.0" in result.stdout
    )
    result = runner.invoke(app, ["--home", str(home), "envs", "sample", env_id, "--json"])
    assert json.loads(result.stdout)["task"]["seed"] == 0
    result = runner.invoke(app, ["--home", str(home), "envs", "check", env_id, "--seeds", "20"])
    assert result.exit_code == 0 and "valid" in result.stdout, result.output
    result = runner.invoke(app, ["--home", str(home), "envs", "show", "nope"])
    assert result.exit_code == 2 and "no environment 'nope'" in result.output


def test_synthesize_command(tmp_path, catalog):
    app, runner = _app(), CliRunner()
    result = runner.invoke(app, ["--home", str(tmp_path), "synthesize"])
    assert result.exit_code == 2 and "gaps.json does not exist" in result.output
    (tmp_path / "gaps.json").write_text("{oops", encoding="utf-8")
    result = runner.invoke(app, ["--home", str(tmp_path), "synthesize"])
    assert result.exit_code == 2 and "is not valid JSON" in result.output
    result = runner.invoke(app, ["--home", str(tmp_path), "synthesize", "--policy", "nope"])
    assert result.exit_code == 2 and "--policy 'nope'" in result.output
    refund = gap(
        "wrong_tool_order",
        ["get_order", "refund_order"],
        argument_patterns=["refund_order(order_id=<id>)", "get_order(order_id=<id>)"],
    )
    gaps = write_gaps(tmp_path / "gaps.json", [refund])
    result = runner.invoke(
        app,
        [
            "--home",
            str(tmp_path),
            "synthesize",
            "--gaps",
            str(gaps),
            "--train",
            "5",
            "--heldout",
            "5",
            "--seeds",
            "20",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)  # patterns alone: the gap's reason, no environment
    assert out["environments"] == [] and len(out["not_synthesizable"]) == 1


def test_check_fails_on_a_broken_registered_environment(synthesized, tmp_path):
    import shutil

    home, report = synthesized
    copy = tmp_path / "home"
    shutil.copytree(home, copy)
    env_id = report.environments[0].env_id
    spec_path = copy / "envs" / env_id / "spec.json"
    spec = json.loads(spec_path.read_text())
    spec["entry_point"] = "tests_broken_module:Nothing"
    spec_path.write_text(json.dumps(spec))
    result = CliRunner().invoke(_app(), ["--home", str(copy), "envs", "check", "--seeds", "10"])
    assert result.exit_code == 1 and "INVALID" in result.stdout


# Real data --------------------------------------------------------------------------------------
@pytest.mark.skipif(not RETAIL.is_dir(), reason="../shared/data/agentrx-tau-retail is absent")
def test_agentrx_retail_end_to_end(tmp_path):
    from tracegym.store.importers import import_path

    import_path("tau-bench", RETAIL / "tau_dataset_full.json", tmp_path)
    gaps = write_gaps(tmp_path / "gaps.json", [
        gap("wrong_tool_order", ["get_order_details", "exchange_delivered_order_items"]),
        gap("invalid_invocation", ["modify_pending_order_items"]),
        gap("premature_finish", ["transfer_to_human_agents"]),
    ])  # fmt: skip
    report = synthesize(tmp_path, gaps, n_train=10, n_heldout=10, validity_seeds=30)
    assert report.catalog_source.startswith("store (100 traces)")
    assert [e.action for e in report.environments] == [
        "exchange_delivered_order_items",
        "modify_pending_order_items",
        "return_delivered_order_items",  # transfer_to_human_agents names no record
    ]
    assert (
        "no write tool of the gap fits"
        in registry.load_spec(tmp_path, report.environments[2].env_id).extra["action_choice"]
    )
    env = registry.load(tmp_path, report.environments[0].env_id)
    assert env.roles.lookup == "get_order_details" and env.roles.owner == "get_user_details"
    assert env.roles.status["allowed"] == ["delivered"]  # mined from the runs
    task = env.make_task(0)
    assert "Please exchange delivered order items for order #W" in task.instruction
