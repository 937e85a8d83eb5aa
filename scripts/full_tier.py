"""The `--full` test tier's record: the git tree hashes of what it covers, as of its last pass.

    python3 scripts/full_tier.py check    exit 0 when tests/full_tier.hashes matches HEAD's trees
    python3 scripts/full_tier.py write    record HEAD's trees (after a passing --full run)

`.ci/run` runs `bash scripts/test.sh --full` whenever `check` fails, so nothing the full tier
checks can change unseen; a passing `--full` writes the file, to be committed with the change.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORD = REPO / "tests" / "full_tier.hashes"
# what the full tier's tests exercise beyond the gate: the launcher and its Slurm cluster, the
# images, the sandbox service they build, the install script, and the tests themselves
COVERED = (
    "launcher",
    "docker",
    "sandbox_pool",
    "scripts/install.sh",
    "rstar2/cli_launch.py",
    "rstar2/config_launch.py",
    "tests/helpers/slurm_cluster.py",
    "tests/helpers/oci.py",
    "tests/integration/test_launch_slurm.py",
    "tests/integration/test_slurm_cluster.py",
    "tests/integration/test_sandbox_image.py",
)


def current() -> dict[str, str]:
    """Each covered path's object hash at HEAD (a path gone from HEAD: "absent")."""
    out = {}
    for path in COVERED:
        res = subprocess.run(
            ["git", "rev-parse", f"HEAD:{path}"], cwd=REPO, capture_output=True, text=True
        )
        out[path] = res.stdout.strip() if res.returncode == 0 else "absent"
    return out


def recorded() -> dict[str, str]:
    if not RECORD.is_file():
        return {}
    rows = (line.split() for line in RECORD.read_text().splitlines() if line.strip())
    return {path: digest for digest, path in rows}


def main(argv: list[str]) -> int:
    if argv == ["check"]:
        now, then = current(), recorded()
        changed = [p for p in COVERED if now[p] != then.get(p)]
        for path in changed:
            print(f"full tier: {path} changed since its last pass", file=sys.stderr)
        return 1 if changed else 0
    if argv == ["write"]:
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *COVERED], cwd=REPO)
        if dirty.returncode != 0:
            print("full tier: uncommitted changes in what it covers; commit, then rerun")
            return 1
        RECORD.write_text("".join(f"{d} {p}\n" for p, d in current().items()))
        print(f"full tier: recorded {RECORD.relative_to(REPO)} (commit it)")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
