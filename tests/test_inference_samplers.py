"""The samplers follow Hugging Face transformers' logits processors of the same names.

Semantics written out (and then checked against transformers itself when it is installed):
- repetition penalty (CTRL): for each token already in the context, a positive logit is divided by the penalty and a
  negative one multiplied by it; each distinct token is penalised once, however often it occurred; prompt included.
- temperature: logits / T; T = 0 means greedy argmax.
- top-k: every logit below the k-th largest becomes -inf (ties with the k-th survive); k = 0 is off.
- top-p: keep the smallest set of most likely tokens whose total probability reaches p; always at least one token.
- order: repetition penalty on the raw logits, then temperature, then top-k, then top-p.
"""
from __future__ import annotations

import math

import pytest
import torch

from model.param_error import ParamError
from model.inference import (NUCLEUS_CANDIDATES, SamplingSettings, apply_repetition_penalty, check_max_new_tokens,
                             draw, process_logits, sample_next, sampling_logits, top_k_filter, top_p_filter)

NEG = float("-inf")


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.0]])
    seen = torch.tensor([[True, True, False, False, True]])
    out = apply_repetition_penalty(logits, seen, 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0, -1.0, 0.0]]
    # a penalty below 1 rewards repetition the same way round
    assert apply_repetition_penalty(logits, seen, 0.5).tolist() == [[4.0, -1.0, 1.0, -1.0, 0.0]]


def test_top_k_keeps_the_k_largest_and_ties_with_the_kth():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.0]])
    assert top_k_filter(logits, 3).tolist() == [[NEG, 3.0, 2.0, 3.0, NEG]]
    assert top_k_filter(logits, 1).tolist() == [[NEG, 3.0, NEG, 3.0, NEG]]  # the tie survives
    assert torch.equal(top_k_filter(logits, 0), logits)  # 0 = off
    assert torch.equal(top_k_filter(logits, 99), logits)


@pytest.mark.parametrize("p, kept", [(0.75, [0, 1]), (0.85, [0, 1, 2]), (0.1, [0]), (0.49, [0]), (0.51, [0, 1]),
                                     (1.0, [0, 1, 2, 3])])
def test_top_p_keeps_the_smallest_set_reaching_p(p, kept):
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = top_p_filter(probs.log(), p)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == kept


def test_top_p_always_keeps_the_most_likely_token():
    logits = torch.tensor([[0.0, 0.0, 10.0, 0.0]])
    out = top_p_filter(logits, 1e-9)
    assert torch.isfinite(out).tolist() == [[False, False, True, False]]


def test_order_is_penalty_then_temperature_then_top_k_then_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, -1.0]])
    seen = torch.tensor([[True, False, False, False]])
    s = SamplingSettings(temperature=2.0, top_k=2, top_p=1.0, repetition_penalty=4.0)
    # penalty first: 4 -> 1, so token 0 falls out of the top 2; then / 2
    assert process_logits(logits, s, seen).tolist() == [[NEG, 1.5, 1.0, NEG]]


def test_temperature_zero_is_greedy_even_with_a_generator():
    logits = torch.randn(3, 50)
    g = torch.Generator().manual_seed(1)
    out = sample_next(logits, SamplingSettings(temperature=0.0, top_k=5), generator=g)
    assert torch.equal(out, logits.argmax(-1))


def _reference_chain(logits, settings, seen):
    """The chain written out the slow way, every rule over the whole vocabulary."""
    out = apply_repetition_penalty(logits.float(), seen, settings.repetition_penalty)
    if settings.temperature == 0:
        return out
    return top_p_filter(top_k_filter(out / settings.temperature, settings.top_k), settings.top_p)


# each one takes another path through sampling_logits: top-k candidates, the nucleus among the top
# NUCLEUS_CANDIDATES, the nucleus beyond them (a flat distribution), the whole vocabulary, greedy
PATHS = [(SamplingSettings(1.3, 40, 0.8), 4.0, "candidates"), (SamplingSettings(0.7, 0, 0.5), 4.0, "candidates"),
         (SamplingSettings(1.0, 0, 0.95, 1.5), 4.0, "candidates"), (SamplingSettings(1.0, 0, 0.9), 0.1, "whole"),
         (SamplingSettings(2.0), 4.0, "whole"), (SamplingSettings(1.0, 0, 0.999), 4.0, "whole"),
         (SamplingSettings(0.0, 5, 0.5, 1.2), 4.0, "whole")]


@pytest.mark.parametrize("settings, scale, path", PATHS)
def test_every_path_of_the_chain_gives_the_reference_distribution(settings, scale, path):
    torch.manual_seed(0)
    logits = torch.randn(3, 1000) * scale
    seen = torch.rand(3, 1000) < 0.1
    values, ids = sampling_logits(logits, settings, seen)
    assert (ids is not None) == (path == "candidates")
    assert ids is None or values.size(-1) in (settings.top_k, NUCLEUS_CANDIDATES)
    ref = _reference_chain(logits, settings, seen)
    ours = process_logits(logits, settings, seen)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(ref))  # the same tokens survive
    assert torch.allclose(torch.softmax(ours, -1), torch.softmax(ref, -1), atol=1e-6)


def test_a_tie_with_the_kth_logit_keeps_the_tied_tokens_as_hf_does():
    logits = torch.tensor([[5.0, 1.0, 3.0, 3.0, 0.0, 3.0]])
    kept = torch.isfinite(process_logits(logits, SamplingSettings(1.0, 2))).nonzero()[:, 1].tolist()
    assert kept == [0, 2, 3, 5]
    draws = {int(sample_next(logits, SamplingSettings(1.0, 2), generator=g)) for g in
             [torch.Generator().manual_seed(0)] for _ in range(300)}
    assert draws == {0, 2, 3, 5}


def test_samples_come_only_from_the_kept_tokens():
    torch.manual_seed(3)
    logits = torch.randn(4, 500) * 3
    s = SamplingSettings(0.9, 0, 0.6)
    kept = torch.isfinite(process_logits(logits, s))
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        token = sample_next(logits, s, generator=g)
        assert kept[torch.arange(4), token].all()


def test_draw_matches_the_probabilities_and_never_picks_zero():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3, 0.0]])
    g = torch.Generator().manual_seed(0)
    picks = torch.stack([draw(probs, g) for _ in range(20000)]).flatten()
    freq = torch.bincount(picks, minlength=5).float() / picks.numel()
    assert freq[1] == 0 and freq[4] == 0
    assert torch.allclose(freq, probs[0], atol=0.015)


def test_same_generator_seed_gives_the_same_draws():
    logits = torch.randn(2, 300)
    s = SamplingSettings(1.0, 0, 0.9)
    a = [sample_next(logits, s, generator=g).tolist() for g in [torch.Generator().manual_seed(7)] for _ in range(20)]
    b = [sample_next(logits, s, generator=g).tolist() for g in [torch.Generator().manual_seed(7)] for _ in range(20)]
    assert a == b


@pytest.mark.parametrize("kwargs, param", [({"temperature": -0.1}, "temperature"), ({"top_k": -1}, "top_k"),
                                           ({"top_p": 0.0}, "top_p"), ({"top_p": 1.01}, "top_p"),
                                           ({"repetition_penalty": 0.0}, "repetition_penalty"),
                                           ({"temperature": math.nan}, "temperature")])
def test_bad_settings_name_the_parameter(kwargs, param):
    with pytest.raises(ParamError, match=f"^{param}: ") as e:
        SamplingSettings(**kwargs).validate()
    assert e.value.param == param and "--" not in str(e.value)


def test_max_new_tokens_bounds():
    check_max_new_tokens(0)
    for bad in (-1, 10**9):
        with pytest.raises(ParamError, match="^max_new_tokens: "):
            check_max_new_tokens(bad)


# --- against transformers itself -------------------------------------------------------------------------------------

def _hf():
    return pytest.importorskip("transformers.generation.logits_process")


def test_repetition_penalty_equals_transformers():
    lp = _hf()
    torch.manual_seed(0)
    scores = torch.randn(2, 100) * 3
    input_ids = torch.randint(0, 100, (2, 30))  # with repeats: HF penalises each token once
    seen = torch.zeros(2, 100, dtype=torch.bool).scatter_(1, input_ids, True)
    expected = lp.RepetitionPenaltyLogitsProcessor(1.7)(input_ids, scores.clone())
    assert torch.equal(apply_repetition_penalty(scores, seen, 1.7), expected)


@pytest.mark.parametrize("k", [1, 5, 50])
def test_top_k_equals_transformers(k):
    lp = _hf()
    scores = torch.randn(3, 200)
    scores[0, :4] = 5.0  # ties
    assert torch.equal(top_k_filter(scores, k), lp.TopKLogitsWarper(k)(None, scores.clone()))


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.99])
def test_top_p_equals_transformers(p):
    lp = _hf()
    torch.manual_seed(1)
    scores = torch.randn(3, 500) * 2
    assert torch.equal(top_p_filter(scores, p), lp.TopPLogitsWarper(p)(None, scores.clone()))


@pytest.mark.parametrize("top_k, top_p, scale", [(60, 0.8, 2.0), (0, 0.8, 4.0), (0, 0.8, 0.1), (0, 1.0, 2.0)])
def test_whole_chain_equals_transformers(top_k, top_p, scale):
    """Through the top-k candidates, the nucleus candidates, the nucleus beyond them, and temperature alone."""
    lp = _hf()
    torch.manual_seed(2)
    scores = torch.randn(2, 3000) * scale
    input_ids = torch.randint(0, 3000, (2, 40))
    seen = torch.zeros(2, 3000, dtype=torch.bool).scatter_(1, input_ids, True)
    chain = lp.LogitsProcessorList([lp.RepetitionPenaltyLogitsProcessor(1.3), lp.TemperatureLogitsWarper(0.7)]
                                   + ([lp.TopKLogitsWarper(top_k)] if top_k else [])
                                   + ([lp.TopPLogitsWarper(top_p)] if top_p < 1 else []))
    ours = process_logits(scores, SamplingSettings(0.7, top_k, top_p, 1.3), seen)
    hf = chain(input_ids, scores.clone())
    assert torch.equal(torch.isfinite(ours), torch.isfinite(hf))
    assert torch.allclose(ours[torch.isfinite(ours)], hf[torch.isfinite(hf)])
