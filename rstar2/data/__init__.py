"""Prompt data in the rStar2 row schema: built-in benchmark/training sets, loaders, parquet I/O."""

from rstar2.data.decontam import Decontaminator, word_ngrams
from rstar2.data.prepare import (
    PrepareResult,
    benchmark_decontaminator,
    prepare_dataset,
    read_rows,
    write_rows,
)
from rstar2.data.schema import DataError, ground_truth, make_row, problem_text
from rstar2.data.sources import BENCHMARK_NAMES, BUILTIN_DATASETS, load_rows

__all__ = [
    "BENCHMARK_NAMES",
    "BUILTIN_DATASETS",
    "DataError",
    "Decontaminator",
    "PrepareResult",
    "benchmark_decontaminator",
    "ground_truth",
    "load_rows",
    "make_row",
    "prepare_dataset",
    "problem_text",
    "read_rows",
    "word_ngrams",
    "write_rows",
]
