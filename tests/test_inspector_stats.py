"""Head statistics and detectors on hand-built heads of known type."""
import math

import numpy as np
import pytest

from inspector import synthetic
from inspector.stats import (THRESHOLDS, diagonal_score, entropy, head_stats, induction_score, label_head,
                             mean_distance, summary_scalars)

BLOCK = 16
DETECTOR = {"previous-token": "prev_token", "first-token": "first_token", "self": "self",
            "induction": "induction", "uniform": "entropy_norm"}


@pytest.fixture(scope="module")
def rows():
    w, _ = synthetic.synthetic_weights(BLOCK)
    # the same heads stand in for the repeated-random-block capture, as they were built on it
    return {synthetic.HEAD_TYPES[s["head"]]: s for s in head_stats(w, repeat_weights=w, block=BLOCK)}


def test_synthetic_heads_are_causal_distributions():
    w, ids = synthetic.synthetic_weights(BLOCK)
    assert w.shape == (1, 5, 2 * BLOCK, 2 * BLOCK) and len(ids) == 2 * BLOCK and ids[:BLOCK] == ids[BLOCK:]
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
    assert np.all(np.triu(w[0, :], k=1) == 0)


@pytest.mark.parametrize("head_type", synthetic.HEAD_TYPES)
def test_each_detector_fires_on_its_own_head_only(rows, head_type):
    key = DETECTOR[head_type]
    assert rows[head_type][key] >= 0.95, rows[head_type]
    threshold = THRESHOLDS[head_type][1]
    for other, row in rows.items():
        if other != head_type:
            assert row[key] < threshold, (head_type, other, row[key])


@pytest.mark.parametrize("head_type", synthetic.HEAD_TYPES)
def test_label_names_the_head_type(rows, head_type):
    assert rows[head_type]["label"] == head_type


def test_exact_values_on_small_patterns():
    T = 4
    uni = synthetic.uniform_head(T)
    h, h_norm = entropy(uni)
    assert h == pytest.approx(np.mean([math.log(2), math.log(3), math.log(4)]))
    assert h_norm == pytest.approx(1.0)
    # uniform over keys 0..i: expected distance i/2, mean over queries 1..3 = (0.5 + 1 + 1.5) / 3
    assert mean_distance(uni) == pytest.approx(1.0)
    assert mean_distance(synthetic.previous_token_head(T)) == pytest.approx(1.0)
    assert mean_distance(synthetic.self_head(T)) == pytest.approx(0.0)
    assert entropy(synthetic.self_head(T))[1] == pytest.approx(0.0)
    assert diagonal_score(uni, 1) == pytest.approx(np.mean([1 / 2, 1 / 3, 1 / 4]))


def test_induction_score_reads_the_right_diagonal():
    head = synthetic.induction_head(5)
    assert induction_score(head, 5) == pytest.approx(1.0)
    assert induction_score(synthetic.previous_token_head(10), 5) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="2\\*block"):
        induction_score(head, 6)


def test_rows_name_model_indices_and_are_json_ready():
    w, _ = synthetic.synthetic_weights(4)
    stats = head_stats(np.concatenate([w, w]), layers=[2, 5], heads=[0, 1, 3, 4, 7])
    assert [(s["layer"], s["head"]) for s in stats][:2] == [(2, 0), (2, 1)] and stats[-1]["head"] == 7
    assert all(s["induction"] is None for s in stats)  # no repeat capture given
    tiny = head_stats(np.ones((1, 1, 1, 1)))
    assert tiny[0]["entropy_norm"] is None and tiny[0]["label"] == "mixed"


def test_label_order_and_mixed():
    assert label_head({"induction": 0.5, "prev_token": 0.9}) == "induction"
    assert label_head({"prev_token": 0.49, "first_token": 0.3, "entropy_norm": 0.5}) == "mixed"
    assert label_head({"entropy_norm": float("nan")}) == "mixed"


def test_summary_scalars_pick_the_strongest_heads(rows):
    scalars = summary_scalars(list(rows.values()))
    assert scalars["attn/max_induction"] == pytest.approx(1.0)
    assert scalars["attn/max_prev_token"] == pytest.approx(1.0)
    assert 0 < scalars["attn/mean_entropy_norm"] < 1
