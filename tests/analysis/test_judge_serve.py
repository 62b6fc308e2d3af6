"""The judge against a real OpenAI-compatible server: `tracegym serve`'s app on a tiny random
ChatML model. Its answers are not the judge's schema (a random model writes no JSON), so this
checks the other half: the server takes the judge's requests (seed, temperature, the delimited
data block), counts their tokens, and an off-schema answer leaves the detectors' gaps as they
are."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("duckdb")

from tracegym.analysis.judge import JUDGE, JudgeConfig, Judged, OpenAICompatibleJudge, judge_hook
from tracegym.tests.fixtures.hash_embedder import HashEmbedder

pytestmark = pytest.mark.slow  # builds and runs a (tiny) model


def test_a_served_model_off_the_schema_leaves_the_detectors_gaps(tmp_path: Path):
    from tracegym.analysis.pipeline import analyze
    from tracegym.generation.chat_format import CHATML, ChatFormat
    from tracegym.generation.tiny_families import tiny_family_policy
    from tracegym.serving import ConversationRouter, create_app
    from tracegym.serving.local import LocalBackend
    from tracegym.serving.server import running
    from tracegym.tests.fixtures.seat_agent import write_seat_agent

    write_seat_agent(tmp_path, failed=13)
    without = analyze(tmp_path, embedder=HashEmbedder(tmp_path / "cache"), write=False)
    policy = tiny_family_policy(CHATML, 0)
    backend = LocalBackend(policy.model, ChatFormat(policy.tokenizer))
    with running(create_app(backend, ConversationRouter(None, [], "tiny-chatml-0"))) as url:
        report = Judged()
        judge = OpenAICompatibleJudge(f"{url}/v1", "tiny-chatml-0", timeout_s=120)
        result = analyze(tmp_path, embedder=HashEmbedder(tmp_path / "cache"), write=False,
                         extra_candidates=judge_hook(judge, report, JudgeConfig()))  # fmt: skip
    assert report.plan is not None and report.plan.calls == 1 + 3 * 39
    assert report.error is not None and report.error.startswith("propose: ")
    assert report.tokens_spent > 0  # the server answered, and counted what it read
    assert [g.key for g in result.gaps] == [g.key for g in without.gaps]
    assert not any(g.detector == JUDGE for g in result.gaps)
