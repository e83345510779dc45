"""The decoding benchmark runs and its decoders agree (the numbers themselves are for the README, not for tests)."""
from __future__ import annotations

import pytest

from tests.inference_fixtures import run_script


@pytest.mark.slow
def test_bench_decode_prints_all_decoders_and_they_agree():
    pytest.importorskip("transformers")
    res = run_script("scripts.bench_decode", "--new-tokens", "3", "--threads", "1", "--skip-sampling", "--rounds", "2",
                     timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith(("attngpt", "transformers"))]
    assert [r.split(",")[0] for r in rows] == ["attngpt cached", "attngpt full recompute", "transformers generate()"]
    assert all(r.rstrip().endswith("yes") for r in rows)  # greedy: every decoder produced the same tokens
    floor = [line for line in res.stdout.splitlines() if line.startswith("floor")]
    assert len(floor) == 1 and "GB/s" in floor[0]
    assert "cached greedy decode / transformers generate(): " in res.stdout and "x at 3" in res.stdout


def test_bench_decode_rejects_bad_rounds():
    res = run_script("scripts.bench_decode", "--rounds", "0", timeout=120)
    assert res.returncode == 2 and "--rounds" in res.stderr and "Traceback" not in res.stderr
