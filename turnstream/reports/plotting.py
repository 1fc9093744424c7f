"""matplotlib for the reports and benchmarks, drawing to files only."""
from __future__ import annotations


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: reports run on headless machines
    import matplotlib.pyplot as plt

    return plt
