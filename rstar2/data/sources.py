"""Where problems come from: the built-in sets, local JSONL/parquet files, and hub dataset ids.

Guarantees: :func:`load_rows` returns rStar2 rows (see :mod:`rstar2.data.schema`) or raises
:class:`DataError` with a one-line reason naming the file, line or field; files already in the
rStar2 schema (the public port's parquet) come back unchanged. With ``strict=False`` a bad row
(a line that is not JSON, a missing or non-string problem, a missing answer, a repeated id) is
left out and listed in :attr:`LoadedDataset.skipped` instead; an unreadable file still raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class SkippedRow:
    where: str  # "<file>: row 3" or "<file>: line 7"
    reason: str
    kind: str  # "malformed" or "duplicate_id"

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


@dataclass
class LoadedDataset:
    name: str
    rows: list[dict[str, Any]]
    skipped: list[SkippedRow] = field(default_factory=list)


def load_rows(spec: str, *, strict: bool = True) -> LoadedDataset:
    """Rows of ``spec``: a built-in name, a .jsonl/.json/.parquet path, or ``hf:ORG/NAME...``.

    Raises DataError for an unknown name or an unreadable file, and (``strict``) for a bad row;
    otherwise bad rows are left out and listed in ``skipped``.
    """
    skipped: list[SkippedRow] | None = None if strict else []
    if spec in BUILTIN_DATASETS:
        return _load_builtin(BUILTIN_DATASETS[spec])
    if spec.startswith("hf:"):
        return _load_hub(spec[3:], skipped)
    path = Path(spec).expanduser()
    if path.is_file():
        return _load_file(path, skipped)
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


def _load_file(path: Path, skipped: list[SkippedRow] | None = None) -> LoadedDataset:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        records = _read_parquet(path)
    elif suffix in (".jsonl", ".json"):
        records = _read_json_records(path, skipped)
    else:
        raise DataError(f"{path}: unsupported file type '{suffix}' (use .jsonl, .json or .parquet)")
    rows = records_to_rows(records, origin=path.stem, where=str(path), skipped=skipped)
    return LoadedDataset(path.stem, rows, skipped or [])


def _skip(skipped: list[SkippedRow] | None, exc: DataError, where: str, kind: str) -> None:
    """Raise ``exc`` (strict: no list), else note the row as skipped."""
    if skipped is None:
        raise exc
    skipped.append(SkippedRow(where, str(exc).removeprefix(f"{where}: "), kind))


def _record_id(rec: dict[str, Any]) -> Any:
    extra = rec.get("extra_info")
    if is_rstar2_row(rec) and isinstance(extra, dict):
        return extra.get("id")
    return rec.get("id")


def records_to_rows(
    records: list[dict[str, Any]],
    *,
    origin: str,
    where: str,
    split: str = "train",
    skipped: list[SkippedRow] | None = None,
) -> list[dict[str, Any]]:
    """rStar2 rows from records that are either rStar2 rows already or have problem/answer keys.
    A bad record or a repeated id raises DataError, or with a ``skipped`` list is noted there."""
    rows = []
    first_row_of: dict[str, int] = {}
    for i, rec in enumerate(records):
        here = f"{where}: row {i + 1}"
        rid = _record_id(rec)
        if rid is not None and str(rid) in first_row_of:
            first = first_row_of[str(rid)]
            dup = DataError(f"{here}: duplicate id {str(rid)!r} (first at row {first})")
            _skip(skipped, dup, here, "duplicate_id")
            continue
        try:
            if is_rstar2_row(rec):
                validate_row(rec, here)
                rows.append(rec)
                if rid is not None:
                    first_row_of[str(rid)] = i + 1
                continue
            problem = _first_key(rec, PROBLEM_KEYS, here, "problem", (str,))
            answer = _first_key(rec, ANSWER_KEYS, here, "answer", (str, int, float))
        except DataError as exc:
            _skip(skipped, exc, here, "malformed")
            continue
        if rid is not None:
            first_row_of[str(rid)] = i + 1
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


def _first_key(
    rec: dict[str, Any], keys: tuple[str, ...], where: str, what: str, types: tuple[type, ...]
) -> Any:
    for key in keys:
        value = rec.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            kinds = " or ".join("a string" if t is str else "a number" for t in types[:2])
            raise DataError(f"{where}: '{key}' is {type(value).__name__}, not {kinds}")
        if str(value).strip():
            return value
    raise DataError(f"{where}: no {what} field (looked for {', '.join(keys)})")


def _read_json_records(path: Path, skipped: list[SkippedRow] | None = None) -> list[dict[str, Any]]:
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
        here = f"{path}: line {lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            _skip(skipped, DataError(f"{here}: not valid JSON ({exc.msg})"), here, "malformed")
            continue
        if not isinstance(rec, dict):
            _skip(skipped, DataError(f"{here}: not a JSON object"), here, "malformed")
            continue
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


def _load_hub(hub_spec: str, skipped: list[SkippedRow] | None = None) -> LoadedDataset:
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
    where = f"hf:{hub_spec}"
    rows = records_to_rows(
        records, origin=repo, where=where, split=split or "train", skipped=skipped
    )
    return LoadedDataset(repo.rsplit("/", 1)[-1], rows, skipped or [])
