"""advisor: a profiler-driven optimization advisor for PyTorch training."""

__version__ = "0.1.0"
