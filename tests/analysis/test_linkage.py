"""Average linkage over distinct points weighted by their counts (analysis.linkage) clusters
exactly as average linkage over every point (scikit-learn's, the reference)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import AgglomerativeClustering
from tracegym.analysis.clustering import cluster
from tracegym.analysis.linkage import average_linkage_labels, distinct_rows


def _partition(labels) -> list[int]:
    order: dict[int, int] = {}
    return [order.setdefault(int(label), len(order)) for label in labels]


def _reference(points: np.ndarray, threshold: float) -> list[int]:
    model = AgglomerativeClustering(
        n_clusters=None, metric="cosine", linkage="average", distance_threshold=threshold
    )
    return _partition(model.fit_predict(points))


@pytest.mark.parametrize("seed", range(40))
def test_weighted_distinct_points_cluster_as_every_point_does(seed):
    rng = np.random.default_rng(seed)
    templates = rng.normal(size=(int(rng.integers(2, 30)), 6))
    points = np.repeat(templates, rng.integers(1, 8, size=len(templates)), axis=0)
    rng.shuffle(points)
    threshold = float(rng.uniform(0.1, 1.2))
    assert cluster(points, threshold).tolist() == _reference(points, threshold)


def test_the_counts_decide_a_merge_that_the_distinct_points_alone_would_not():
    # a sits between b and c: merged once, {a, b} is pulled towards b's many copies
    d = np.array([[0.0, 0.4, 0.5], [0.4, 0.0, 0.9], [0.5, 0.9, 0.0]])
    # unweighted: d({a, b}, c) = (0.5 + 0.9) / 2 = 0.7 < 0.72, so all three are one cluster
    assert average_linkage_labels(d, np.array([1, 1, 1]), 0.72).tolist() == [0, 0, 0]
    # b ten times: (0.5 + 10 * 0.9) / 11 = 0.86, so c stays apart, as with ten copies of b
    weights = np.array([1.0, 10.0, 1.0])
    assert average_linkage_labels(d, weights, 0.72).tolist() == [0, 0, 1]
    assert weights.tolist() == [1.0, 10.0, 1.0] and d[0, 1] == 0.4  # the caller's arrays kept
    expanded = np.array([0] + [1] * 10 + [2])
    full = d[np.ix_(expanded, expanded)]
    model = AgglomerativeClustering(
        n_clusters=None, metric="precomputed", linkage="average", distance_threshold=0.72
    )
    assert _partition(model.fit_predict(full)) == [0] * 11 + [1]


def test_equal_distances_everywhere_end_the_chain_and_merge_below_the_threshold_only():
    d = np.ones((5, 5)) - np.eye(5)
    assert average_linkage_labels(d, np.ones(5), 1.0).tolist() == [0, 1, 2, 3, 4]
    assert average_linkage_labels(d, np.ones(5), 1.01).tolist() == [0, 0, 0, 0, 0]


def test_distinct_rows_keep_the_order_of_first_appearance_and_count_copies():
    points = np.array([[3.0, 0.0], [1.0, 0.0], [3.0, 0.0], [2.0, 0.0], [1.0, 0.0]])
    distinct, index, counts = distinct_rows(points)
    assert distinct.tolist() == [[3.0, 0.0], [1.0, 0.0], [2.0, 0.0]]
    assert index.tolist() == [0, 1, 0, 2, 1]
    assert counts.tolist() == [2, 2, 1]
    assert (distinct[index] == points).all()


def test_cosine_distances_of_distinct_rows_match_the_reference_on_real_shaped_vectors():
    rng = np.random.default_rng(7)
    unit = rng.normal(size=(12, 32))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    points = unit[rng.integers(0, 12, size=300)]
    distinct, _, _ = distinct_rows(points)
    assert len(distinct) == len(np.unique(points, axis=0))
    for threshold in (0.3, 0.8, 1.0):
        assert cluster(points, threshold).tolist() == _reference(points, threshold)
