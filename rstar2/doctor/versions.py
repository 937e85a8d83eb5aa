"""What is installed, by distribution name, and the record an image keeps of it.

Standard library only: the sandbox image runs it without rstar2's dependencies
(``python3 -m rstar2.doctor.versions --out /opt/rstar2/versions.json DIST ...``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

IMAGE_RECORD = Path("/opt/rstar2/versions.json")


def installed_versions(dists: Iterable[str]) -> dict[str, str | None]:
    """Each distribution's installed version, or None where it is not installed."""
    found: dict[str, str | None] = {}
    for name in dists:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def image_record(dists: Iterable[str], commit: str, base_image: str) -> dict[str, object]:
    """The record written into an image at build time: Python, the base, the commit, versions."""
    return {
        "python": platform.python_version(),
        "base_image": base_image,
        "rstar2_commit": commit,
        "packages": installed_versions(dists),
    }


def read_image_record(path: Path = IMAGE_RECORD) -> dict[str, object] | None:
    """The image's build-time record, or None outside an image (or where it is unreadable)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write an image's versions.json")
    parser.add_argument("--out", type=Path, default=IMAGE_RECORD)
    parser.add_argument("--commit", default="unknown", help="the rstar2 commit built from")
    parser.add_argument("--base-image", default="unknown", help="the FROM image, tag@digest")
    parser.add_argument(
        "--require",
        nargs="*",
        default=[],
        metavar="DIST",
        help="distributions that must be installed (the build fails otherwise)",
    )
    parser.add_argument("dists", nargs="*", help="distributions to record where installed")
    args = parser.parse_args(argv)
    record = image_record([*args.require, *args.dists], args.commit, args.base_image)
    packages = record["packages"]
    assert isinstance(packages, dict)
    missing = [name for name in args.require if packages.get(name) is None]
    if missing:
        print(f"versions: not installed: {', '.join(missing)}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(json.dumps(record, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
