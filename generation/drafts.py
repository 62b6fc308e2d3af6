"""Draft tokens from the conversation itself (prompt lookup), for greedy decoding.

An agent's replies copy a great deal from their own context: the tool-call syntax of the previous
turns, ids and e-mails from the request and from tool results. When the last tokens of a lane's
conversation occurred earlier in it, the tokens that followed them then are a good guess of what
comes next. A decoding step feeds those guesses after the lane's next token, and the model's own
greedy choices at each position decide how many of them hold (`batching.Wave`): the reply is the
reply plain greedy decoding gives (up to float rounding), in fewer forward passes.
"""

from __future__ import annotations

# draft tokens per lane and step, at most; a step's draft width is also bounded by the wave's
# token budget (`draft_length`), since on a CPU a forward pass costs about its token count once
# a batch's rows are many
MAX_DRAFT = 8
LONGEST_MATCH = 3  # the longest n-gram looked up (then shorter ones)
DRAFT_BUDGET = 64  # tokens a drafting step may feed, all rows together (`draft_length`)


class NgramIndex:
    """The latest position of every 1..`LONGEST_MATCH`-gram of one growing token sequence."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> the index just after it
        self._indexed = 0  # n-grams ending before this index are in `_last`

    def _catch_up(self, seq: list[int]) -> None:
        # the n-grams ending at the sequence's last token stay out: they are what is looked up
        for end in range(max(self._indexed, 1), len(seq)):
            for n in range(1, min(LONGEST_MATCH, end) + 1):
                self._last[tuple(seq[end - n : end])] = end
        self._indexed = len(seq)

    def propose(self, seq: list[int], length: int) -> list[int]:
        """Up to `length` tokens that followed the latest earlier occurrence of the longest
        suffix of `seq` (3, 2 or 1 tokens) found in it; [] when none is."""
        if length <= 0 or len(seq) < 2:
            return []
        self._catch_up(seq)
        for n in range(min(LONGEST_MATCH, len(seq) - 1), 0, -1):
            end = self._last.get(tuple(seq[-n:]))
            if end is not None:
                return seq[end : end + length]
        return []


def draft_length(rows: int, budget: int) -> int:
    """Draft tokens per row when `rows` rows decode together and a forward pass may feed about
    `budget` tokens: many rows get none, a few get up to `MAX_DRAFT`."""
    if budget <= 0 or rows <= 0:
        return 0
    return max(0, min(MAX_DRAFT, budget // rows - 1))


__all__ = ["DRAFT_BUDGET", "LONGEST_MATCH", "MAX_DRAFT", "NgramIndex", "draft_length"]
