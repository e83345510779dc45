"""`json_safe`: NaN and infinities become None (null), so metrics.jsonl, results.json and head_stats.json stay strict
JSON that every reader accepts (Python's json writes NaN, which JavaScript's JSON.parse and jq refuse)."""
from __future__ import annotations

import math
from typing import Any


def json_safe(obj: Any) -> Any:
    """`obj` with every non-finite float, at any depth of dicts, lists and tuples, replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
