"""Benchmarks: each module runs standalone (``python -m bench.<name> --out FILE``)."""
