"""Dashboard page speed on a big store, each page beside its floor measured in the same run.

Builds (once, cached under --cache) a store of 1,000,000 spans / 30,000 runs over 30 days:
agent roots, LLM calls, tool calls (some failing), memory writes and reads linked by content
hash, an outcome per run, 30 recorded nights; plus artifacts: a gaps.json with 10 gaps and
their evidence runs, 10,000 cached signature embeddings, 6 evaluated adapters, and the
environments of a small demo store. Then serves the dashboard on loopback and times each
page's full HTTP response (best of --rounds) beside its floor: the same DuckDB statements the
page runs, executed directly on a plain connection over the same views with the dashboard
connection's settings (SQL pages), or the same artifact reads called directly (gaps,
environments, adapters). For the runs list it also prints, for reference, the time of the
statement it ran before it paged over a per-trace key: the same page read from the `traces`
view (`traces view ms`). Goal: every page <= 1 s and <= 2x its floor.

    .venv/bin/python benchmarks/dashboard_speed.py [--cache /tmp/tracegym-dashboard-bench]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from tracegym.store import lake
from tracegym.store.home import Home, read_json, write_json
from tracegym.store.views import register_views
from tracegym.tracer import semconv as sc
from tracegym.tracer.spool import spool_dir

RUNS = 30_000
SPANS_PER_RUN = 34  # 30,000 runs x 34 = 1,020,000 spans (outcome records apart)
DAYS = 30
BASE_NS = 1_764_460_800_000_000_000  # 2025-11-30
TOOLS = ["get_order", "find_user", "refund", "cancel", "search", "get_policy", "notify", "lookup"]


def _spool_sql(first: int, last: int) -> str:
    """Spool lines (docs/spool.md) for runs [first, last) and their outcomes, in SQL."""
    tools = "[" + ", ".join(f"'{t}'" for t in TOOLS) + "]"
    return f"""
    WITH runs AS (
        SELECT r, printf('%032x', r + 1) AS trace_id, printf('%016x', r + 1) AS root,
               {BASE_NS} + (r % {DAYS}) * 86400000000000 + (r // {DAYS}) * 2000000000 AS t0,
               CAST(hash(r) % 10 AS BIGINT) < 6 AS ok
        FROM range({first}, {last}) t(r)
    ),
    spans AS (
        SELECT runs.*, i, t0 + i * 3000000 AS s,
               CAST(hash(r * 100 + i) % 1000000007 AS BIGINT) AS h FROM runs,
               range({SPANS_PER_RUN}) u(i)
    )
    SELECT trace_id,
           CASE WHEN i = 0 THEN root ELSE printf('%016x', 1000000000 + r * 64 + i) END AS span_id,
           CASE WHEN i = 0 THEN NULL ELSE root END AS parent_span_id,
           CASE WHEN i = 0 THEN 'invoke_agent bench'
                WHEN i = 1 THEN 'update_memory notes' WHEN i = 2 THEN 'search_memory notes'
                WHEN i % 4 = 0 THEN 'chat m'
                ELSE 'execute_tool ' || {tools}[1 + h % 8] END AS name,
           'INTERNAL' AS kind, s AS start_ns,
           CASE WHEN i = 0 THEN s + {SPANS_PER_RUN} * 3000000 ELSE s + 1000 + h % 2000000 END
               AS end_ns,
           CASE WHEN i > 2 AND i % 4 <> 0 AND h % 50 = 0 THEN 'ERROR' ELSE 'UNSET' END AS status,
           NULL AS status_message,
           CASE
             WHEN i = 0 THEN json_object('{sc.OPERATION}', 'invoke_agent',
                 '{sc.AGENT_NAME}', 'bench-' || (r % 3), '{sc.RUN_ID}', 'run-' || r,
                 '{sc.INPUT}', 'customer ' || r || ' asks about order W' || (r * 7 % 100000))
             WHEN i = 1 THEN json_object('{sc.OPERATION}', 'update_memory',
                 '{sc.MEMORY_STORE}', 'notes', '{sc.MEMORY_RECORD}', 'note-' || (r % 500),
                 '{sc.MEMORY_CONTENT_HASH}', 'h' || (r % 500), '{sc.STEP_INDEX}', i)
             WHEN i = 2 THEN json_object('{sc.OPERATION}', 'search_memory',
                 '{sc.MEMORY_STORE}', 'notes', '{sc.MEMORY_QUERY}', 'note-' || ((r + 7) % 500),
                 '{sc.MEMORY_RESULT_HASHES}', ['h' || ((r + 7) % 500)], '{sc.STEP_INDEX}', i)
             WHEN i % 4 = 0 THEN json_object('{sc.OPERATION}', 'chat',
                 '{sc.REQUEST_MODEL}', 'm', '{sc.INPUT_TOKENS}', 100 + h % 50,
                 '{sc.OUTPUT_TOKENS}', 20 + h % 10, '{sc.STEP_INDEX}', i)
             ELSE json_object('{sc.OPERATION}', 'execute_tool',
                 '{sc.TOOL_NAME}', {tools}[1 + h % 8], '{sc.STEP_INDEX}', i,
                 '{sc.TOOL_ARGUMENTS}', '{{"order_id": "W' || (h % 100000) || '"}}',
                 '{sc.TOOL_RESULT}', '{{"status": "' || CASE WHEN h % 3 = 0 THEN 'delivered'
                     ELSE 'pending' END || '", "total": ' || (h % 500) || '}}')
           END AS attributes,
           [] AS events, [] AS links, json_object('service.name', 'bench') AS resource,
           'tracegym' AS scope
    FROM spans
    UNION ALL
    SELECT printf('%032x', 900000000 + r), printf('%016x', 900000000 + r), NULL,
           '{sc.OUTCOME_SPAN_NAME}', 'INTERNAL', t0 + 200000000, t0 + 200000000, 'UNSET', NULL,
           json_object('{sc.OPERATION}', '{sc.OP_OUTCOME}', '{sc.OUTCOME_TARGET}', 'run-' || r,
               '{sc.OUTCOME_SUCCESS}', ok,
               '{sc.OUTCOME_REWARD}', CASE WHEN ok THEN 1.0 ELSE 0.0 END,
               '{sc.OUTCOME_SOURCE}', 'bench',
               '{sc.OUTCOME_LABELS}', '{{"task_kind": "k' || (r % 5) || '"}}'),
           [], [], json_object('service.name', 'bench'), 'tracegym'
    FROM runs
    """


def build_store(home: Path) -> None:
    """The lake, written as spool files by DuckDB and compacted by tracegym itself."""
    directory = spool_dir(home)
    directory.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    step = 5000
    for first in range(0, RUNS, step):
        target = directory / f"bench-{first:06d}.jsonl"
        con.execute(
            f"COPY ({_spool_sql(first, min(first + step, RUNS))}) TO '{target}' (FORMAT json)"
        )
    con.close()
    lake.compact(home)


def build_artifacts(home: Path) -> None:
    """gaps.json, an embedding cache, adapters, nights, and a demo store's environments."""
    con = duckdb.connect()
    register_views(con, home)
    failed = [
        r[0]
        for r in con.sql(
            "SELECT trace_id FROM outcomes WHERE success = false ORDER BY trace_id LIMIT 50"
        ).fetchall()
    ]
    span_of = dict(
        con.sql(
            "SELECT trace_id, span_id FROM spans WHERE list_contains($ids, trace_id) "
            "AND status = 'ERROR'",
            params={"ids": failed},
        ).fetchall()
    )
    con.close()
    rng = np.random.default_rng(0)
    signatures = [f"signature of failure family {g}" for g in range(10)]
    gaps = []
    for g in range(10):
        examples = [
            {
                "trace_id": t,
                "run_id": None,
                "step": 5,
                "position": 5,
                "agent": "bench-0",
                "span_ids": [span_of[t]] if t in span_of else [],
                "evidence": f"finding {g} in this run",
            }
            for t in failed[g * 5 : g * 5 + 5]
        ]
        gaps.append(
            {
                "id": f"gap-{g:02d}",
                "rank": g + 1,
                "name": f"bench_gap_{g}",
                "key": f"bench:{g}",
                "kind": "finding",
                "detector": "wrong_tool_order",
                "description": "a synthetic gap",
                "coverage": 0.5 - g / 40,
                "delta": 0.4 - g / 50,
                "stability": 10,
                "failed_runs_lacking": 100 - g,
                "successful_runs_lacking": g,
                "tools": TOOLS[:2],
                "examples": examples,
                "signatures": [signatures[g]],
            }
        )
    write_json(
        Home.at(home).gaps,
        {
            "version": 1,
            "generated_at": "2025-12-30T00:00:00Z",
            "contrast": "failed vs successful runs",
            "runs": {"total": RUNS, "failed": 12000, "succeeded": 18000, "unknown": 0},
            "thresholds": {"resamples": 10},
            "gaps": gaps,
            "rejected": [],
        },
        indent=None,
    )
    from tracegym.dashboards.clusters import _key

    vectors = {}
    centres = rng.normal(size=(10, 384)).astype(np.float32)
    for i in range(10_000):
        v = centres[i % 10] + rng.normal(scale=0.8, size=384).astype(np.float32)
        vectors[f"{i:064x}"] = v / np.linalg.norm(v)
    for g, text in enumerate(signatures):
        vectors[_key(text)] = centres[g] / np.linalg.norm(centres[g])
    (home / "cache").mkdir(exist_ok=True)
    np.savez(home / "cache" / "embeddings.npz", **vectors)
    from tracegym.training.evaluate import rate

    for a in range(6):
        folder = home / "adapters" / f"lora-{a}"
        folder.mkdir(parents=True, exist_ok=True)
        row = {
            "base": rate(60, 200),
            "adapter": rate(80 + a * 5, 200),
            "router": rate(78, 200),
            "gain": 0.1,
            "p_value": 0.01,
            "promoted": a % 2 == 0,
            "reason": "bench",
        }
        (folder / "meta.json").write_text(
            json.dumps(
                {
                    "adapter_id": f"lora-{a}",
                    "capability": {"name": f"cap {a}", "env_id": None},
                    "metrics": {"eval": row},
                    "promoted": row["promoted"],
                    "promotion": "bench",
                }
            )
        )
    nights = home / "nightly"
    nights.mkdir(exist_ok=True)
    with (nights / "history.jsonl").open("w") as handle:
        for d in range(1, 31):
            handle.write(
                json.dumps(
                    {"date": f"2025-12-{d:02d}", "stages": {"compact": "done"}, "report": ""}
                )
                + "\n"
            )
    _copy_demo_environments(home)


def _copy_demo_environments(home: Path) -> None:
    import tracegym as tg
    from opentelemetry.sdk.trace import TracerProvider
    from tracegym.analysis.embeddings import Embedder
    from tracegym.analysis.pipeline import analyze
    from tracegym.examples.support_agent import run_demo
    from tracegym.synthesis.pipeline import synthesize
    from tracegym.training.router import HashEmbedder

    class Hashed(Embedder):
        def _load_model(self) -> Any:
            class Model:
                def encode(self, texts: list[str], **_: Any) -> Any:
                    return HashEmbedder(384).encode(texts)

            return Model()

    with tempfile.TemporaryDirectory() as tmp:
        demo = Path(tmp)
        tg.init(home=demo, provider=TracerProvider())
        run_demo(n_tasks=40, seed=1)
        tg.shutdown()
        analyze(demo, embedder=Hashed(demo / "cache"))
        synthesize(demo, n_train=20, n_heldout=10, validity_seeds=10)
        shutil.copytree(demo / "envs", home / "envs", dirs_exist_ok=True)


def traces_view_page(filters: Any, finding_traces: list[str] | None) -> tuple[str, dict]:
    """The runs page as read from the `traces` view (what the page ran before it paged over a
    per-trace key): a reference beside the floor, not the floor."""
    from tracegym.dashboards import queries

    where, params = ["true"], {}
    if filters.agent:
        where.append("agent = $agent")
        params["agent"] = filters.agent
    if filters.outcome:
        where.append({"success": "success = true", "failure": "success = false"}.get(
            filters.outcome, "success IS NULL"))  # fmt: skip
    if filters.tool:
        where.append("trace_id IN (SELECT trace_id FROM spans WHERE tool = $tool)")
        params["tool"] = filters.tool
    if finding_traces is not None:
        where.append("list_contains($finding_traces, trace_id)")
        params["finding_traces"] = finding_traces
    if filters.q:
        where.append(
            "trace_id IN (SELECT trace_id FROM spans WHERE contains(lower(name), $q) "
            "OR contains(lower(input), $q) OR contains(lower(output), $q) "
            "OR contains(lower(status_message), $q) OR contains(lower(error_type), $q) "
            "OR trace_id = $q_exact OR run_id = $q_exact)"
        )
        params["q"] = filters.q.lower()
        params["q_exact"] = filters.q.strip()
    params["limit"] = queries.PAGE_SIZE
    params["offset"] = (max(filters.page, 1) - 1) * queries.PAGE_SIZE
    sql = f"""
        SELECT trace_id, run_id, agent, start_time, round(duration_ms, 1) AS duration_ms,
               spans, tool_calls, llm_calls, errors, tokens, success, reward,
               count(*) OVER () AS total
        FROM traces WHERE {" AND ".join(where)}
        ORDER BY start_time DESC, trace_id LIMIT $limit OFFSET $offset
    """
    return sql, params


def best_of(rounds: int, fn: Callable[[], Any]) -> float:
    fn()  # warm: file metadata, DuckDB's caches
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "tracegym-dashboard-bench"
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    home = args.cache
    if not Home.at(home).gaps.exists():
        shutil.rmtree(home, ignore_errors=True)
        start = time.perf_counter()
        build_store(home)
        build_artifacts(home)
        print(f"built the store under {home} in {time.perf_counter() - start:.1f} s")

    import uvicorn
    from tracegym.dashboards import artifacts, clusters, queries
    from tracegym.dashboards.app import create_app

    plain = duckdb.connect()
    register_views(plain, home)
    plain.execute("SET parquet_metadata_cache = true")  # as dashboards/db.py sets it
    spans, runs = plain.sql("SELECT count(*), count(DISTINCT trace_id) FROM spans").fetchall()[0]
    print(f"store: {spans:,} spans, {runs:,} runs")
    gaps = read_json(Home.at(home).gaps)["gaps"]
    trace_id = gaps[0]["examples"][0]["trace_id"]
    env_id = artifacts.environments(home)[0][0].env_id

    app = create_app(home)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    model = app.app.state.ctx.findings
    model.wait(600)  # the detectors' background fit on the reference sample, before timing

    def fetch(path: str) -> Callable[[], Any]:
        def get() -> None:
            with urllib.request.urlopen(url + path, timeout=120) as response:
                assert response.status == 200, path
                response.read()

        return get

    def sql(qs: list[queries.Query]) -> Callable[[], Any]:
        return lambda: [plain.execute(q.sql, q.params).fetchall() for q in qs]

    filtered = queries.RunFilters(outcome="failure", tool="refund", q="w12", agent="bench-1")
    finding = queries.RunFilters(finding=gaps[0]["id"])
    box = queries.Query("box", "SELECT tool, count(*) FROM tool_calls GROUP BY tool")
    finding_ids = [e["trace_id"] for e in gaps[0]["examples"]]
    targets = queries.run_targets(trace_id, [{"run_id": "run-" + str(int(trace_id, 16) - 1)}])
    run_floor = [*queries.run(trace_id), queries.run_outcomes(targets)]
    gaps_path = Home.at(home).gaps

    def gaps_floor() -> None:
        clusters._cache.clear()  # the map is cached per cache-file version: time it cold
        document, _ = artifacts.gaps_document(home)
        clusters.cluster_map(home, document.gaps, gaps_path.stat().st_mtime)

    cases: list[tuple[str, str, Callable[[], Any], str]] = [
        ("overview", "/", sql(queries.overview()), "SQL"),
        (
            "runs",
            "/runs",
            sql([queries.runs(queries.RunFilters(), None), queries.run_options()]),
            "SQL",
        ),
        (
            "runs, 4 filters",
            "/runs?outcome=failure&tool=refund&q=w12&agent=bench-1",
            sql([queries.runs(filtered, None), queries.run_options()]),
            "SQL",
        ),
        (
            "runs, finding",
            f"/runs?finding={gaps[0]['id']}",
            sql(
                [
                    queries.runs(finding, finding_ids),
                    queries.run_options(),
                ]
            ),
            "SQL",
        ),
        (
            "runs, page 400",
            "/runs?page=400",
            sql([queries.runs(queries.RunFilters(page=400), None), queries.run_options()]),
            "SQL",
        ),
        (
            "SQL box",
            "/runs?sql=SELECT+tool%2C+count(*)+FROM+tool_calls+GROUP+BY+tool",
            sql(
                [
                    queries.runs(queries.RunFilters(), None),
                    queries.run_options(),
                    box,
                ]
            ),
            "SQL",
        ),
        ("run", f"/run/{trace_id}", sql(run_floor), "SQL"),
        ("gaps", "/gaps", lambda: artifacts.gaps_document(home), "artifacts (map cached)"),
        ("gaps (map cold)", "/gaps", gaps_floor, "artifacts + PCA"),
        ("environments", "/environments", lambda: artifacts.environments(home), "artifacts"),
        (
            "environment",
            f"/environments/{env_id}",
            lambda: artifacts.environment_detail(home, env_id),
            "artifacts + oracle",
        ),
        (
            "adapters",
            "/adapters",
            lambda: (artifacts.adapters(home), artifacts.nightly_history(home)),
            "artifacts",
        ),
    ]
    old_options = [
        queries.Query("agents", "SELECT DISTINCT agent FROM spans WHERE agent IS NOT NULL"),
        queries.Query("tools", "SELECT DISTINCT tool FROM spans WHERE tool IS NOT NULL"),
    ]  # the drop-downs' values before they were read in one pass

    def view_page(filters: queries.RunFilters, ids: list[str] | None = None) -> Callable[[], Any]:
        return sql([queries.Query("runs", *traces_view_page(filters, ids)), *old_options])

    references = {  # the runs list's statements before it paged over a per-trace key
        "runs": view_page(queries.RunFilters()),
        "runs, 4 filters": view_page(filtered),
        "runs, finding": view_page(finding, finding_ids),
        "runs, page 400": view_page(queries.RunFilters(page=400)),
        "SQL box": lambda: (view_page(queries.RunFilters())(), sql([box])()),
    }
    print(
        f"{'page':<18} {'server ms':>10} {'floor ms':>9} {'ratio':>6} {'traces view ms':>15}  floor"
    )
    worst = 0.0
    for name, path, floor_fn, kind in cases:
        if name == "gaps (map cold)":
            page_ms = 1000 * best_of(
                args.rounds, lambda p=path: (clusters._cache.clear(), fetch(p)())
            )
        else:
            page_ms = 1000 * best_of(args.rounds, fetch(path))
        floor_ms = 1000 * best_of(args.rounds, floor_fn)
        ratio = page_ms / floor_ms if floor_ms else float("inf")
        worst = max(worst, page_ms)
        view = f"{1000 * best_of(args.rounds, references[name]):.1f}" if name in references else ""
        print(f"{name:<18} {page_ms:>10.1f} {floor_ms:>9.1f} {ratio:>6.2f} {view:>15}  {kind}")
    print(f"slowest page {worst:.0f} ms (goal: every page <= 1000 ms and <= 2x its floor)")
    server.should_exit = True


if __name__ == "__main__":
    main()
