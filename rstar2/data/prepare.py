"""`rstar2 data prepare`: load a source, optionally decontaminate, write rStar2-schema parquet.

Guarantees: the output file appears only when complete (written to a temporary name, then
renamed); :func:`read_rows` of it returns exactly the rows that were written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rstar2.data.decontam import Decontaminator
from rstar2.data.schema import DataError, problem_text
from rstar2.data.sources import BENCHMARK_NAMES, builtin_records, load_rows


@dataclass(frozen=True)
class PrepareResult:
    name: str
    path: Path
    num_rows: int
    num_contaminated: int


def benchmark_decontaminator(n: int = 8) -> Decontaminator:
    """A decontaminator over the problems of every built-in benchmark."""
    texts = (rec["problem"] for name in BENCHMARK_NAMES for rec in builtin_records(name))
    return Decontaminator(texts, n=n)


def prepare_dataset(
    spec: str,
    out_dir: Path,
    *,
    decontaminator: Decontaminator | None = None,
    limit: int | None = None,
    progress: bool = True,
) -> PrepareResult:
    """Write ``<out_dir>/<name>.parquet`` in the rStar2 schema and return what was written."""
    loaded = load_rows(spec)
    rows = loaded.rows if limit is None else loaded.rows[:limit]
    removed = 0
    if decontaminator is not None:
        kept = []
        for row in tqdm(rows, desc=f"decontaminate {loaded.name}", disable=not progress):
            if decontaminator.is_contaminated(problem_text(row)):
                removed += 1
            else:
                kept.append(row)
        rows = kept
    if not rows:
        raise DataError(f"{spec}: no rows to write")
    path = out_dir / f"{loaded.name}.parquet"
    write_rows(rows, path)
    return PrepareResult(loaded.name, path, len(rows), removed)


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """Write rows as parquet atomically (the file is complete or absent)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows
