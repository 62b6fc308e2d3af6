"""The spans of a forked multiprocessing child that ends normally are stored,
each exactly once.

multiprocessing ends a child with `os._exit` (after its own `util._exit_function()`), so the
atexit flush never ran there: before the fix, 5 children of 100 spans each plus the parent's
one span stored 1 span. Now tracegym arms a multiprocessing finalizer in every forked child
that shuts its pipelines down on that way out.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from collections import Counter

import pytest
from tracegym.tracer.spool import iter_spool

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        sys.platform == "win32" or "fork" not in multiprocessing.get_all_start_methods(),
        reason="needs the 'fork' start method",
    ),
]

CHILDREN, SPANS = 4, 50

SCRIPT = """
import multiprocessing
import tracegym as tg

INIT_IN = {init_in!r}
# A long interval: nothing is exported on a timer before the child ends.
OPTIONS = dict(home="home", flush_interval_s=60)
if INIT_IN == "parent":
    tg.init(**OPTIONS)

@tg.tool
def ping(child, i):
    return i

def child(k):
    if INIT_IN == "child":
        tg.init(**OPTIONS)
    for i in range({spans}):
        ping(k, i)
    # returns normally: multiprocessing ends the child with os._exit(0)

if __name__ == "__main__":
    fork = multiprocessing.get_context("fork")
    processes = [fork.Process(target=child, args=(k,)) for k in range({children})]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    print([p.exitcode for p in processes])
    if INIT_IN == "parent":
        ping("parent", 0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("init_in", ["parent", "child"])
def test_forked_children_that_end_normally_keep_their_spans(run_python, tmp_path, init_in):
    result = run_python(SCRIPT.format(children=CHILDREN, spans=SPANS, init_in=init_in), timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str([0] * CHILDREN)
    records = list(iter_spool(tmp_path / "home"))
    parent = 1 if init_in == "parent" else 0
    ids = Counter(r["span_id"] for r in records)
    assert len(records) == CHILDREN * SPANS + parent, result.stderr[-3000:]
    assert max(ids.values()) == 1  # exactly once: no child re-exported the parent's queue
    calls = Counter(json.loads(r["attributes"]["gen_ai.tool.call.arguments"])["child"]
                    for r in records)  # fmt: skip
    expected = {k: SPANS for k in range(CHILDREN)}
    if parent:
        expected["parent"] = 1
    assert dict(calls) == expected
