"""KV-cached decoding gives the logits of a full forward pass, step for step, also once the window slides."""
from __future__ import annotations

import pytest
import torch

from model.inference import (CachedDecoder, RecomputeDecoder, SamplingSettings, generate, make_generator,
                             stream_tokens)
from tests.inference_fixtures import tiny_model

STEPS = 200
pytestmark = pytest.mark.usefixtures("one_thread")


def expected_window(seq: torch.Tensor, block_size: int, shift: int, start: int) -> tuple[torch.Tensor, int]:
    """The context our policy promises, computed independently: slide by `shift` whenever the window overflows."""
    while seq.size(1) - start > block_size:
        start += shift
    return seq[:, start:], start


@pytest.mark.parametrize("arch, shift", [(dict(), 1), (dict(), 0), (dict(positions="rope", n_kv_head=2), 0),
                                         (dict(positions="sinusoidal"), 5),
                                         (dict(norm="rmsnorm", mlp="swiglu", qk_norm=True, n_kv_head=1), 0)])
def test_cached_logits_equal_a_full_forward_over_200_steps(arch, shift):
    """block_size 32 and 200 steps: the window slides many times (shift 1 = nanoGPT's crop to the last block)."""
    model = tiny_model(**arch)
    torch.manual_seed(1)
    prompt = torch.randint(0, 40, (2, 5))
    tokens = torch.randint(0, 40, (2, STEPS))  # teacher-forced: no greedy loop that could hide a drift
    dec = CachedDecoder(model, 2, shift=shift)
    step_shift = dec.shift
    logits = dec.prefill(prompt)
    seq, start, worst = prompt, 0, 0.0
    for i in range(STEPS):
        window, start = expected_window(seq, 32, step_shift, start)
        with torch.no_grad():
            full = model(window)[0][:, -1]
        worst = max(worst, (logits - full).abs().max().item())
        seq = torch.cat([seq, tokens[:, i:i + 1]], dim=1)
        logits = dec.step(tokens[:, i])
    assert seq.size(1) > 6 * 32 and start > 0  # the window really slid
    assert worst < 1e-5


def test_sliding_by_one_is_nanogpts_crop_to_the_last_block():
    model = tiny_model()
    prompt = torch.randint(0, 40, (1, 40))  # longer than block_size: only the last 32 are kept
    out = generate(model, prompt, 60, SamplingSettings(temperature=0), window_shift=1)
    seq = prompt
    with torch.no_grad():
        for _ in range(60):
            nxt = model(seq[:, -32:])[0][:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(out, seq)


def test_cached_and_recompute_decoders_generate_the_same_tokens():
    model = tiny_model()
    prompt = torch.randint(0, 40, (3, 6))
    s = SamplingSettings(temperature=0.9, top_k=20, top_p=0.9, repetition_penalty=1.2)
    a = generate(model, prompt, 120, s, seed=3, cached=True)
    b = generate(model, prompt, 120, s, seed=3, cached=False)
    assert a.shape == (3, 126) and torch.equal(a, b)


def test_rows_of_a_batch_decode_like_single_sequences():
    model = tiny_model()
    prompt = torch.randint(0, 40, (3, 6))
    greedy = SamplingSettings(temperature=0)
    batch = generate(model, prompt, 50, greedy)
    for row in range(3):
        assert torch.equal(batch[row], generate(model, prompt[row], 50, greedy)[0])


def test_same_seed_same_tokens_and_other_seeds_differ():
    model = tiny_model()
    prompt = [1, 2, 3]
    a = generate(model, prompt, 80, SamplingSettings(temperature=1.0), seed=11)
    b = generate(model, prompt, 80, SamplingSettings(temperature=1.0), seed=11)
    c = generate(model, prompt, 80, SamplingSettings(temperature=1.0), seed=12)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_temperature_zero_is_deterministic_and_greedy():
    model = tiny_model()
    a = generate(model, [5, 6], 40, SamplingSettings(temperature=0), seed=1)
    b = generate(model, [5, 6], 40, SamplingSettings(temperature=0), seed=2)
    assert torch.equal(a, b)
    seq = torch.tensor([[5, 6]])
    with torch.no_grad():
        for _ in range(40):
            seq = torch.cat([seq, model(seq[:, -32:])[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(a, seq)


def test_repetition_penalty_counts_the_prompt_and_changes_greedy_output():
    model = tiny_model()
    prompt = [3] * 8
    plain = generate(model, prompt, 30, SamplingSettings(temperature=0))[0, 8:].tolist()
    penalised = generate(model, prompt, 30, SamplingSettings(temperature=0, repetition_penalty=50.0))[0, 8:].tolist()
    assert 3 not in penalised[:1]  # the prompt's token is penalised from the first step on
    assert len(set(penalised)) > len(set(plain)) or plain != penalised


def test_stream_yields_one_token_per_step_and_stops_when_closed():
    model = tiny_model()
    calls = []
    dec_step = RecomputeDecoder.step

    def counting_step(self, token):
        calls.append(1)
        return dec_step(self, token)

    RecomputeDecoder.step = counting_step
    try:
        stream = stream_tokens(model, [1, 2], 100, generator=make_generator(0), cached=False)
        first = [next(stream) for _ in range(3)]
        stream.close()
    finally:
        RecomputeDecoder.step = dec_step
    assert [t.shape for t in first] == [torch.Size([1])] * 3
    assert len(calls) == 2  # the step after the last token taken is never computed


def test_vocab_limit_keeps_tokens_decodable():
    model = tiny_model()

    def favour_padding(module, args, logits):  # make the padded ids overwhelmingly likely
        return logits + torch.where(torch.arange(logits.size(-1)) >= 30, 100.0, 0.0)

    model.lm_head.register_forward_hook(favour_padding)
    unlimited = generate(model, [1], 50, SamplingSettings(temperature=1.0), seed=0)
    assert (unlimited[0, 1:] >= 30).all()  # without the limit, only padded ids come out
    out = generate(model, [1], 50, SamplingSettings(temperature=1.0), seed=0, vocab_limit=30)
    assert out.max().item() < 30


def test_zero_new_tokens_returns_the_prompt_and_bad_prompts_are_refused():
    model = tiny_model()
    assert generate(model, [1, 2], 0).tolist() == [[1, 2]]
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [], 5)
    with pytest.raises(ValueError, match="window_shift: 33 must lie in"):
        CachedDecoder(model, 1, shift=33)


def test_stream_checks_its_arguments_at_the_call_not_at_the_first_token():
    model = tiny_model()
    with pytest.raises(ValueError, match="temperature"):
        stream_tokens(model, [1, 2], 5, SamplingSettings(temperature=-1.0))  # no next(): the call itself refuses
    with pytest.raises(ValueError, match="at least one token"):
        stream_tokens(model, [], 5)


@pytest.mark.parametrize("finish", ["exhaust", "close"])
def test_stream_puts_the_model_back_in_its_mode(finish):
    model = tiny_model().train()
    stream = stream_tokens(model, [1, 2], 4, generator=make_generator(0))
    assert model.training  # nothing has run yet
    next(stream)
    assert not model.training  # decoding runs without dropout
    if finish == "close":
        stream.close()
    else:
        list(stream)
    assert model.training
    generate(model, [1, 2], 3, seed=0)
    assert model.training
