"""Average-linkage clustering of repeated points, in memory bounded by the distinct ones.

Requests and failure signatures are masked templates: at 100k runs there are a few hundred
distinct texts, each repeated many times. Average linkage (UPGMA) over all N points needs an
N x N distance matrix (80 GB at 100k); the same clustering is reached from the M distinct points
weighted by how often each occurs. Copies are at distance 0 and merge before anything else, and
from then on a group of k copies is, to average linkage, one point of weight k: the distance of
two clusters is the mean over all pairs of their points, which the Lance-Williams update
`d(k, i+j) = (n_i d(k, i) + n_j d(k, j)) / (n_i + n_j)` keeps exactly when n starts at the
counts. Neither scikit-learn's nor SciPy's average linkage takes such weights, hence this
module: the nearest-neighbour chain algorithm (O(M^2) time, one M x M matrix), then a cut at
the threshold as scikit-learn's `distance_threshold` cuts (merges at or above it are not made).
"""

from __future__ import annotations

import numpy as np


def average_linkage_labels(
    distances: np.ndarray, weights: np.ndarray, threshold: float
) -> np.ndarray:
    """Cluster labels (0..k-1, in order of first appearance) of M weighted points, from their
    symmetric M x M distance matrix: average linkage, merging while the distance is under
    `threshold`."""
    m = len(distances)
    if m <= 1:
        return np.zeros(m, dtype=int)
    merges = _nn_chain(np.array(distances, dtype=np.float64), np.array(weights, dtype=float))
    parent = np.arange(m)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return i

    # Average linkage is reducible: a cluster's own merges are never farther apart than the
    # merge that joins it to another, so every merge under the threshold, in any order, gives
    # the partition at the threshold.
    for distance, a, b in merges:
        if distance < threshold:
            parent[root(b)] = root(a)
    order: dict[int, int] = {}
    return np.array([order.setdefault(root(i), len(order)) for i in range(m)], dtype=int)


def _nn_chain(d: np.ndarray, size: np.ndarray) -> list[tuple[float, int, int]]:
    """The M - 1 merges (distance, kept index, merged index) of average linkage; `d` and
    `size` are overwritten (the caller passes copies). The chain follows nearest neighbours
    until two are each other's, merges them (keeping the lower-numbered one's index), and goes
    on from what is left of the chain."""
    m = len(d)
    np.fill_diagonal(d, np.inf)
    alive = np.ones(m, dtype=bool)
    merges: list[tuple[float, int, int]] = []
    chain: list[int] = []
    while len(merges) < m - 1:
        if not chain:
            chain.append(int(np.flatnonzero(alive)[0]))
        a = chain[-1]
        row = d[a]
        b = int(np.argmin(row))
        if len(chain) > 1 and row[chain[-2]] <= row[b]:
            b = chain[-2]  # a tie with the previous link closes the chain (no cycles)
        if len(chain) > 1 and b == chain[-2]:
            chain.pop()
            chain.pop()
            keep, gone = min(a, b), max(a, b)
            merges.append((float(d[a, b]), keep, gone))
            merged = (size[keep] * d[keep] + size[gone] * d[gone]) / (size[keep] + size[gone])
            merged[~alive] = np.inf
            d[keep, :] = merged
            d[:, keep] = merged
            d[keep, keep] = np.inf
            d[gone, :] = np.inf
            d[:, gone] = np.inf
            size[keep] += size[gone]
            alive[gone] = False
        else:
            chain.append(b)
    return merges


def distinct_rows(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct rows of `vectors` (in order of first appearance), each row's index among
    them, and how often each occurs."""
    _, first, inverse, counts = np.unique(
        vectors, axis=0, return_index=True, return_inverse=True, return_counts=True
    )
    order = np.argsort(first, kind="stable")  # np.unique sorts rows; keep the runs' order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return vectors[first[order]], rank[inverse.ravel()], counts[order]
