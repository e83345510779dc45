"""experiments.saturation: unscaled scores drive softmax one-hot as d_k grows; the 1/sqrt(d_k) scale does not."""
import pytest

from experiments import saturation as ablation


def test_saturation_without_the_scale_goes_one_hot():
    rows = ablation.softmax_saturation(dims=(16, 1024), n_keys=64, n_queries=500)
    small, big = rows
    assert big["max_weight_unscaled"] > 0.9  # scores of std 32: almost one-hot
    assert big["max_weight_scaled"] < 0.3  # std 1 over 64 keys: well spread
    assert big["entropy_scaled"] > 3 * big["entropy_unscaled"]
    assert big["jacobian_unscaled"] < 0.5 * big["jacobian_scaled"]  # and the gradient through softmax vanishes
    assert small["max_weight_unscaled"] < big["max_weight_unscaled"]  # worse as d_k grows
    assert abs(small["max_weight_scaled"] - big["max_weight_scaled"]) < 0.05  # the scale makes d_k irrelevant
    assert big["score_std"] == pytest.approx(32, rel=0.1)
