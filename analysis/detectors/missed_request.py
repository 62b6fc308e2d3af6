"""Missed requests: the user's words after which successful runs always act, and this run did not.

`unserved_request` matches a request against the words of a tool's *name*; when the users' words
and the tool's name differ ("send me the receipt" and `send_confirmation`), only the runs can tell.
`fit` mines, over the successful runs that made some *other* write (they carried a request out; was
this part of it?), *request words* (words of 4+ letters of the user's first message,
`unserved.request_text`) after which a write T is called: at least `min_support` (5) such runs
whose request holds the word, at least `min_confidence` (0.9) of them calling T without an error,
and at most `max_other_share` (0.1) of those whose request lacks the word calling it (the word asks
for that action, not for the kind of task). `detect` flags a run whose request holds such a word,
that made another write and never called T without an error: key ``missed_request:<tool>``,
decisive step the run's final action (where it stopped without acting), confidence 0.5. Nothing
about any domain is hard-coded.

A write successful runs only ever make alone (`standalone_writes`: a hand-off to a person ends
the run, so no receipt follows it) carries no request out: in `fit`, a successful run whose only
write is one is not among the runs that acted otherwise (counted among them, successful
hand-offs asked for a receipt broke the receipt's rule: 6 of 8 instead of 8 of 8). A failed run
that handed off instead of what its request asked for is still flagged: it left that undone.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tracegym.analysis.detector_names import MISSED_REQUEST
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.state import is_write
from tracegym.analysis.detectors.unserved import request_text
from tracegym.analysis.features import final_action_step, step_ref
from tracegym.analysis.runs import Run

_WORD = re.compile(r"[a-z]{4,}")


@dataclass(frozen=True)
class AskedAction:
    """Successful runs whose request holds `word` call `tool`."""

    tool: str
    word: str
    runs: int  # successful runs whose request holds the word
    share: float  # of them calling the tool
    other_share: float  # of the successful runs whose request lacks the word


def request_words(run: Run) -> frozenset[str]:
    """The request's words of 4+ letters, lower case."""
    return frozenset(_WORD.findall(request_text(run).lower()))


def done(run: Run) -> frozenset[str]:
    """The write tools a run called without an error."""
    return frozenset(s.tool or s.name for s in run.steps if is_write(s) and not s.failed)


def standalone_writes(done_sets: Sequence[frozenset[str]]) -> frozenset[str]:
    """The writes made in some of these runs and never beside another write."""
    made = frozenset().union(*done_sets)
    return made - frozenset().union(*(ts for ts in done_sets if len(ts) > 1))


def mine_asked(
    runs: Sequence[Run],
    *,
    min_support: int = 5,
    min_confidence: float = 0.9,
    max_other_share: float = 0.1,
) -> list[AskedAction]:
    """Request words after which successful runs call a write (see the module docstring)."""
    successes = [(request_words(r), done(r)) for r in runs if r.success is True]
    alone = standalone_writes([ts for _, ts in successes])
    tools = sorted({t for _, ts in successes for t in ts})
    rules = []
    for tool in tools:
        # the runs that acted otherwise: the request was carried out, so was this part of it?
        acting = [(words, tool in ts) for words, ts in successes if ts - {tool} - alone]
        with_word: dict[str, int] = defaultdict(int)
        called: dict[str, int] = defaultdict(int)
        for words, did in acting:
            for word in words:
                with_word[word] += 1
                called[word] += did
        total = sum(did for _, did in acting)
        for word, runs_with in sorted(with_word.items()):
            n, without = called[word], len(acting) - runs_with
            if runs_with < min_support or n / runs_with < min_confidence or not without:
                continue
            other_share = (total - n) / without
            if other_share <= max_other_share:
                rules.append(AskedAction(tool, word, runs_with, n / runs_with, other_share))
    rules.sort(key=lambda r: (-r.runs, r.tool, r.word))
    return rules


class MissedRequest(Detector):
    """Requests for an action, learnt from successful runs, left undone (module docstring).

    Parameters: `min_support` (5), `min_confidence` (0.9), `max_other_share` (0.1).
    """

    name = MISSED_REQUEST
    description = (
        "Leaves undone what the user asked for in words after which successful runs always "
        "act (a receipt, a refund ...), whatever the tool is called"
    )

    def __init__(
        self, min_support: int = 5, min_confidence: float = 0.9, max_other_share: float = 0.1
    ) -> None:
        self.min_support = min_support
        self.min_confidence = min_confidence
        self.max_other_share = max_other_share
        self.rules_: list[AskedAction] = []

    def fit(self, runs: Sequence[Run]) -> MissedRequest:
        self.rules_ = mine_asked(
            runs,
            min_support=self.min_support,
            min_confidence=self.min_confidence,
            max_other_share=self.max_other_share,
        )
        return self

    def detect(self, run: Run) -> list[Finding]:
        if not self.rules_:
            return []
        words, tools = request_words(run), done(run)
        final = final_action_step(run) or (run.steps[-1] if run.steps else None)
        if final is None:
            return []
        findings: dict[str, Finding] = {}
        for rule in self.rules_:
            if rule.tool in tools or rule.tool in findings or rule.word not in words:
                continue
            if not tools - {rule.tool}:
                continue  # it did nothing: not this detector's case (unserved, premature ...)
            findings[rule.tool] = Finding(
                detector=self.name, key=f"{self.name}:{rule.tool}", trace_id=run.trace_id,
                **step_ref(final), span_ids=(final.span_id,), confidence=0.5,
                message=(f"the request says {rule.word!r} and {rule.tool} was never called; "
                         f"{rule.share:.0%} of the {rule.runs} successful runs asked so call it, "
                         f"{rule.other_share:.0%} of the others"),
                details={"tool": rule.tool, "word": rule.word, "runs": rule.runs,
                         "share": round(rule.share, 3), "other_share": round(rule.other_share, 3)},
            )  # fmt: skip
        return list(findings.values())
