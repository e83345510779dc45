"""The HTTP API through the real `openai` client (and httpx for what a client library would not send)."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from model.inference import SamplingSettings, generate
from tests.inference_fixtures import TEXT
from tests.serve_fixtures import MODEL_NAME, TOK, live_server

openai = pytest.importorskip("openai")

PROMPT = "First Citizen:\n"
LIMITS = dict(max_tokens=200, max_batch=8, context=32)


@pytest.fixture(scope="module")
def server():
    with live_server() as (url, engine):
        yield url, engine


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy_text(engine, prompt: str, n: int) -> str:
    ids = TOK.encode(prompt)
    out = generate(engine.model, ids, n, SamplingSettings(temperature=0))[0, len(ids):].tolist()
    return TOK.decode(out)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    health = httpx.get(server[0] + "/health").json()
    assert health["status"] == "ok" and health["max_batch"] == 8 and health["context"] == 32


def test_completion_matches_the_single_stream_decoder(server, client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=40, temperature=0)
    (choice,) = r.choices
    assert choice.text == greedy_text(server[1], PROMPT, 40)  # 40 > block_size 32: the window slid
    assert choice.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(PROMPT), 40, 55)
    assert r.object == "text_completion" and r.model == MODEL_NAME and r.id.startswith("cmpl-")


def test_streaming_gives_the_same_text_and_ends_with_done(server, client):
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=25, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) >= 10  # it really streamed, token by token
    assert "".join(texts) == greedy_text(server[1], PROMPT, 25)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].usage.completion_tokens == 25
    raw = httpx.post(server[0] + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "stream": True},
                     timeout=60).text
    assert raw.rstrip().endswith("data: [DONE]")


def test_n_choices_list_prompts_and_seeds(client):
    r = client.completions.create(model=MODEL_NAME, prompt=[PROMPT, "All:\n"], n=3, max_tokens=12,
                                  temperature=1.0, seed=5)
    assert sorted(c.index for c in r.choices) == list(range(6))
    by_index = {c.index: c.text for c in r.choices}
    assert len(set(by_index[i] for i in range(3))) > 1  # the 3 choices of one prompt differ
    again = client.completions.create(model=MODEL_NAME, prompt=[PROMPT, "All:\n"], n=3, max_tokens=12,
                                      temperature=1.0, seed=5)
    assert {c.index: c.text for c in again.choices} == by_index  # same seed, same texts
    assert r.usage.completion_tokens == 6 * 12


def test_stop_strings(server, client):
    full = greedy_text(server[1], PROMPT, 30)
    stop = full[8:10]
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop, "QQ"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.index(stop)]
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=30, temperature=0,
                                            stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full[:full.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 6
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and logprob <= 0
        assert max(top.values()) == pytest.approx(logprob)  # greedy picks the most likely
        assert top[token] == pytest.approx(logprob)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3, stream=True)]
    assert [t for s in streamed for t in s.tokens] == lp.tokens
    assert [x for s in streamed for x in s.token_logprobs] == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_top_k_and_repetition_penalty_as_extra_fields(client):
    kw = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=20, temperature=0)
    plain = client.completions.create(**kw).choices[0].text
    penalised = client.completions.create(**kw, extra_body={"repetition_penalty": 5.0}).choices[0].text
    assert penalised != plain
    ones = client.completions.create(**{**kw, "temperature": 1.5}, extra_body={"top_k": 1}).choices[0].text
    assert ones == plain  # top_k 1 at any temperature is greedy


BAD = [
    (b"{not json", None, "not valid JSON"),
    (b"[1, 2]", None, "JSON object"),
    ({"max_tokens": 5}, "prompt", "missing"),
    ({"prompt": 5}, "prompt", "string"),
    ({"prompt": ["a", 3]}, "prompt", "string"),
    ({"prompt": "a", "max_tokens": "5"}, "max_tokens", "integer"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"prompt": "a", "max_tokens": 201}, "max_tokens", "limit of 200"),
    ({"prompt": "a", "temperature": -0.5}, "temperature", ">= 0"),
    ({"prompt": "a", "temperature": "hot"}, "temperature", "number"),
    ({"prompt": "a", "top_p": 0}, "top_p", "(0, 1]"),
    ({"prompt": "a", "top_p": 1.5}, "top_p", "(0, 1]"),
    ({"prompt": "a", "n": 0}, "n", ">= 1"),
    ({"prompt": "a", "n": 9}, "n", "max_batch"),
    ({"prompt": "a", "stop": 3}, "stop", "string"),
    ({"prompt": "a", "stream": "yes"}, "stream", "true or false"),
    ({"prompt": "a", "logprobs": 99}, "logprobs", "limit"),
    ({"prompt": "a", "top_k": -1}, "top_k", ">= 0"),
    ({"prompt": "a", "repetition_penalty": 0}, "repetition_penalty", "> 0"),
    ({"prompt": "a\u00e9\u4e2d"}, "prompt", "tokenized"),
    ({"prompt": "a" * 33}, "prompt", "at most 32"),
]


@pytest.mark.parametrize("body,param,words", BAD)
def test_bad_input_is_a_400_naming_the_field(server, body, param, words):
    url = server[0] + "/v1/completions"
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(url, headers={"Content-Type": "application/json"}, timeout=30, **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"] and err["type"] == "invalid_request_error"
    assert httpx.get(server[0] + "/health").json()["status"] == "ok"


def test_bad_input_through_the_client_raises_its_error(client):
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model=MODEL_NAME, prompt="a", top_p=2)


def test_api_key():
    with live_server(api_key="s3cret") as (url, _):
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model=MODEL_NAME, prompt="a", max_tokens=2).usage.completion_tokens == 2
        for key in ("wrong", ""):
            bad = openai.OpenAI(base_url=url + "/v1", api_key=key or "x", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
        r = httpx.post(url + "/v1/completions", json={"prompt": "a"})  # no header at all
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url + "/health").status_code == 200


def test_a_client_that_disconnects_frees_its_slot():
    with live_server(max_batch=1, max_tokens=100_000) as (url, engine):
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"prompt": PROMPT, "max_tokens": 100_000, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break  # one token arrived: the request holds the only slot
        # a second request gets the slot once the engine has seen the disconnect
        r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}, timeout=60)
        assert r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.slow
def test_load_32_requests_from_16_clients(server):
    """Every request completes with the right number of tokens, exactly once, and the server stays healthy."""
    url, engine = server
    results: dict[int, dict] = {}
    errors: list[str] = []
    lock = threading.Lock()
    jobs = list(range(32))

    def client_thread():
        with httpx.Client(timeout=120) as http:
            while True:
                with lock:
                    if not jobs:
                        return
                    i = jobs.pop()
                n = 5 + i % 11
                body = {"prompt": TEXT[i:i + 3 + i % 7], "max_tokens": n, "temperature": 0.9, "seed": i,
                        "stream": i % 2 == 0}
                try:
                    r = http.post(url + "/v1/completions", json=body)
                    r.raise_for_status()
                    if body["stream"]:
                        events = [json.loads(line[6:]) for line in r.text.splitlines()
                                  if line.startswith("data: {")]
                        got = {"tokens": len(events), "ids": {e["id"] for e in events},
                               "finish": events[-1]["choices"][0]["finish_reason"], "done": "[DONE]" in r.text}
                    else:
                        j = r.json()
                        got = {"tokens": j["usage"]["completion_tokens"], "ids": {j["id"]},
                               "finish": j["choices"][0]["finish_reason"], "done": True}
                    with lock:
                        assert i not in results
                        results[i] = {**got, "want": n}
                except Exception as e:  # noqa: BLE001 - reported below
                    with lock:
                        errors.append(f"{i}: {e!r}")

    start = time.monotonic()
    threads = [threading.Thread(target=client_thread) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "the load test did not finish in time"
    assert not errors, errors
    assert sorted(results) == list(range(32))
    for i, r in results.items():
        # a chunk per token (char vocabulary: every token shows text), or the usage count
        assert r["tokens"] == r["want"] and r["finish"] == "length" and r["done"], (i, r)
    assert len(set().union(*(r["ids"] for r in results.values()))) == 32  # no two requests shared a response
    assert time.monotonic() - start < 240
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok" and health["running"] == 0 and health["waiting"] == 0


def test_attention_endpoint(server):
    url = server[0] + "/api/attention"
    r = httpx.post(url, json={"prompt": PROMPT, "token_ids": TOK.encode("Bef")}, timeout=60)
    a = r.json()
    assert r.status_code == 200 and a["tokens"] == list(PROMPT + "Bef")
    assert (a["n_layer"], a["n_head"]) == (2, 4) and len(a["weights"][1][3]) == len(PROMPT) + 3
    assert all(abs(sum(head) - 1) < 1e-2 for layer in a["weights"] for head in layer)
    assert [(h["layer"], h["head"]) for h in a["heads"]] == [(i, j) for i in range(2) for j in range(4)]
    assert all(h["label"] for h in a["heads"])
    for body, param in [({"prompt": PROMPT, "token_ids": [999]}, "token_ids"), ({"token_ids": []}, "prompt"),
                        ({"prompt": "\u4e2d"}, "prompt")]:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
