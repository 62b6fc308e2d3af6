"""benchmarks/gaps_real.py's evaluation helpers on the shared data: grok-3's outcome comes from
base_success, tau2's missed actions come from action_checks, and ties rank the same way in every
process."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from tracegym.benchmarks import gaps_real

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
GROK = DATA / "tau-bench-grok3-retail" / "grok-3-retail.json"
TAU2 = DATA / gaps_real.TAU2 / gaps_real.TAU2_FILES["retail"][0]


@pytest.mark.skipif(not GROK.is_file(), reason="shared data absent")
def test_grok_copy_takes_the_outcome_from_base_success(tmp_path: Path):
    copy = json.loads(gaps_real._grok_copy(GROK, tmp_path).read_text())
    original = json.loads(GROK.read_text())
    assert not any(r["reward"] == 1.0 for r in original)  # why the copy is needed
    base = [r["info"]["reward_info"]["components"]["base_success"] for r in original]
    assert [r["reward"] for r in copy] == base and 0 < sum(base) < len(base)
    assert [r["traj"] for r in copy] == [r["traj"] for r in original]


@pytest.mark.skipif(not TAU2.is_file(), reason="shared data absent")
def test_tau2_missed_actions_are_the_failed_action_checks():
    missed = gaps_real.tau2_missed([TAU2])
    sims = json.loads(TAU2.read_text())["simulations"]
    assert set(missed) == {str(s["id"]) for s in sims}
    for sim in sims:
        checks = (sim.get("reward_info") or {}).get("action_checks") or []
        wrong = [c for c in checks if not c["action_match"]]
        assert len(missed[str(sim["id"])]) == len(wrong)
    failed = [s for s in sims if s["reward_info"]["reward"] != 1.0]
    assert sum(bool(missed[str(s["id"])]) for s in failed) >= len(failed) // 2


def test_ranked_breaks_ties_by_name():
    counts = Counter({"b": 2, "a": 2, "c": 5})
    assert gaps_real.ranked(counts) == [("c", 5), ("a", 2), ("b", 2)]


def test_real_sets_name_every_set_and_skip_medagentbench(tmp_path: Path):
    found, skipped = gaps_real.real_sets(tmp_path)  # an empty data folder
    assert found == [] and any("MedAgentBench" in line for line in skipped)
    if DATA.is_dir():
        found, _ = gaps_real.real_sets(DATA.resolve())
        names = [s.name for s in found]
        assert any("pooled" in n and "retail" in n for n in names)
        assert all(s.evaluation == "tau2" for s in found if s.fmt == "tau2-bench")


def test_lift_missing_is_the_members_share_missing_an_action_over_all_failed(tmp_path: Path):
    # four failed simulations: two miss an expected action (a and b), two miss none
    checks = {"a": [False], "b": [False, True], "c": [True], "d": []}
    sims = [{"id": k, "reward_info": {"reward": 0.0, "action_checks": [
        {"action": {"name": "refund"}, "action_match": ok} for ok in v]}}
        for k, v in checks.items()]  # fmt: skip
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"simulations": sims}))

    def run(sim: str) -> SimpleNamespace:
        root = SimpleNamespace(attributes={"tracegym.source.simulation_id": sim})
        return SimpleNamespace(trace_id=f"t-{sim}", root=root)

    result = SimpleNamespace(failed=[run(k) for k in checks], succeeded=[])
    s = gaps_real.RealSet("x", "tau2-bench", (path,), "tau2")
    rows = [gaps_real.GapRow(1, "g", "d", 0.5, 0.5, 2, 0, ["refund"], ""),
            gaps_real.GapRow(2, "h", "d", 0.5, 0.5, 2, 0, [], "")]  # fmt: skip
    gaps = [SimpleNamespace(failed_members=frozenset({"t-a", "t-b"})),
            SimpleNamespace(failed_members=frozenset({"t-a", "t-c"}))]  # fmt: skip
    summary = gaps_real.evaluate_tau2(result, s, rows, gaps)
    assert summary["failed_missing_an_action"] == 2
    assert rows[0].evaluation["lift_missing"] == 2.0  # 2/2 of its members, 2/4 of all failed
    assert rows[1].evaluation["lift_missing"] == 1.0  # 1/2 against 2/4
