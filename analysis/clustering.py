"""Clustering failure signatures.

Agglomerative clustering (average linkage, cosine distance, a distance threshold instead of a
cluster count) rather than HDBSCAN: it is deterministic by construction (no seed to fix), works
on the handful of failures a small project has (HDBSCAN needs a minimum cluster size and calls
much of a small population noise), and its one knob reads directly as "how different may two
failures be and still be the same problem". Signatures are masked text, so many failed runs
share one: the distinct vectors are clustered, weighted by their counts (`analysis.linkage`),
which gives the same clusters as clustering every run in memory bounded by the distinct ones.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics.pairwise import cosine_distances
from tracegym.analysis.linkage import average_linkage_labels, distinct_rows


def cluster(vectors: np.ndarray, distance_threshold: float = 0.35) -> np.ndarray:
    """Cluster labels (0..k-1, in order of first appearance) for unit-length `vectors`."""
    n = len(vectors)
    if n == 0:
        return np.zeros(0, dtype=int)
    if n == 1:
        return np.zeros(1, dtype=int)
    distinct, index, counts = distinct_rows(np.asarray(vectors))
    distances = np.clip(cosine_distances(distinct), 0.0, None)
    np.fill_diagonal(distances, 0.0)
    # the distinct rows come in order of first appearance, so their labels do too
    return average_linkage_labels(distances, counts, distance_threshold)[index]


def assign(vectors: np.ndarray, centroids: np.ndarray, distance_threshold: float) -> np.ndarray:
    """Nearest centroid for each vector, or -1 when none is within `distance_threshold`."""
    if len(vectors) == 0 or len(centroids) == 0:
        return np.full(len(vectors), -1, dtype=int)
    norms = np.linalg.norm(centroids, axis=1, keepdims=True)
    unit = centroids / np.where(norms == 0, 1, norms)
    distance = 1.0 - vectors @ unit.T
    best = distance.argmin(axis=1)
    return np.where(distance[np.arange(len(vectors)), best] <= distance_threshold, best, -1)
