"""perf: benchmarks. Each `python -m perf.X` prints a human table, then one JSON line."""
