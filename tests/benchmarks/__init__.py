"""Tests of the benchmarks' own helpers (never the systems they measure)."""
