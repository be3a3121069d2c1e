"""advisor: a profiler-driven optimization advisor for PyTorch training.

The notebook API (`advisor.analyze`, `advisor.compare`, `advisor.profile`, `advisor.tune`, `Session`, `Trial`) lives in
`advisor.api` and is loaded on first use, so `import advisor` (and `advisor analyze`) stays torch-free
and quick.
"""

__version__ = "0.1.0"

_API = ("analyze", "compare", "profile", "tune", "Session", "Trial", "Diagnosis", "Job", "Comparison")


def __getattr__(name: str):
    if name in _API:
        from advisor import api

        return getattr(api, name)
    raise AttributeError(f"module 'advisor' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
