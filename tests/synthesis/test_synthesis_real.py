"""benchmarks/synthesis_real.py on the shared AgentRx tau-retail runs: every kept gap and every
forced gap of the rule-mining detectors ends with an environment or a stated reason (nothing
raised escapes), a model policy calibrates on each environment built, and the summary's counts
add up."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracegym.benchmarks import synthesis_real as sr
from tracegym.benchmarks.gaps_real import real_sets

ROOT = Path(__file__).resolve().parents[2]
DATA = next(
    (p for p in (Path("/work/shared/data"), ROOT / ".." / "shared" / "data") if p.is_dir()), None
)

pytestmark = [
    pytest.mark.slow,  # imports the set, analyses it with the sentence embedder: 10-20 s
    pytest.mark.skipif(DATA is None, reason="shared data absent (/work/shared/data)"),
]


@pytest.fixture(scope="module")
def agentrx(tmp_path_factory: pytest.TempPathFactory) -> sr.SetResult:
    from tracegym.analysis.embeddings import Embedder

    assert DATA is not None
    found = [s for s in real_sets(DATA.resolve())[0] if s.evaluation == "agentrx"]
    if not found:
        pytest.skip("AgentRx tau-retail is not in the shared data")
    work = tmp_path_factory.mktemp("synthesis-real")
    options = sr.Options(validity_seeds=20, fidelity_seeds=20, calibration_seeds=10, policy_seeds=1)
    policy = sr.load_model_policy("tiny", work)  # a random tiny Llama: the model path, not skill
    return sr.run_set(found[0], work, Embedder(work / "cache"), options, policy)


def test_every_gap_gets_an_environment_or_a_reason(agentrx: sr.SetResult):
    assert agentrx.runs and agentrx.failed and agentrx.succeeded
    detectors = {o.detector for o in agentrx.outcomes if o.section == sr.FORCED}
    # each rule-mining detector either forced a gap or says why it could not
    assert detectors | set(agentrx.no_forced) == set(sr.FORCED_DETECTORS)
    assert not detectors & set(agentrx.no_forced)
    assert all(why for why in agentrx.no_forced.values())
    for o in agentrx.outcomes:
        if o.built:
            assert o.family and o.valid is not None and o.task is not None
            assert o.task.instruction and o.noisy_oracle is not None
            assert 0.0 <= o.noisy_oracle.pass_at_1 <= 1.0
            assert o.passed or o.reason_label()
            # the model policy was calibrated on the environment like the noisy oracle
            assert not o.policy_error and o.policy is not None and o.policy.history
            assert 0.0 <= o.policy.pass_at_1 <= 1.0
        else:
            assert o.reason.strip() and o.reason_label()


def test_summary_counts_add_up(agentrx: sr.SetResult):
    summaries = [sr.summarize(agentrx, section) for section in (sr.KEPT, sr.FORCED)]
    assert sum(s.gaps for s in summaries) == len(agentrx.outcomes)
    for s in summaries:
        assert s.gaps >= s.built >= s.valid >= s.passed
        assert s.fidelity_checked >= s.fidelity_ok
        assert s.built >= s.in_band
        assert sum(s.reasons.values()) == s.gaps - s.passed
    text = sr.render_summary(summaries)
    assert text.count("| AgentRx tau-retail |") == 2
    rendered = sr.render_set(agentrx)
    for o in agentrx.outcomes:
        assert o.gap in rendered
