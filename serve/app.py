"""The HTTP layer: FastAPI routes that turn OpenAI-shaped requests into engine requests and engine events into
JSON or server-sent events. No model logic lives here (see serve/engine.py).

Routes: GET /health, GET /v1/models, POST /v1/completions, GET / (the page), POST /api/attention (the page's
"why this token?": attention of the position that produced a token, captured only when asked).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import AsyncIterator

from fastapi import Depends, FastAPI, Header, Request as HTTPRequest
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from serve.attention import attention_of
from serve.engine import Engine, Event, Request
from serve.page import render_page
from serve.protocol import (BadRequest, CompletionParams, Limits, Logprobs, completion_id, encode_prompt, envelope,
                            parse_completion, usage)


def error_response(e: BadRequest) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def read_json(request: HTTPRequest) -> object:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(None, f"the request body is not valid JSON ({e})") from None


class Choice:
    """One engine request seen from the HTTP side: its events arrive on the event loop's queue."""

    def __init__(self, index: int, tokenizer, logprobs: bool):
        self.index = index
        self.text, self.tokens, self.finish_reason = "", 0, None
        self.logprobs = Logprobs(tokenizer) if logprobs else None

    def add(self, event: Event) -> str:
        """Fold in one event; return its text."""
        self.text += event.text
        self.tokens = event.completion_tokens or self.tokens
        self.finish_reason = event.finish_reason
        if self.logprobs is not None and event.token_id is not None:
            self.logprobs.add(event.token_id, event.logprob, event.top)
        return event.text

    def json(self, text: str) -> dict:
        """The choice object with `text`, and the log-probabilities gathered since the last call."""
        return {"index": self.index, "text": text, "finish_reason": self.finish_reason,
                "logprobs": self.logprobs.take() if self.logprobs is not None else None}


def create_app(engine: Engine, model_name: str, api_key: str | None = None, max_tokens: int = 2048) -> FastAPI:
    app = FastAPI(title="attngpt", docs_url=None, redoc_url=None, openapi_url=None)
    tokenizer = engine.tokenizer
    limits = Limits(max_batch=engine.max_batch, max_tokens=max_tokens, context=engine.block_size)
    created = int(time.time())
    page, csp = render_page()

    @app.exception_handler(BadRequest)
    async def bad_request(request: HTTPRequest, e: BadRequest) -> JSONResponse:
        return error_response(e)

    def check_key(authorization: str = Header(default="")) -> None:
        if api_key and not hmac.compare_digest(authorization.encode(), f"Bearer {api_key}".encode()):
            raise BadRequest(None, "missing or wrong API key: send the header Authorization: Bearer KEY",
                             status=401, code="invalid_api_key")

    keyed = [Depends(check_key)]

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_name, "auth": bool(api_key), "context": engine.block_size,
                "max_tokens": max_tokens, **engine.stats()}

    @app.get("/v1/models", dependencies=keyed)
    async def models() -> dict:
        return {"object": "list",
                "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "attngpt"}]}

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(page, headers={"Content-Security-Policy": csp})

    @app.post("/api/attention", dependencies=keyed)
    async def attention(request: HTTPRequest) -> JSONResponse:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise BadRequest("prompt", "prompt: expected a string")
        ids = body.get("token_ids", [])
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                and 0 <= i < engine.vocab for i in ids):
            raise BadRequest("token_ids", f"token_ids: expected a list of token ids in [0, {engine.vocab})")
        context = encode_prompt(tokenizer, body["prompt"], limits) + ids
        try:
            future = engine.call(lambda: attention_of(engine.model, tokenizer, context[-engine.block_size:]))
            return JSONResponse(await asyncio.wrap_future(future))
        except RuntimeError as e:  # shutting down
            raise BadRequest(None, str(e), status=503) from None

    @app.post("/v1/completions", dependencies=keyed)
    async def completions(request: HTTPRequest):
        params = parse_completion(await read_json(request), limits)
        prompt_ids = [encode_prompt(tokenizer, text, limits) for text in params.prompts]
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        choices, reqs = [], []
        for ids in prompt_ids:
            for j in range(params.n):
                choice = Choice(len(choices), tokenizer, params.logprobs is not None)
                seed = None if params.seed is None else params.seed + j  # n choices of one seed differ
                reqs.append(Request(ids, params.max_tokens, _emitter(loop, queue, choice), params.settings, seed,
                                    params.stop, params.logprobs))
                choices.append(choice)
        try:
            for req in reqs:
                engine.submit(req)
        except RuntimeError as e:  # shutting down
            raise BadRequest(None, str(e), status=503) from None
        cid, prompt_tokens = completion_id(), sum(len(ids) for ids in prompt_ids)
        events = _events(queue, reqs, len(choices))
        if params.stream:
            return StreamingResponse(_sse(events, cid, model_name, params, prompt_tokens, choices),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            async for choice, event in events:
                choice.add(event)
        finally:
            await events.aclose()
        body = envelope(cid, model_name, [c.json(c.text) for c in choices])
        body["usage"] = usage(prompt_tokens, sum(c.tokens for c in choices))
        return JSONResponse(body)

    return app


def _emitter(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, choice: Choice):
    def emit(event: Event) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (choice, event))
        except RuntimeError:  # the event loop is gone (server stopped): nobody is listening
            pass
    return emit


async def _events(queue: asyncio.Queue, reqs: list[Request], count: int) -> AsyncIterator[tuple[Choice, Event]]:
    """Every choice's events until each has finished; leaving early (a client that went away) cancels the rest."""
    left = count
    try:
        while left:
            choice, event = await queue.get()
            if choice.finish_reason is not None:
                continue  # an abort after the last event (a failed step): already finished
            left -= event.finish_reason is not None
            yield choice, event
    finally:
        for req in reqs:
            req.cancelled = True  # finished rows are already gone; running ones are freed at the next step


async def _sse(events: AsyncIterator[tuple[Choice, Event]], cid: str, model: str, params: CompletionParams,
               prompt_tokens: int, choices: list[Choice]) -> AsyncIterator[str]:
    created = int(time.time())
    try:
        async for choice, event in events:
            text = choice.add(event)
            if text or event.finish_reason or (choice.logprobs is not None and event.token_id is not None):
                yield f"data: {json.dumps(envelope(cid, model, [choice.json(text)], created))}\n\n"
        if params.include_usage:
            tail = envelope(cid, model, [], created)
            tail["usage"] = usage(prompt_tokens, sum(c.tokens for c in choices))
            yield f"data: {json.dumps(tail)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        await events.aclose()
