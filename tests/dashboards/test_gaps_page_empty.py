"""The gaps page after an analysis that kept no gap: it says what ran (when, on how many runs),
that nothing was kept and what to do next (an LLM judge among it), and neither it nor the map
asks to run `tracegym analyze` again; before any analysis it still does."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.asgi import asgi_get

pytest.importorskip("starlette")
pytest.importorskip("duckdb")


def _get(asgi: Any, path: str) -> tuple[int, str]:
    """One GET, its body as the words a reader sees (tags dropped, <code> and all)."""
    status, body = asgi_get(asgi, path)
    text = re.sub(r"<[^>]+>", "", body)
    return status, html.unescape(re.sub(r"\s+", " ", text))


def _page(home: Path) -> str:
    from tracegym.dashboards.app import create_app

    status, body = _get(create_app(home), "/gaps")
    assert status == 200, body[:500]
    return body


EMPTY = {
    "version": 1,
    "generated_at": "2026-12-06T03:10:00Z",
    "runs": {"total": 7, "failed": 1, "succeeded": 5, "unknown": 1},
    "contrast": "failed vs successful runs",
    "thresholds": {"min_coverage": 0.3, "min_delta": 0.2, "min_stability": 7, "resamples": 10},
    "gaps": [],
    "rejected": [{"key": "invalid_invocation:get_order", "kind": "finding", "coverage": 1.0,
                  "delta": 0.8, "stability": 3, "why": "stable in 3/10 < 7"}],
}  # fmt: skip


def test_an_analysis_that_kept_no_gap_says_what_ran(tmp_path: Path):
    (tmp_path / "gaps.json").write_text(json.dumps(EMPTY))
    page = _page(tmp_path)
    assert (
        "Analysis ran at 2026-12-06T03:10:00Z on 7 runs (1 failed, 5 succeeded, 1 without an "
        "outcome) and kept no gap." in page
    )
    assert "1 candidate missed the thresholds" in page and "Candidates not kept (1)" in page
    assert "--judge-url" in page  # the next step the detectors cannot take
    assert "The analysis of 2026-12-06T03:10:00Z kept no gap" in page  # the chart
    assert "embedded no failure signature" in page  # the map: no cache, but analysis ran
    assert "run tracegym analyze" not in page and "No gaps yet" not in page
    assert "no embedding cache yet" not in page


def test_the_stored_explanation_is_shown_when_there_is_one(tmp_path: Path):
    """A gaps.json that carries `analyze --json`'s nothing_kept shows its own next steps."""
    why = {"failed": 1, "succeeded": 5, "unknown": 1, "failed_without_findings": 1,
           "nearest": [],
           "next_steps": ["more runs: 1 failed and 5 successful so far"]}  # fmt: skip
    (tmp_path / "gaps.json").write_text(json.dumps({**EMPTY, "nothing_kept": why}))
    page = _page(tmp_path)
    assert "1 of 1 failed run has no finding from any detector." in page
    assert "more runs: 1 failed and 5 successful so far" in page


def test_before_any_analysis_the_page_asks_for_one(tmp_path: Path):
    page = _page(tmp_path)
    assert "kept no gap" not in page
    assert "run tracegym analyze" in page
