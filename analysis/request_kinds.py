"""Kinds of request learnt from the requests themselves, so gaps compare like with like.

A run's first write tool (`Run.request_kind`) says what the run *did*, not what it was *asked*:
a run that only reads (a question answered from the records) has none, and a run that failed
by not acting has a different one than the successes of its own request. The request text is
what every run of one kind shares: benchmarks and users fill a few templates with different
values ("What is the status of my shipment #SH43087?"). So:

1. the request (`unserved.request_text`: the first user message, else the root span's input);
2. boilerplate every run repeats (a system prompt pasted into the user turn, a tool list) is
   cut: the longest prefix and suffix all requests share, then words in more than `max_df` of
   them;
3. run-specific values are masked (e-mail addresses, quoted text, ids and numbers:
   `signatures.mask`), and words seen in fewer than `min_df` requests (names, item names) drop
   out of the vocabulary;
4. TF-IDF (words and word pairs, sublinear counts) and agglomerative clustering (average
   linkage, cosine distance, a distance threshold, no cluster count) of the distinct masked
   requests, each weighted by how many runs sent it (`analysis.linkage`: the same kinds as
   clustering every run, in memory bounded by the templates, not the runs): deterministic and
   fast (no sentence embedder).

No domain word is written down. A run without request text has no kind (None), and neither
does any run when there are fewer than two requests.

A run the kinds were not fitted on (a streamed analysis fits detectors on a sample) gets the
kind of its masked request when a fitted run sent the same one, else the kind whose mean TF-IDF
row is nearest within `distance`, else none (`kind_of`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics.pairwise import cosine_distances
from tracegym.analysis.linkage import average_linkage_labels
from tracegym.analysis.run_facts import RunFacts, request_of
from tracegym.analysis.runs import Run
from tracegym.analysis.signatures import mask

_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_QUOTED = re.compile(r"\"[^\"\n]{1,80}\"|“[^”\n]{1,80}”")
_WORD = re.compile(r"(?u)\b[^\W\d_]\w+\b")  # a word: a letter, then letters or digits
_PLACEHOLDER = {"<id>": " xid ", "<n>": " xnum "}


def normalise(text: str) -> str:
    """The request with run-specific values masked, lower case."""
    text = _QUOTED.sub(" xquoted ", _EMAIL.sub(" xemail ", text))
    text = mask(text)
    for placeholder, word in _PLACEHOLDER.items():
        text = text.replace(placeholder, word)
    return text.lower()


def strip_common(texts: Sequence[str]) -> list[str]:
    """The texts less the longest prefix and suffix all of them share (cut at whitespace)."""
    head, tail = common_ends(texts)
    return [_cut(t, head, tail) for t in texts]


def common_ends(texts: Sequence[str]) -> tuple[str, str]:
    """The prefix and suffix `strip_common` cuts from these texts ("" for none)."""
    nonempty = [t for t in texts if t]
    if len(nonempty) < 2:
        return "", ""
    prefix = _common_prefix(nonempty)
    suffix = _common_prefix([t[::-1] for t in nonempty])[::-1]
    cut_head = prefix.rfind(" ") + 1 if " " in prefix else 0
    cut_tail = len(suffix) - suffix.find(" ") if " " in suffix else 0
    return prefix[:cut_head], suffix[len(suffix) - cut_tail :] if cut_tail else ""


def _cut(text: str, head: str, tail: str) -> str:
    """The text less `head` and `tail` where it has both and something is left between."""
    if not text.startswith(head) or not text.endswith(tail):
        return text
    end = len(text) - len(tail)
    return text[len(head) : end] if end > len(head) else text


def _common_prefix(texts: Sequence[str]) -> str:
    """The longest prefix of every text (that of the smallest and the largest one)."""
    low, high = min(texts), max(texts)
    n = next((i for i, (a, b) in enumerate(zip(low, high, strict=False)) if a != b), len(low))
    return low[:n]


def _heaviest(words: list[str], weight: np.ndarray, n: int) -> list[str]:
    """The `n` words of most weight (at 9 decimals), at equal weight the longer (more telling)
    word or pair first, then by the word; of positive weight. Sorts only the words of the kind
    (a few), not the whole vocabulary once per kind."""
    rounded = np.round(weight, 9)
    ranked = sorted(np.flatnonzero(rounded > 0).tolist(),
                    key=lambda j: (-rounded[j], -len(words[j]), words[j]))[:n]  # fmt: skip
    if len(ranked) < n:  # then words rounded to 0 come next, tiny positive weights among them
        rest = sorted(
            np.flatnonzero(rounded <= 0).tolist(), key=lambda j: (-len(words[j]), words[j])
        )
        ranked += [j for j in rest[: n - len(ranked)] if weight[j] > 0]
    return [words[j] for j in ranked]


@dataclass
class RequestKinds:
    """Cluster runs by their request text; `fit(runs)`, then `kind_of(run)`.

    `distance` is the cosine distance (average linkage) under which requests are one kind;
    `min_df` the number of requests a word must occur in to count; `max_df` the share of
    requests above which a word is boilerplate."""

    distance: float = 0.6
    min_df: int = 2
    max_df: float = 0.95
    kinds_: dict[str, str] = field(default_factory=dict)  # trace id -> kind
    names_: dict[str, str] = field(default_factory=dict)  # kind -> its most telling words
    # For runs not fitted on: the cut boilerplate, each masked request's kind, the vocabulary
    # and each kind's mean row.
    _ends: tuple[str, str] = ("", "")
    _doc_kinds: dict[str, str | None] = field(default_factory=dict, repr=False)
    _vectorizer: TfidfVectorizer | None = field(default=None, repr=False)
    _centroids: np.ndarray | None = field(default=None, repr=False)

    def fit(self, runs: Sequence[Run | RunFacts]) -> RequestKinds:
        self.kinds_, self.names_, self._doc_kinds = {}, {}, {}
        self._vectorizer = self._centroids = None
        texts = [request_of(r).strip() for r in runs]
        have = [i for i, t in enumerate(texts) if t]
        if len(have) < 2:
            return self
        self._ends = common_ends([texts[i] for i in have])
        docs = [normalise(_cut(texts[i], *self._ends)) for i in have]
        worded = [j for j, d in enumerate(docs) if _WORD.search(d)]  # "{}" asks nothing
        have, docs = [have[j] for j in worded], [docs[j] for j in worded]
        if len(have) < 2:
            return self
        vectorizer = TfidfVectorizer(
            ngram_range=(1, 2),
            sublinear_tf=True,
            min_df=min(self.min_df, len(docs)),
            max_df=self.max_df,
            token_pattern=_WORD.pattern,
        )
        try:
            matrix = vectorizer.fit_transform(docs)
        except ValueError:  # no word survives: every request is the same template
            labels = np.zeros(len(docs), dtype=int)
            words: list[str] = []
        else:
            labels = _cluster(matrix, docs, self.distance)
            words = list(vectorizer.get_feature_names_out())
        order: dict[int, int] = {}
        for i, doc, label in zip(have, docs, labels, strict=True):
            kind = f"k{order.setdefault(int(label), len(order))}"
            self.kinds_[runs[i].trace_id] = kind
            self._doc_kinds[doc] = kind
        centroids = []
        for label, k in order.items():
            rows = matrix[labels == label] if words else None
            top = []
            if rows is not None and rows.shape[0]:
                weight = np.asarray(rows.mean(axis=0)).ravel()
                centroids.append(weight)
                top = _heaviest(words, weight, 3)
            self.names_[f"k{k}"] = f"k{k} ({' / '.join(top)})" if top else f"k{k}"
        if words and len(centroids) == len(order):
            self._vectorizer, self._centroids = vectorizer, np.stack(centroids)
        return self

    def kind_of(self, run: Run | RunFacts) -> str | None:
        """The run's kind: a fitted run's own; for another run, the kind of the same masked
        request, else of the nearest kind within `distance` (`_nearest`); None for a run
        without request text, or when nothing was fitted."""
        fitted = self.kinds_.get(run.trace_id)
        if fitted is not None or not self.kinds_:
            return fitted
        text = request_of(run).strip()
        if not text:
            return None
        doc = normalise(_cut(text, *self._ends))
        if doc not in self._doc_kinds:  # requests are templates: few distinct docs
            self._doc_kinds[doc] = self._nearest(doc) if _WORD.search(doc) else None
        return self._doc_kinds[doc]

    def _nearest(self, doc: str) -> str | None:
        if self._vectorizer is None or self._centroids is None:
            return None
        row = self._vectorizer.transform([doc])
        if not row.getnnz():
            return None
        distances = cosine_distances(row, self._centroids).ravel()
        best = int(np.argmin(distances))
        return f"k{best}" if distances[best] <= self.distance else None

    def name(self, kind: str | None) -> str:
        """A readable name: the kind and its most telling words."""
        return "(no request)" if kind is None else self.names_.get(kind, kind)

    def members(self) -> dict[str, list[str]]:
        """Trace ids per kind, in fit order."""
        out: dict[str, list[str]] = {}
        for trace, kind in self.kinds_.items():
            out.setdefault(kind, []).append(trace)
        return out


def _cluster(matrix, docs: Sequence[str], threshold: float) -> np.ndarray:
    """Average-linkage clusters under a cosine distance, one label per doc; requests with no
    word left (all of theirs are boilerplate or rare) are one kind together. Equal docs have
    equal rows: the distinct ones are clustered, weighted by their counts."""
    first: dict[str, int] = {}  # distinct doc -> its first row
    for i, doc in enumerate(docs):
        first.setdefault(doc, i)
    position = {doc: j for j, doc in enumerate(first)}
    index = np.array([position[doc] for doc in docs])
    rows = matrix[list(first.values())]
    distances = cosine_distances(rows)
    empty = np.asarray(rows.getnnz(axis=1) == 0)
    distances[np.ix_(empty, empty)] = 0.0
    np.fill_diagonal(distances, 0.0)
    counts = np.bincount(index, minlength=len(first))
    return average_linkage_labels(np.clip(distances, 0.0, None), counts, threshold)[index]
