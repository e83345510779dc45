"""experiments.attention_cost: the two paths agree, the explicit one holds the [B, H, T, T] scores, and the CPU
memory meter counts what is alive at once. No timing assertions: speed lives in the benchmark's output."""
import pytest
import torch

from experiments import attention_cost as ablation


@pytest.mark.parametrize("backward", [True, False])
def test_cost_rows_hold_agreeing_paths_and_the_quadratic_term(backward):
    rows = ablation.attention_cost(lengths=(16, 256), heads=2, head_dim=8, batch=1, backward=backward, repeats=1,
                                   min_seconds=0.0)
    assert [r["T"] for r in rows] == [16, 256]
    for r in rows:
        assert r["max_abs_diff"] < 1e-5
        assert r["explicit_ms"] > 0 and r["fused_ms"] > 0
        assert r["score_bytes"] == 2 * r["T"] ** 2 * 4
        assert r["explicit_peak_bytes"] >= r["score_bytes"]  # the explicit path materialises [B, H, T, T]
    assert rows[-1]["fused_peak_bytes"] < rows[-1]["score_bytes"]  # the fused one never does


def test_cost_refuses_paths_that_disagree(monkeypatch):
    monkeypatch.setattr(ablation, "fused_attention", lambda Q, K, V, causal: V * 1.01)
    with pytest.raises(RuntimeError, match="disagree"):
        ablation.attention_cost(lengths=(8,), heads=1, head_dim=4, repeats=1, backward=False)


def test_cpu_peak_bytes_counts_what_is_alive_at_once():
    def work():
        a = torch.ones(250_000)  # 1 MB
        b = torch.ones(500_000)  # 2 MB, while a is alive: the peak
        del a
        c = b * 2  # 2 MB more after a was freed: 4 MB
        del b
        return c.sum()

    assert ablation.cpu_peak_bytes(work) == pytest.approx(4_000_000, rel=0.01)
    assert ablation.cpu_peak_bytes(lambda: torch.ones(10).view(2, 5).t().sum()) < 1000  # views are free
