"""The no-LLM loop on both bundled domains (benchmarks/domain_synthesis.py): analysis finds the
weaknesses planted in a scripted agent's traced runs, and synthesis builds the clinic's state rule
into an environment, by the same code path as the shop's."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from tracegym.analysis.pipeline import analyze
from tracegym.benchmarks import domain_synthesis as bench
from tracegym.benchmarks.planted_causes import ExactSignatures
from tracegym.examples.domains import DOMAINS


@pytest.mark.parametrize(("name", "runs"), [("shop", 48), ("clinic", 96)])
def test_analysis_finds_the_planted_weaknesses(tmp_path: Path, name: str, runs: int):
    weaknesses = bench.WEAKNESSES[name]()
    traced = bench.trace_domain(tmp_path, DOMAINS[name], weaknesses, runs, 0.6)
    assert len(traced) == runs
    assert all(r.passed for r in traced if r.weakness is None)  # the oracle elsewhere
    for w in weaknesses:
        assert sum(r.weakness == w.name and not r.passed for r in traced) >= 5
    analysis = analyze(tmp_path, embedder=ExactSignatures(), write=False)
    gaps = bench.gap_rows(analysis.gaps)
    found = {w.name: bench.which_gap(traced, w, gaps) for w in weaknesses}
    assert all(found.values()), found
    detectors = {g.name: g.detector for g in gaps}
    for w in weaknesses:
        assert any(found[w.name] == f"{g} ({d})" and d in w.detectors
                   for g, d in detectors.items())  # fmt: skip


def test_the_clinic_state_rule_becomes_an_environment(tmp_path: Path):
    options = argparse.Namespace(runs=96, rate=0.6, exact=True, validity_seeds=50)
    result = bench.run_domain("clinic", options, tmp_path)
    built = {e.family for e in result.environments if e.valid}
    assert "policy_action" in built
    rule = next(g for g in result.gaps if g.detector == "forbidden_action").rules
    assert rule and "attended" in rule[0] and "missed" in rule[0]
