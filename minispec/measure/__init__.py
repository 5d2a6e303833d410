"""Measurement: one timing harness (harness.py) behind `minispec bench` (bench.py) and `minispec
sweep` (sweep.py). Speed lives here, beside the algorithm, never inside it."""
