"""The tau-bench importer: outcomes from a base success, and hints when a file is another format."""

from __future__ import annotations

import json
from pathlib import Path

from tracegym.store.importers import tau
from tracegym.tracer import semconv as sc


def _run(reward: float, components: dict | None) -> dict:
    reward_info = {"reward": reward, **({"components": components} if components else {})}
    return {
        "task_id": 1,
        "trial": 0,
        "reward": reward,
        "info": {"task": {"instruction": "cancel my order"}, "reward_info": reward_info},
        "traj": [{"role": "user", "content": "cancel my order"}],
    }


def _outcome(tmp_path: Path, run: dict) -> dict:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([run]))
    records = tau.convert(path, path.read_bytes())
    (outcome,) = [r for r in records if r["name"] == sc.OUTCOME_SPAN_NAME]
    return outcome["attributes"]


def test_base_success_decides_when_the_reward_is_a_composite(tmp_path: Path) -> None:
    # grok-3's results: 0.93 = base success 1.0 - an efficiency penalty + a resilience bonus
    passed = _outcome(tmp_path, _run(0.93, {"base_success": 1.0, "efficiency_penalty": -0.17}))
    assert passed[sc.OUTCOME_SUCCESS] is True
    assert passed[sc.OUTCOME_REWARD] == 0.93  # the reward is kept as the source wrote it
    failed = _outcome(tmp_path, _run(0.1, {"base_success": 0.0, "resilience_bonus": 0.1}))
    assert failed[sc.OUTCOME_SUCCESS] is False


def test_without_a_base_success_a_full_reward_is_success(tmp_path: Path) -> None:
    assert _outcome(tmp_path, _run(1.0, None))[sc.OUTCOME_SUCCESS] is True
    assert _outcome(tmp_path, _run(0.93, None))[sc.OUTCOME_SUCCESS] is False


def test_a_medagentbench_file_imported_as_tau_bench_says_what_it_looks_like(tmp_path: Path):
    import pytest
    from tracegym.store.importers import ImportFormatError

    path = tmp_path / "overall.json"
    path.write_text(json.dumps({"custom": {"raw_results": []}}))
    with pytest.raises(ImportFormatError, match="looks like medagentbench input"):
        tau.convert(path, path.read_bytes())
