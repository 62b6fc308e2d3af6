"""A streamed analysis's worker process: `python -m tracegym.analysis.stream_worker TASK`
(`streaming.run_task`)."""

from __future__ import annotations

import sys

from tracegym.analysis.streaming import run_task

if __name__ == "__main__":
    run_task(sys.argv[1])
