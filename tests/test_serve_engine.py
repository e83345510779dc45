"""The continuous-batching engine: batch-invariant tokens, per-row settings and seeds, slots freed and reused."""
from __future__ import annotations

import queue
import time

import pytest
import torch

from data.tokenizers import CharTokenizer
from model.inference import SamplingSettings, generate, make_generator, stream_tokens
from serve.engine import Engine, Request
from tests.inference_fixtures import TEXT, tiny_model

TOK = CharTokenizer.from_text(TEXT)
GREEDY = SamplingSettings(temperature=0)
LENGTHS = [3, 7, 12, 1, 20, 30, 5, 9]  # block_size is 32: with 70 new tokens every row slides, at its own times
PROMPTS = [TOK.encode(TEXT[10 * i:10 * i + n]) for i, n in enumerate(LENGTHS)]


class Collector:
    """A request's events, gathered from the engine thread."""

    def __init__(self):
        self.q: queue.Queue = queue.Queue()

    def events(self, timeout: float = 60.0) -> list:
        out, deadline = [], time.monotonic() + timeout
        while True:
            e = self.q.get(timeout=max(0.1, deadline - time.monotonic()))
            out.append(e)
            if e.finish_reason:
                return out


def submit_all(engine: Engine, requests: list[dict]) -> list[Collector]:
    """Submit every request from the engine thread itself, so they are all waiting at the same next step."""
    collectors = [Collector() for _ in requests]
    reqs = [Request(emit=c.q.put, **r) for c, r in zip(collectors, requests)]
    engine.call(lambda: [engine.submit(r) for r in reqs]).result(timeout=30)
    return collectors


def tokens(collector: Collector) -> list[int]:
    return [e.token_id for e in collector.events() if e.token_id is not None]


@pytest.fixture(params=["learned", "rope"])
def engine(request):
    model = tiny_model(0, vocab_size=TOK.vocab_size, block_size=32, positions=request.param)
    eng = Engine(model, TOK, max_batch=8)
    yield eng
    eng.shutdown()


def test_greedy_tokens_are_the_same_alone_and_beside_seven_others(engine):
    batch = [tokens(c) for c in submit_all(engine, [dict(prompt_ids=p, max_new_tokens=70, settings=GREEDY)
                                                    for p in PROMPTS])]
    for prompt, together in zip(PROMPTS, batch):
        alone = tokens(submit_all(engine, [dict(prompt_ids=prompt, max_new_tokens=70, settings=GREEDY)])[0])
        reference = generate(engine.model, prompt, 70, GREEDY)[0, len(prompt):].tolist()  # sliding window too
        assert len(together) == 70
        assert together == alone == reference, f"prompt of {len(prompt)} tokens"
    assert len({tuple(t) for t in batch}) > 4  # the rows really are different sequences


def test_one_batched_forward_per_step(engine):
    before = engine.steps
    done = submit_all(engine, [dict(prompt_ids=p, max_new_tokens=10, settings=GREEDY) for p in PROMPTS])
    assert all(len(tokens(c)) == 10 for c in done)
    assert engine.steps - before == 9  # the first token comes from the prefill, the other 9 from 9 shared steps


def test_each_request_keeps_its_settings_and_seed(engine):
    hot = SamplingSettings(temperature=1.5, top_k=20, top_p=0.95, repetition_penalty=1.3)
    reqs = [dict(prompt_ids=PROMPTS[0], max_new_tokens=40, settings=hot, seed=7),
            dict(prompt_ids=PROMPTS[0], max_new_tokens=40, settings=hot, seed=8),
            dict(prompt_ids=PROMPTS[1], max_new_tokens=40, settings=GREEDY)]
    a, b, greedy = (tokens(c) for c in submit_all(engine, reqs))
    alone = tokens(submit_all(engine, [reqs[0]])[0])
    # the single-stream decoder with the same settings and seed draws the same tokens
    ref = [int(t) for t in stream_tokens(engine.model, PROMPTS[0], 40, hot, generator=make_generator(7),
                                         vocab_limit=TOK.vocab_size)]
    assert a == alone == ref
    assert a != b
    assert greedy == generate(engine.model, PROMPTS[1], 40, GREEDY)[0, len(PROMPTS[1]):].tolist()


def test_a_cancelled_request_frees_its_slot_at_the_next_step():
    model = tiny_model(0, vocab_size=TOK.vocab_size, block_size=32)
    engine = Engine(model, TOK, max_batch=1)
    try:
        first, second = Collector(), Collector()
        long = Request(PROMPTS[0], 100_000, first.q.put, GREEDY)
        engine.submit(long)
        first.q.get(timeout=30)  # it is running
        engine.submit(Request(PROMPTS[1], 5, second.q.put, GREEDY))
        assert engine.stats()["waiting"] == 1  # the only slot is taken
        long.cancelled = True
        events = second.events(timeout=30)
        assert [e.finish_reason for e in events][-1] == "length" and len(events) == 5
        deadline = time.monotonic() + 10  # the row is retired just after its last event is sent
        while engine.stats()["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.stats() == {"running": 0, "waiting": 0, "max_batch": 1}
    finally:
        engine.shutdown()


def test_finish_reasons_and_shutdown_ends_streams_with_abort():
    model = tiny_model(0, vocab_size=TOK.vocab_size, block_size=32)
    engine = Engine(model, TOK, max_batch=2)
    greedy_text = "".join(TOK.decode([t]) for t in
                          generate(model, PROMPTS[2], 12, GREEDY)[0, len(PROMPTS[2]):].tolist())
    stop = greedy_text[5:7]  # a stop string that greedy decoding reaches after a few tokens
    stopped, endless = Collector(), Collector()
    engine.submit(Request(PROMPTS[2], 12, stopped.q.put, GREEDY, stop=[stop]))
    events = stopped.events()
    assert events[-1].finish_reason == "stop"
    assert "".join(e.text for e in events) == greedy_text[:greedy_text.index(stop)]
    engine.submit(Request(PROMPTS[0], 100_000, endless.q.put, GREEDY))
    endless.q.get(timeout=30)
    engine.shutdown()
    events = endless.events(timeout=30)
    assert events[-1].finish_reason == "abort" and events[-1].completion_tokens >= 1
    with pytest.raises(RuntimeError, match="shutting down"):
        engine.submit(Request(PROMPTS[0], 1, endless.q.put))


def test_logprobs_are_the_model_distribution():
    model = tiny_model(0, vocab_size=TOK.vocab_size, block_size=32)
    engine = Engine(model, TOK, max_batch=2)
    try:
        c = submit_all(engine, [dict(prompt_ids=PROMPTS[4], max_new_tokens=1, settings=GREEDY, top_logprobs=5)])[0]
        (event,) = c.events()
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([PROMPTS[4]]))[0][0, -1].float(), -1)
        ids = logp.topk(5).indices.tolist()
        assert [i for i, _ in event.top] == ids and event.token_id == ids[0]
        assert event.logprob == pytest.approx(float(logp[ids[0]]), abs=1e-4)
    finally:
        engine.shutdown()


def test_requests_that_join_and_leave_mid_run_change_nobody_s_tokens(engine):
    """Continuous batching: rows join while others are halfway and leave at different times."""
    first = Collector()
    engine.submit(Request(PROMPTS[0], 60, first.q.put, GREEDY))
    early = [first.q.get(timeout=30) for _ in range(10)]  # the first request is 10 tokens in
    late = [Collector() for _ in PROMPTS[1:]]
    for c, prompt, n in zip(late, PROMPTS[1:], range(5, 40, 5)):
        engine.submit(Request(prompt, n, c.q.put, GREEDY))
    got = [e.token_id for e in early + first.events()]
    assert got == generate(engine.model, PROMPTS[0], 60, GREEDY)[0, len(PROMPTS[0]):].tolist()
    for c, prompt, n in zip(late, PROMPTS[1:], range(5, 40, 5)):
        assert tokens(c) == generate(engine.model, prompt, n, GREEDY)[0, len(prompt):].tolist()


def test_requests_sharing_a_prompt_are_prefilled_once_and_decode_as_alone(engine):
    """Equal prompts in one admission (clients with the same prompt, the n choices of a request) run through the
    model once and share that cache row; every row then decodes exactly as it would alone."""
    shapes = []
    handle = engine.model.register_forward_pre_hook(lambda _, args, kwargs: shapes.append(tuple(args[0].shape)),
                                                    with_kwargs=True)
    try:
        reqs = [dict(prompt_ids=PROMPTS[p], max_new_tokens=20, settings=GREEDY) for p in (1, 3, 1, 1, 3)]  # 7 and 1 tokens: no slide in 20 steps
        reqs.append(dict(prompt_ids=PROMPTS[1], max_new_tokens=20, settings=SamplingSettings(top_k=5), seed=3))
        got = [tokens(c) for c in submit_all(engine, reqs)]
    finally:
        handle.remove()
    assert shapes[0] == (2, len(PROMPTS[1]))  # the admission's prefill: two distinct prompts, padded to the longest
    assert shapes[1:] == [(6, 1)] * 19  # then one batched step per token for the six rows
    for r, out in zip(reqs, got):
        if r["settings"] is GREEDY:
            assert out == generate(engine.model, r["prompt_ids"], 20, GREEDY)[0, len(r["prompt_ids"]):].tolist()
    sampled = [int(t) for t in stream_tokens(engine.model, PROMPTS[1], 20, reqs[-1]["settings"],
                                             generator=make_generator(3), vocab_limit=TOK.vocab_size)]
    assert got[-1] == sampled


def test_a_request_arriving_during_a_prefill_is_admitted_before_the_next_decode_step(engine):
    """Prefill first: a newcomer waits for the prefill under way, not also for a decode step of the running rows."""
    late, shapes = Collector(), []

    def arrive(_, args):
        shapes.append(tuple(args[0].shape))
        if len(shapes) == 1:  # the first request's prefill is running: the second one comes in now
            engine.submit(Request(PROMPTS[2], 5, late.q.put, GREEDY))

    handle = engine.model.register_forward_pre_hook(arrive)
    try:
        first = submit_all(engine, [dict(prompt_ids=PROMPTS[1], max_new_tokens=5, settings=GREEDY)])[0]
        got = tokens(first), tokens(late)
    finally:
        handle.remove()
    assert shapes[:3] == [(1, len(PROMPTS[1])), (1, len(PROMPTS[2])), (2, 1)]  # prefill, prefill, then one step
    for prompt, out in zip((PROMPTS[1], PROMPTS[2]), got):
        assert out == generate(engine.model, prompt, 5, GREEDY)[0, len(prompt):].tolist()
