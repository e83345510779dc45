"""data.json_safe: non-finite floats become null at any depth, so the files parse as strict JSON."""
from __future__ import annotations

import json
import math

from data.json_safe import json_safe


def test_non_finite_floats_become_null_at_any_depth_and_the_rest_is_kept():
    record = {"loss": math.nan, "best": math.inf, "ok": 1.5, "n": 3, "name": "x",
              "rows": [(-math.inf, 2.0), {"deep": [math.nan]}], "flag": True, "none": None}
    safe = json_safe(record)
    assert safe == {"loss": None, "best": None, "ok": 1.5, "n": 3, "name": "x",
                    "rows": [[None, 2.0], {"deep": [None]}], "flag": True, "none": None}
    text = json.dumps(safe, allow_nan=False)  # strict JSON: raises if any NaN or Infinity were left
    assert json.loads(text) == safe
    assert math.isnan(record["loss"])  # the input is not changed in place
