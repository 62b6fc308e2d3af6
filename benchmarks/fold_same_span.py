"""Gap selection before and after folding at the same step, in one run, on the same data.

    .venv/bin/python benchmarks/fold_same_span.py planted [planted_causes.py options]
    .venv/bin/python benchmarks/fold_same_span.py real [gaps_real.py options]

Runs `benchmarks/planted_causes.py` or `benchmarks/gaps_real.py` twice, on the same seeds or
sets and the same detectors, with `analysis.gaps.select` first as it was (`same_span=False`:
only followers, a failed call or a symptom kind, fold into a cause found at the same step)
and then as it is (`same_span=True`: any candidate folds into a cause that is
`analysis.gaps.more_specific` where their findings sit on the same step). Everything else
(the fold share, the thresholds, the tuning and reporting seeds) is the benchmarks' own.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = (
    ("previous selection (same_span=False: only followers tie at the same step)", False),
    ("now (same_span=True: whatever a more specific cause explains at the same step)", True),
)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("planted", "real"):
        print(__doc__)
        return 2
    import gaps_real
    import planted_causes
    from tracegym.analysis import gap_selection as gaps
    from tracegym.analysis import pipeline

    bench = planted_causes if args[0] == "planted" else gaps_real
    original = pipeline.select
    try:
        for title, same_span in VARIANTS:
            print(f"\n# ===== {title} =====\n", flush=True)
            pipeline.select = functools.partial(gaps.select, same_span=same_span)
            bench.main(args[1:])
    finally:
        pipeline.select = original
    return 0


if __name__ == "__main__":
    sys.exit(main())
