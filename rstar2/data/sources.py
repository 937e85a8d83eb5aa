"""Where problems come from: the built-in sets, local JSONL/parquet files, and hub dataset ids.

Guarantees: :func:`load_rows` returns rStar2 rows (see :mod:`rstar2.data.schema`) or raises
:class:`DataError` with a one-line reason naming the file, line or field; files already in the
rStar2 schema (the public port's parquet) come back unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rstar2.data.schema import DataError, is_rstar2_row, make_row, validate_row

PROBLEM_KEYS = ("problem", "question", "prompt", "query")
ANSWER_KEYS = ("answer", "ground_truth", "final_answer")


@dataclass(frozen=True)
class BuiltinDataset:
    """A dataset shipped in the package (sources, licenses: rstar2/data/builtin/README.md)."""

    name: str
    filename: str
    origin: str  # the hub id the public rStar2 scripts load; becomes data_source "rstar_<origin>"
    split: str
    num_rows: int
    description: str


BUILTIN_DATASETS: dict[str, BuiltinDataset] = {
    d.name: d
    for d in (
        BuiltinDataset(
            "aime24", "aime24.jsonl", "HuggingFaceH4/aime_2024", "test", 30, "AIME 2024 I+II"
        ),
        BuiltinDataset(
            "aime25", "aime25.jsonl", "opencompass/AIME2025", "test", 30, "AIME 2025 I+II"
        ),
        BuiltinDataset(
            "hmmt25", "hmmt25.jsonl", "MathArena/hmmt_feb_2025", "test", 30, "HMMT Feb 2025"
        ),
        BuiltinDataset(
            "math500", "math500.jsonl", "HuggingFaceH4/MATH-500", "test", 500, "MATH-500 split"
        ),
        BuiltinDataset(
            "dapo17k",
            "dapo17k_en.jsonl",
            "open-r1/DAPO-Math-17k-Processed",
            "train",
            14048,
            "DAPO-Math-17k, deduplicated, English",
        ),
    )
}
BENCHMARK_NAMES = ("aime24", "aime25", "hmmt25", "math500")


@dataclass
class LoadedDataset:
    name: str
    rows: list[dict[str, Any]]


def load_rows(spec: str) -> LoadedDataset:
    """Rows of ``spec``: a built-in name, a .jsonl/.json/.parquet path, or ``hf:ORG/NAME...``.

    Raises DataError for an unknown name, an unreadable file, or a record without problem/answer.
    """
    if spec in BUILTIN_DATASETS:
        return _load_builtin(BUILTIN_DATASETS[spec])
    if spec.startswith("hf:"):
        return _load_hub(spec[3:])
    path = Path(spec).expanduser()
    if path.is_file():
        return _load_file(path)
    names = ", ".join(BUILTIN_DATASETS)
    raise DataError(
        f"unknown dataset '{spec}': not a built-in name ({names}), "
        "not an existing file, and not hf:ORG/NAME"
    )


def builtin_records(name: str) -> Iterator[dict[str, Any]]:
    """The raw records of a built-in dataset (``id``, ``problem``, ``answer``, ...)."""
    ds = BUILTIN_DATASETS[name]
    ref = resources.files("rstar2.data") / "builtin" / ds.filename
    with ref.open("r", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _load_builtin(ds: BuiltinDataset) -> LoadedDataset:
    rows = []
    for index, rec in enumerate(builtin_records(ds.name)):
        extra = {"id": rec["id"]}
        rows.append(
            make_row(
                problem=rec["problem"],
                answer=rec["answer"],
                origin=ds.origin,
                split=ds.split,
                index=index,
                extra=extra,
            )
        )
    return LoadedDataset(ds.name, rows)


def _load_file(path: Path) -> LoadedDataset:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        records = _read_parquet(path)
    elif suffix in (".jsonl", ".json"):
        records = _read_json_records(path)
    else:
        raise DataError(f"{path}: unsupported file type '{suffix}' (use .jsonl, .json or .parquet)")
    return LoadedDataset(path.stem, records_to_rows(records, origin=path.stem, where=str(path)))


def records_to_rows(
    records: list[dict[str, Any]], *, origin: str, where: str, split: str = "train"
) -> list[dict[str, Any]]:
    """rStar2 rows from records that are either rStar2 rows already or have problem/answer keys."""
    rows = []
    for i, rec in enumerate(records):
        here = f"{where}: row {i + 1}"
        if is_rstar2_row(rec):
            validate_row(rec, here)
            rows.append(rec)
            continue
        problem = _first_key(rec, PROBLEM_KEYS, here, "problem")
        answer = _first_key(rec, ANSWER_KEYS, here, "answer")
        extra = {"id": str(rec["id"])} if "id" in rec else None
        rows.append(
            make_row(
                problem=str(problem),
                answer=str(answer),
                origin=origin,
                split=split,
                index=i,
                extra=extra,
            )
        )
    return rows


def _first_key(rec: dict[str, Any], keys: tuple[str, ...], where: str, what: str) -> Any:
    for key in keys:
        value = rec.get(key)
        if isinstance(value, str | int | float) and str(value).strip():
            return value
    raise DataError(f"{where}: no {what} field (looked for {', '.join(keys)})")


def _read_json_records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not all(isinstance(r, dict) for r in data):
            raise DataError(f"{path}: a JSON array of objects is expected")
        return list(data)
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: line {lineno} is not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}: line {lineno} is not a JSON object")
        records.append(rec)
    return records


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    records: list[dict[str, Any]] = table.to_pylist()
    return records


def _load_hub(hub_spec: str) -> LoadedDataset:
    name, _, split = hub_spec.partition("@")
    repo, _, config = name.partition(":")
    try:
        import datasets
    except ImportError:
        raise DataError("hub datasets need the 'datasets' package (pip install datasets)") from None
    try:
        ds = datasets.load_dataset(repo, config or None, split=split or "train")
    except Exception as exc:
        raise DataError(
            f"could not load hf:{hub_spec} from the hub: {exc}".splitlines()[0]
        ) from None
    records = [dict(r) for r in ds]
    rows = records_to_rows(records, origin=repo, where=f"hf:{hub_spec}", split=split or "train")
    return LoadedDataset(repo.rsplit("/", 1)[-1], rows)
