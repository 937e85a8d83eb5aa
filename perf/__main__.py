"""``python -m perf COMMAND``: ``run`` the suite and ``report`` a run again (perf/run.py),
``readme`` (perf/readme.py)."""

from __future__ import annotations

import sys

USAGE = (
    "usage: python -m perf run [--quick] [--gpu] [--only NAME ...] [--compare FILE] [--out DIR]\n"
    "       python -m perf report RESULTS.json\n"
    "       python -m perf readme [--check]"
)


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command == "run":
        from perf.run import main as run

        return run(argv[1:])
    if command == "report":
        from perf.run import rerender

        return rerender(argv[1:])
    if command == "readme":
        from perf.readme import main as readme

        return readme(argv[1:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
