"""OpenAI's completion request and response shapes, checked field by field.

Every bad field raises `BadRequest` naming it (the HTTP layer turns it into a 400 with an OpenAI-style error
object). Sampling values are checked by `SamplingSettings.validate`, so they mean exactly what they mean in
`scripts.sample`; the parameter its ParamError names is the JSON field of the same name.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from model.inference import SamplingSettings
from model.param_error import ParamError
from model.text_stream import encode_prompt as prompt_ids

MAX_LOGPROBS = 20  # alternatives per token; OpenAI allows 5


class BadRequest(ValueError):
    def __init__(self, param: str | None, message: str, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.message, self.status, self.code = param, message, status, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass
class Limits:
    max_batch: int  # n may not exceed it: the choices of one prompt decode side by side
    max_tokens: int  # the most new tokens one request may ask for
    context: int  # block_size: the longest prompt


@dataclass
class CompletionParams:
    prompts: list[str]
    max_tokens: int = 16
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None


def _int(body: dict, key: str, default: int | None, lo: int | None = None, hi: int | None = None,
         why_hi: str = "") -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(key, f"{key}: expected an integer, got {type(value).__name__}")
    if lo is not None and value < lo:
        raise BadRequest(key, f"{key}: {value} must be >= {lo}")
    if hi is not None and value > hi:
        raise BadRequest(key, f"{key}: {value} exceeds the limit of {hi}{why_hi}")
    return value


def _number(body: dict, key: str, default: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(key, f"{key}: expected a number, got {type(value).__name__}")
    return float(value)


def _strings(body: dict, key: str, required: bool) -> list[str]:
    value = body.get(key)
    if value is None:
        if required:
            raise BadRequest(key, f"{key}: missing; give a string or a list of strings")
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise BadRequest(key, f"{key}: expected a string or a non-empty list of strings")


def parse_completion(body: object, limits: Limits) -> CompletionParams:
    if not isinstance(body, dict):
        raise BadRequest(None, "the request body must be a JSON object")
    if not isinstance(body.get("model", ""), str):
        raise BadRequest("model", "model: expected a string")
    p = CompletionParams(prompts=_strings(body, "prompt", required=True))
    p.max_tokens = _int(body, "max_tokens", 16, lo=1, hi=limits.max_tokens, why_hi=" new tokens per request")
    p.n = _int(body, "n", 1, lo=1, hi=limits.max_batch, why_hi=" (the server's max_batch)")
    p.logprobs = _int(body, "logprobs", None, lo=0, hi=MAX_LOGPROBS)
    p.seed = _int(body, "seed", None)
    p.stop = _strings(body, "stop", required=False)
    settings = SamplingSettings(temperature=_number(body, "temperature", 1.0),
                                top_k=_int(body, "top_k", 0), top_p=_number(body, "top_p", 1.0),
                                repetition_penalty=_number(body, "repetition_penalty", 1.0))
    try:
        settings.validate()
    except ParamError as e:  # its parameters are named as the request's fields
        raise BadRequest(e.param, str(e)) from None
    p.settings = settings
    for key in ("stream", "echo"):
        if not isinstance(body.get(key, False) or False, bool):
            raise BadRequest(key, f"{key}: expected true or false")
    if body.get("echo"):
        raise BadRequest("echo", "echo: not supported by this server")
    p.stream = bool(body.get("stream"))
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise BadRequest("stream_options", "stream_options: expected {\"include_usage\": true|false}")
    p.include_usage = bool(options.get("include_usage"))
    return p


def encode_prompt(tokenizer, text: str, limits: Limits) -> list[int]:
    """The prompt's token ids (an empty prompt starts from the tokenizer's start, `model.text_stream.encode_prompt`),
    at most the model's context."""
    try:
        ids = prompt_ids(tokenizer, text)
    except ParamError as e:  # a character outside a char vocabulary
        raise BadRequest(e.param, str(e)) from None
    if len(ids) > limits.context:
        raise BadRequest("prompt", f"prompt: {len(ids)} tokens; the model's context holds at most {limits.context}")
    return ids


def completion_id() -> str:
    return "cmpl-" + uuid.uuid4().hex[:24]


def envelope(cid: str, model: str, choices: list[dict], created: int | None = None) -> dict:
    return {"id": cid, "object": "text_completion", "created": created or int(time.time()), "model": model,
            "choices": choices}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Logprobs:
    """OpenAI's legacy completion logprobs object, built token by token (plus `token_ids`, which the page uses to
    ask for a token's attention)."""

    def __init__(self, tokenizer, offset: int = 0):
        self.tokenizer, self.offset = tokenizer, offset
        self.data: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": [], "token_ids": []}

    def add(self, token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> None:
        text = self.tokenizer.decode([token_id])
        d = self.data
        d["tokens"].append(text)
        d["token_logprobs"].append(logprob)
        d["top_logprobs"].append({self.tokenizer.decode([i]): lp for i, lp in (top or [])})
        d["text_offset"].append(self.offset)
        d["token_ids"].append(token_id)
        self.offset += len(text)

    def take(self) -> dict:
        """What was added since the last take (one streamed chunk's worth)."""
        out = self.data
        self.data = {k: [] for k in out}
        return out
