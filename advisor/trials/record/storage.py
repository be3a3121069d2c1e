"""The tool's records on disk (trial.json, steps.jsonl, harness.json, session.json): strict JSON, written
atomically.

JSON has no NaN or Infinity. A record that holds one (a diverged loss, a gain over a zero) writes `null`
there and says what was there under `non_finite` in the same object: `{"loss": null, "non_finite":
{"loss": "nan"}}`. Readers of a value that may be non-finite use `number(record, key)`, which gives the
float back; they also accept records that older versions wrote with bare `NaN` (Python's reader does).
"""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any

NON_FINITE = "non_finite"


def strict(value: Any) -> Any:
    """The value with every non-finite float replaced by None, each dict saying which of its keys held one."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        out, found = {}, {}
        for key, item in value.items():
            if isinstance(item, float) and not math.isfinite(item):
                found[str(key)] = "nan" if math.isnan(item) else ("inf" if item > 0 else "-inf")
            out[key] = strict(item)
        if found:
            out[NON_FINITE] = {**(out.get(NON_FINITE) or {}), **found}
        return out
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return value


def dumps(data: Any, **options: Any) -> str:
    """Strict JSON text of a record (non-finite numbers as null, said under `non_finite`)."""
    return json.dumps(strict(data), allow_nan=False, default=str, **options)


def number(record: dict[str, Any], key: str) -> float | None:
    """A number a record holds, non-finite ones included (read back from `non_finite`)."""
    value = record.get(key)
    if value is None:
        text = (record.get(NON_FINITE) or {}).get(key) if isinstance(record.get(NON_FINITE), dict) else None
        return float(text) if text in ("nan", "inf", "-inf") else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def write_json_atomic(path: Path, data: Any) -> None:
    """Write a record as strict JSON via a temporary file and a rename: readers never see half a file."""
    path = Path(path)
    # One temporary file per thread too: a session's two trials in turns record their start at once.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as f:
        f.write(dumps(data, indent=2))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
