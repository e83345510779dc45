"""The serving benchmark runs end to end (its figures are for the README, not for tests)."""
from __future__ import annotations

import pytest

from tests.inference_fixtures import run_script


@pytest.mark.slow
def test_bench_serve_prints_every_arm_and_the_ratios():
    res = run_script("scripts.bench_serve", "--tiny", "--rounds", "1", "--clients", "3", "--new-tokens", "5",
                     "--max-batch", "4", "--distinct-prompts", timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if line[:1].isdigit() and "tok/s" not in line and "random init" not in line]
    assert [r.split("  ")[0] for r in rows] == ["1 client", "3 clients at once", "3 one after another"]
    assert all(r.rstrip().endswith("yes") for r in rows)  # every request got its 5 tokens
    assert "3 at once / 1 client:" in res.stdout and "(target >= 5x)" in res.stdout
    assert "3 at once / 3 one after another:" in res.stdout
    assert "distinct prompts" in res.stdout and "with F.linear (MKL) instead of oneDNN" in res.stdout


def test_bench_serve_rejects_bad_options():
    res = run_script("scripts.bench_serve", "--clients", "0", timeout=120)
    assert res.returncode == 2 and "--clients" in res.stderr and "Traceback" not in res.stderr
