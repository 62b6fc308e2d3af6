"""A 2-D map of the failure signatures analysis embedded: PCA of the embedding cache.

`tracegym analyze` caches every failure signature's all-MiniLM-L6-v2 vector under
`<home>/cache/embeddings.npz`, keyed by a hash of the text. The map projects (a bounded sample
of) those vectors onto their first two principal components and colours each by the gap whose
signatures (gaps.json `signatures`) lie nearest, within the clustering's own cosine distance;
the rest are "no gap". Computed once per cache file version, with numpy only.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracegym.analysis.gap import Gap, GapError, as_gap
from tracegym.store.home import Home

MAX_POINTS = 3000
DISTANCE = 0.35  # the analysis's default cluster distance (cosine)
MODEL_NAME = "all-MiniLM-L6-v2"  # tracegym.analysis.embeddings.MODEL_NAME

_cache: dict[tuple[str, float, float], dict[str, Any]] = {}
_lock = threading.Lock()


def _key(text: str) -> str:
    return hashlib.sha256(f"{MODEL_NAME}\0{text}".encode()).hexdigest()


def cluster_map(
    home: Path, gaps: Sequence[Gap | Mapping[str, Any]], gaps_mtime: float
) -> dict[str, Any]:
    """{"points": [{x, y, gap}], "gaps": [{id, name, x, y}], "total", "shown", "note"}."""
    path = Home.at(home).embeddings_cache
    if not path.exists():
        return {
            "points": [],
            "gaps": [],
            "total": 0,
            "shown": 0,
            "note": "no embedding cache yet: run `tracegym analyze`",
        }
    gaps = _typed(gaps)
    ident = (str(path), path.stat().st_mtime, gaps_mtime)
    with _lock:
        if ident not in _cache:
            _cache.clear()
            _cache[ident] = _compute(path, gaps)
        return _cache[ident]


def _typed(gaps: Sequence[Gap | Mapping[str, Any]]) -> list[Gap]:
    """Gaps, or their gaps.json records (those that are not gaps left out)."""
    out = []
    for gap in gaps:
        try:
            out.append(as_gap(gap))
        except GapError:
            continue
    return out


def _compute(path: Path, gaps: Sequence[Gap]) -> dict[str, Any]:
    try:
        import numpy as np
    except ImportError:
        return {
            "points": [],
            "gaps": [],
            "total": 0,
            "shown": 0,
            "note": "the map needs numpy (the analysis extra)",
        }
    with np.load(path) as data:
        keys = sorted(data.files)
        total = len(keys)
        rng = np.random.default_rng(0)
        wanted = {_key(s) for g in gaps for s in g.signatures}
        if total > MAX_POINTS:
            picked = set(rng.choice(total, MAX_POINTS, replace=False).tolist())
            keys = [k for i, k in enumerate(keys) if i in picked or k in wanted]
        if not keys:
            return {"points": [], "gaps": [], "total": 0, "shown": 0, "note": "the cache is empty"}
        vectors = np.stack([np.asarray(data[k], dtype=np.float32) for k in keys])
    index = {k: i for i, k in enumerate(keys)}
    centred = vectors - vectors.mean(axis=0)
    if len(keys) >= 2:
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        xy = centred @ vt[:2].T
        if xy.shape[1] < 2:
            xy = np.hstack([xy, np.zeros((len(keys), 1))])
    else:
        xy = np.zeros((len(keys), 2))
    centroids, marks = [], []
    for gap in gaps:
        rows = [index[_key(s)] for s in gap.signatures if _key(s) in index]
        if not rows:
            continue
        centroid = vectors[rows].mean(axis=0)
        centroid /= np.linalg.norm(centroid) or 1.0
        centroids.append((gap, centroid))
        first = rows[0]
        marks.append(
            {
                "id": gap.id,
                "name": gap.name,
                "x": float(xy[first, 0]),
                "y": float(xy[first, 1]),
            }
        )
    labels: list[str | None] = [None] * len(keys)
    if centroids:
        similarity = vectors @ np.stack([c for _, c in centroids]).T
        best = similarity.argmax(axis=1)
        for i in range(len(keys)):
            if similarity[i, best[i]] >= 1 - DISTANCE:
                labels[i] = centroids[best[i]][0].id
    groups = _groups(vectors) if not centroids else [None] * len(keys)
    points = [
        {
            "x": round(float(xy[i, 0]), 4),
            "y": round(float(xy[i, 1]), 4),
            "gap": labels[i],
            "group": groups[i],
        }
        for i in range(len(keys))
    ]
    note = f"PCA of {len(keys)} of {total} cached failure-signature embeddings"
    if not centroids:
        note += (
            "; no gap lists signatures (gaps found by detectors carry none), so points are "
            f"coloured by similar-signature group (cosine distance {DISTANCE})"
        )
    return {"points": points, "gaps": marks, "total": total, "shown": len(keys), "note": note}


def _groups(vectors: Any) -> list[int]:
    """Groups of similar signatures (leader clustering at the analysis's cosine distance),
    numbered from 1 by size: the colours when no gap names its signatures."""
    import numpy as np

    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms == 0, 1.0, norms)
    leaders: list[int] = []
    assigned = [-1] * len(unit)
    for i in range(len(unit)):
        if leaders:
            similarity = unit[leaders] @ unit[i]
            best = int(similarity.argmax())
            if similarity[best] >= 1 - DISTANCE:
                assigned[i] = best
                continue
        leaders.append(i)
        assigned[i] = len(leaders) - 1
    sizes = np.bincount(np.asarray(assigned), minlength=len(leaders))
    rank = {int(g): n + 1 for n, g in enumerate(np.argsort(-sizes, kind="stable"))}
    return [rank[g] for g in assigned]
