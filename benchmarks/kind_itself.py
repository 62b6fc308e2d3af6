"""Gap selection with and without "the kind of request itself", in one run, on the same data.

    .venv/bin/python benchmarks/kind_itself.py planted [planted_causes.py options]
    .venv/bin/python benchmarks/kind_itself.py real [gaps_real.py options]

Runs `benchmarks/planted_causes.py` or `benchmarks/gaps_real.py` once per variant of
`analysis.gaps.like_with_like`, on the same seeds or sets and the same detectors:

1. before: `kind_itself=False` (the spending and rescue contrasts by first write tool only);
2. now: `kind_itself=True` (a kept candidate confined to one request kind learnt from the
   request text, `analysis.request_kinds`, that the kind's successful runs show as often, or
   whose kind has no successful run, is dropped: `analysis.gaps.the_kind_itself`);
3. learnt everywhere (the default): as 2, and the spending and rescue contrasts also use
   learnt kinds (`contrast_kinds=LEARNT`; the first write tool for runs without request text)
   instead of the first write tool.

Everything else (the thresholds, the tuning and reporting seeds) is the benchmarks' own.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("planted", "real"):
        print(__doc__)
        return 2
    import gaps_real
    import planted_causes
    from tracegym.analysis import gap_selection as gaps
    from tracegym.analysis import pipeline

    variants = (
        ("before (kind_itself=False; contrasts by first write tool)",
         {"kind_itself": False, "contrast_kinds": gaps.FIRST_WRITE, "spread": False}),
        ("kind itself only (kind_itself=True; contrasts by first write tool)",
         {"kind_itself": True, "contrast_kinds": gaps.FIRST_WRITE, "spread": False}),
        ("learnt everywhere (kind_itself=True; contrasts by learnt kinds; spread=False)",
         {"kind_itself": True, "contrast_kinds": gaps.LEARNT, "spread": False}),
        ("+ across kinds, the default (spread=True)",
         {"kind_itself": True, "contrast_kinds": gaps.LEARNT, "spread": True}),
    )  # fmt: skip
    bench = planted_causes if args[0] == "planted" else gaps_real
    original = pipeline.like_with_like
    try:
        for title, options in variants:
            print(f"\n# ===== {title} =====\n", flush=True)
            pipeline.like_with_like = functools.partial(gaps.like_with_like, **options)
            bench.main(args[1:])
    finally:
        pipeline.like_with_like = original
    return 0


if __name__ == "__main__":
    sys.exit(main())
