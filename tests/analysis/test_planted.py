"""The planted-causes generator (tests/fixtures/planted.py): deterministic per seed, a different
domain per seed, its ground truth true of the traces it writes, and a store analysis reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tracegym.analysis.runs import load_runs
from tracegym.store.store import Store
from tracegym.tests.fixtures import planted as pl
from tracegym.tracer.messages import chat_messages


def _signature(p: pl.PlantedSet) -> list[tuple]:
    return [(r.run_id, r.kind, r.cause, r.success, r.tools) for r in p.runs]


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[pl.PlantedSet, Path]]:
    """Seeds that together plant every cause of the catalogue (checked below)."""
    out = {}
    for seed in (0, 1, 3, 7, 8):
        home = tmp_path_factory.mktemp(f"planted{seed}")
        out[seed] = (pl.generate(home, seed), home)
    return out


def test_deterministic_per_seed(tmp_path: Path, sets):
    first, _ = sets[3]
    again = pl.generate(tmp_path / "again", 3)
    assert _signature(again) == _signature(first)
    assert again.domain == first.domain
    # a different seed is a different agent
    other, _ = sets[7]
    assert _signature(other) != _signature(first)


def test_domains_vary_across_seeds():
    assert {pl.plan(seed)[0].after_error for seed in range(3)} == set(pl.AFTER_ERROR)
    domains = [pl.plan(seed)[0] for seed in range(12)]
    assert len({d.name for d in domains}) >= 4
    assert len({d.read_tool for d in domains}) >= 6
    assert len({(d.cancel_tool, d.update_tool, d.status_field, d.amount_field)
                for d in domains}) >= 10  # fmt: skip
    assert len({tuple(pl.plan(seed)[1]) for seed in range(12)}) >= 6  # different causes too


def test_every_cause_is_planted_in_failed_runs_with_a_decisive_span(sets):
    planted = set()
    for p, home in sets.values():
        runs = {r.trace_id: r for r in load_runs(Store(home))}
        assert len(runs) == len(p.runs) and 60 <= len(runs) <= 130
        assert sum(r.success is True for r in runs.values()) == len(p.succeeded)
        assert 2 <= len(p.causes) <= 3 and len(p.noise) >= 5
        for cause, ids in p.causes.items():
            planted.add(cause)
            assert len(ids) >= 8
            for trace in ids:
                run = runs[trace]
                assert run.success is False
                spans = {s.span_id for s in run.steps}
                truth = next(r for r in p.runs if r.trace_id == trace)
                assert truth.decisive_span_id in spans
                assert truth.acted_span_id is None or truth.acted_span_id in spans
        # only task_id and task_kind reach the store: never the cause
        assert all(set(r.labels) == {"task_id", "task_kind"} for r in runs.values())
    assert planted == set(pl.CAUSES)


def _truth(p: pl.PlantedSet, cause: str) -> list[pl.PlantedRun]:
    return [r for r in p.runs if r.cause == cause]


def _acted(run, truth: pl.PlantedRun):
    """The tool call a planted step carried out, checking that the decisive chat span before
    it is the one that asked for it."""
    steps = run.by_span()
    chat, acted = steps[truth.decisive_span_id], steps[truth.acted_span_id]
    assert chat.operation == "chat" and chat.position < acted.position
    calls = chat_messages(chat.output, "assistant")[0]["tool_calls"]
    assert calls[0]["function"]["name"] == acted.tool
    return acted


def test_planted_runs_do_what_their_cause_says(sets):
    for p, home in sets.values():
        d = p.domain
        runs = {r.trace_id: r for r in load_runs(Store(home))}
        ok = [runs[r.trace_id] for r in p.runs if r.success]
        for r in _truth(p, pl.WRONG_ORDER):
            seq = runs[r.trace_id].tool_sequence()
            write = d.cancel_tool if d.order_tool_kind == pl.CANCEL else d.update_tool
            assert write in seq and d.read_tool not in seq[: seq.index(write)]
            failed = [s for s in runs[r.trace_id].tool_calls() if s.tool == write]
            assert failed[-1].failed
            assert _acted(runs[r.trace_id], r).tool == write
        # successful runs always read a record before writing it
        for run in ok:
            seq = run.tool_sequence()
            for write in (d.cancel_tool, d.refund_tool, d.update_tool):
                if write in seq:
                    assert d.read_tool in seq[: seq.index(write)]
        for r in _truth(p, pl.UNGROUNDED_ID):
            run = runs[r.trace_id]
            step = _acted(run, r)
            value = str(step.arguments[d.id_arg])
            earlier = [s for s in run.steps if s.position < step.position and s.operation
                       in ("execute_tool", "invoke_agent")]  # fmt: skip
            assert step.tool == d.read_tool and step.failed
            assert all(value not in (s.output or "") + (s.input or "") for s in earlier)
        for r in _truth(p, pl.POLICY_FORBIDDEN):
            step = _acted(runs[r.trace_id], r)
            assert step.tool in (d.cancel_tool, d.update_tool) and not step.failed
            record = next(s for s in runs[r.trace_id].tool_calls()
                          if s.tool == d.read_tool and not s.failed)  # fmt: skip
            fields = json.loads(record.output)
            if step.tool == d.cancel_tool:
                assert fields[d.status_field] in d.blocked
            else:
                assert fields[d.flag_field] is True
        for r in _truth(p, pl.POISONED_MEMORY):
            step = runs[r.trace_id].by_span()[r.decisive_span_id]
            assert step.operation == "search_memory" and str(d.wrong_window) in step.output
            assert step.source_write_span_ids  # the store links it to the writing run
        # update values: the user's spelling differs from the agent's only by case/separators
        typed = differs = 0
        for r in p.runs:
            run = runs[r.trace_id]
            for call in (c for c in run.tool_calls() if c.tool == d.update_tool and c.arguments):
                value = call.arguments[d.update_field]
                request = run.root.input or ""
                loose = re.sub(r"[\s\-_]+", " ", request.lower())
                assert re.sub(r"[\s\-_]+", " ", value.lower()) in loose
                typed += 1
                differs += value not in request
        assert 0 < differs < typed
        # after the failed call: the seed's reaction (the cause's symptom)
        for r in _truth(p, pl.WRONG_ORDER) + _truth(p, pl.UNGROUNDED_ID):
            run = runs[r.trace_id]
            acted = run.by_span()[r.acted_span_id]
            same = [s for s in run.tool_calls() if (s.tool, s.input) == (acted.tool, acted.input)]
            if d.after_error == "retry":
                assert len(same) >= 3 and all(s.failed for s in same)
            else:
                assert 1 <= len(same) <= 2  # a transient time-out adds one
            last = chat_messages([s for s in run.steps if s.operation == "chat"][-1].output)
            assert ("sorry" in last[0]["content"].lower()) == (d.after_error != "claim_done")
        for r in _truth(p, pl.NEVER_CALLED):
            assert d.notify_tool not in runs[r.trace_id].tool_sequence()
            assert runs[r.trace_id].by_span()[r.decisive_span_id].operation == "chat"


def test_analyze_reads_the_store(sets, tmp_path: Path):
    from tracegym.analysis.pipeline import analyze
    from tracegym.benchmarks.planted_causes import ExactSignatures, score_seed

    p, home = sets[0]
    result = analyze(home, embedder=ExactSignatures(), write=False)
    assert len(result.runs) == len(p.runs) and len(result.failed) == len(p.failed)
    score = score_seed(p, result, "tuning")
    assert {c.cause for c in score.causes} == set(p.causes)
    assert all(0.0 <= c.jaccard <= 1.0 and c.all_failed < 1.0 for c in score.causes)


def test_benchmark_reports_both_splits(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from tracegym.benchmarks import planted_causes

    out = tmp_path / "scores.json"
    args = ["--tuning", "0", "--reporting", "100", "--no-clusters", "--json", str(out)]
    assert planted_causes.main(args) == 0
    printed = capsys.readouterr().out
    assert "Tuning seeds 0" in printed and "Reporting seeds 100 (untuned)" in printed
    scores = json.loads(out.read_text())
    for split, seed in (("tuning", 0), ("reporting", 100)):
        (one,) = scores["seeds"][split]
        assert one["seed"] == seed and one["causes"]
        assert scores["summaries"][split]["causes"] == len(pl.plan(seed)[1])
