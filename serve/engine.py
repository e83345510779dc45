"""The serving engine: continuous batching over one model, in one background thread.

Each step the scheduler
1. runs queued side jobs (an attention capture for the page), so nothing else touches the model meanwhile;
2. drops rows whose client went away;
3. admits waiting requests into free rows (an idle engine first waits a few ms while more keep arriving): their
   prompts are prefilled together (right-padded, causal, so padding never reaches a real token; equal prompts
   once), copied into the shared RowKVCache, and their first token is sampled;
4. unless more requests came in during that prefill and fit (they are admitted first, prefill before decode),
   feeds every live row's last token through ONE batched forward (each row at its own position, masked to its own
   length), samples each row with its own settings and private generator, and retires finished rows.

A row whose context fills block_size slides like `model.inference`'s window: the oldest block_size/4 tokens are
dropped and the rest is prefilled again (absolute positions make the cached keys stale) before its next token.
Sampling is `model.inference.sample_next`, row by row; text (UTF-8 hold-back, stop strings, end-of-text) is
`model.text_stream.TextStream`. The engine knows nothing of HTTP: events go to each request's `emit` callback.
"""
from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from model.checkpoint import unwrap
from model.gpt import GPT
from model.inference import SamplingSettings, make_generator, sample_next
from model.kv_cache import KVCache, RowKVCache
from model.linear import prepack
from model.param_error import ParamError
from model.text_stream import TextStream


@dataclass
class Event:
    """One step of one request: the token sampled, the text now safe to show, and, on the last event, why it ended
    ("stop": a stop string or end-of-text; "length": max_new_tokens; "abort": the server shut down)."""

    token_id: int | None
    text: str
    logprob: float | None = None  # log-probability of the token under the model's raw distribution
    top: list[tuple[int, float]] | None = None  # the most likely tokens and their log-probabilities
    finish_reason: str | None = None
    completion_tokens: int = 0


@dataclass
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    emit: Callable[[Event], None]  # called from the engine thread, in order
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    seed: int | None = None
    stop: Sequence[str] = ()
    top_logprobs: int | None = None  # None: no log-probabilities; k >= 0: the token's and k alternatives
    cancelled: bool = False  # set by the client's side; the row is freed at the next step


class _Row:
    """A running request: its context (the tokens in its cache row), the token waiting to be fed, its RNG."""

    def __init__(self, req: Request, tokenizer, vocab: int, device: torch.device):
        self.req = req
        self.context = list(req.prompt_ids)
        self.pending = -1
        self.count = 0
        self.text = TextStream(tokenizer, req.stop)
        self.generator = make_generator(req.seed, device)
        self.seen = None
        if req.settings.repetition_penalty != 1.0:  # HF counts the prompt's tokens too
            self.seen = torch.zeros(1, vocab, dtype=torch.bool, device=device)
            self.seen[0, torch.tensor([i for i in req.prompt_ids if i < vocab], dtype=torch.long)] = True


class Engine:
    def __init__(self, model: GPT, tokenizer, max_batch: int = 8, window_shift: int = 0, gather_s: float = 0.003):
        if max_batch < 1:
            raise ParamError("max_batch", f"{max_batch} must be >= 1")
        self.model = unwrap(model).eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.gather_s = gather_s
        config = self.model.config
        self.block_size = config.block_size
        self.shift = window_shift or max(1, self.block_size // 4)  # the same policy as model.inference's window
        self.vocab = min(getattr(tokenizer, "vocab_size", 0) or config.vocab_size, config.vocab_size)
        self.device = self.model.wte.weight.device
        self.cache = RowKVCache(config, max_batch, device=self.device, dtype=self.model.wte.weight.dtype)
        if max_batch > 1:  # the batched steps' copy of the weights (model/linear.py), made before any request waits
            prepack(self.model)
        self.rows: list[_Row] = []
        self._waiting: list[Request] = []
        self._jobs: list[tuple[Callable[[], object], concurrent.futures.Future]] = []
        self._cv = threading.Condition()
        self._stopping = False
        self.steps = 0  # batched decode forwards so far (the tests read it)
        self._deferred = 0  # admissions in a row that went before the running rows' next decode step
        self._thread = threading.Thread(target=self._loop, name="attngpt-engine", daemon=True)
        self._thread.start()

    # --- the client side (any thread) ---

    def submit(self, req: Request) -> None:
        if not req.prompt_ids:
            raise ValueError("the prompt must hold at least one token")
        if req.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: {req.max_new_tokens} must be >= 1")
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine is shutting down")
            self._waiting.append(req)
            self._cv.notify()

    def call(self, fn: Callable[[], object]) -> concurrent.futures.Future:
        """Run fn() on the engine thread between two steps (it may use the model); returns its future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine is shutting down")
            self._jobs.append((fn, future))
            self._cv.notify()
        return future

    def stats(self) -> dict:
        with self._cv:
            return {"running": len(self.rows), "waiting": len(self._waiting), "max_batch": self.max_batch}

    def shutdown(self, wait: bool = True, timeout: float = 10.0) -> None:
        """Stop after the current step: every unfinished request gets a last event with finish_reason "abort"."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # --- the engine thread ---

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._waiting or self.rows or self._jobs or self._stopping):
                    self._cv.wait()
                if self._stopping:
                    break
                self._gather()
                jobs, self._jobs = self._jobs, []
                free = self.max_batch - len(self.rows)
                admit, self._waiting = self._waiting[:free], self._waiting[free:]
            for fn, future in jobs:
                self._run_job(fn, future)
            try:
                with torch.inference_mode():
                    self._retire(lambda row: row.req.cancelled)
                    admit = [req for req in admit if not req.cancelled]
                    if admit:
                        self._admit(admit)
                    if admit and self._deferred < self.max_batch and self._admissible():
                        self._deferred += 1  # prefill first: the next step admits the newcomers
                    elif self.rows:
                        self._deferred = 0
                        self._decode()
            except Exception:  # noqa: BLE001 - a failed step must not hang every client: end its requests
                traceback.print_exc(file=sys.stderr)
                self._end_rows(admit)
        self._abort_all()

    def _admissible(self) -> bool:
        """Whether requests that came in meanwhile (during a prefill) can join now. If so the next step admits them
        before the running rows decode again: their time to first token is then two prefills, not two prefills
        and a decode step. At most max_batch admissions in a row go first, so decoding is never held up for long."""
        with self._cv:
            return bool(self._waiting) and len(self.rows) < self.max_batch

    def _gather(self) -> None:
        """On an idle engine, wait while requests keep arriving (each within `gather_s` of the last, up to 10x
        that in all) so that clients who come together are prefilled together: one batched prefill costs about
        as much as a single one, where admitting the first alone would make the rest wait for it.
        Called with the lock held."""
        if self.rows or not self._waiting or self.gather_s <= 0:
            return
        deadline = time.monotonic() + 10 * self.gather_s
        seen = len(self._waiting)
        while seen < self.max_batch and not self._stopping and time.monotonic() < deadline:
            self._cv.wait(self.gather_s)
            if len(self._waiting) == seen:
                return  # quiet for gather_s: nobody else is coming
            seen = len(self._waiting)

    def _run_job(self, fn, future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller, who reports it
            future.set_exception(e)

    def _abort_all(self) -> None:
        with self._cv:
            waiting, self._waiting = self._waiting, []
            jobs, self._jobs = self._jobs, []
        for fn, future in jobs:
            future.cancel()
        self._end_rows(waiting)

    def _end_rows(self, waiting: list[Request]) -> None:
        """End every running request, and the given waiting ones, with finish_reason "abort"."""
        running = {id(row.req) for row in self.rows}
        for req in waiting:
            if id(req) not in running:
                req.emit(Event(None, "", finish_reason="abort"))
        for row in self.rows:
            row.req.emit(Event(None, row.text.finish(), finish_reason="abort", completion_tokens=row.count))
        self.rows = []
        self.cache.live = 0

    def _prefill(self, contexts: list[list[int]]) -> tuple[KVCache, list[int], torch.Tensor]:
        """Run the contexts (<= block_size tokens each) as one right-padded batch; returns the filled cache, the
        cache row holding each context, and each context's next-token logits [n, V]. Equal contexts (the n choices
        of one request, clients sharing a prompt) are run once and share their row: the same keys and logits."""
        unique: dict[tuple[int, ...], int] = {}
        source = [unique.setdefault(tuple(c), len(unique)) for c in contexts]
        runs = [list(c) for c in unique]
        lengths = [len(c) for c in runs]
        longest, shortest = max(lengths), min(lengths)
        idx = torch.zeros(len(runs), longest, dtype=torch.long)
        for i, c in enumerate(runs):
            idx[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        kv = KVCache(self.model.config, len(runs), max_len=longest, device=self.device, dtype=self.cache.k.dtype)
        keep = longest - shortest + 1  # enough final positions to hold every row's last real token
        logits, _ = self.model(idx.to(self.device), cache=kv, logits_to_keep=keep)
        last = torch.tensor([n - 1 - (longest - keep) for n in lengths], device=self.device)
        logits = logits[torch.arange(len(runs), device=self.device), last]
        return kv, source, logits[torch.tensor(source, device=self.device)]

    def _admit(self, requests: list[Request]) -> None:
        new = [_Row(req, self.tokenizer, self.vocab, self.device) for req in requests]
        for row in new:
            row.context = row.context[-self.block_size:]
        kv, source, logits = self._prefill([row.context for row in new])
        for i, row in enumerate(new):
            self.cache.load(len(self.rows), kv, source[i], len(row.context))
            self.rows.append(row)
            self.cache.live = len(self.rows)
            self._sample(row, logits[i])
        self._retire(lambda row: row.text.done or row.count == row.req.max_new_tokens)

    def _decode(self) -> None:
        full = [i for i, row in enumerate(self.rows) if len(row.context) == self.block_size]
        if full:  # slide these windows: prefill what is left, then they step with everyone else
            for i in full:
                self.rows[i].context = self.rows[i].context[self.shift:]
            kv, source, _ = self._prefill([self.rows[i].context for i in full])
            for j, i in enumerate(full):
                self.cache.load(i, kv, source[j], len(self.rows[i].context))
        tokens = torch.tensor([[row.pending] for row in self.rows], dtype=torch.long, device=self.device)
        logits, _ = self.model(tokens, cache=self.cache)
        self.steps += 1
        for i, row in enumerate(self.rows):
            row.context.append(row.pending)
            self._sample(row, logits[i, -1])
        self._retire(lambda row: row.text.done or row.count == row.req.max_new_tokens)

    def _sample(self, row: _Row, logits: torch.Tensor) -> None:
        logits = logits[:self.vocab].unsqueeze(0)
        token = int(sample_next(logits, row.req.settings, row.seen, row.generator)[0])
        row.pending, row.count = token, row.count + 1
        if row.seen is not None:
            row.seen[0, token] = True
        event = Event(token, row.text.push(token), completion_tokens=row.count)
        k = row.req.top_logprobs
        if k is not None:
            logp = torch.log_softmax(logits[0].float(), dim=-1)
            event.logprob = float(logp[token])
            if k > 0:
                values, ids = torch.topk(logp, min(k, logp.numel()))
                event.top = list(zip(ids.tolist(), values.tolist()))
        if row.text.done:
            event.finish_reason = "stop"
        elif row.count == row.req.max_new_tokens:
            event.text += row.text.finish()
            event.finish_reason = "length"
        row.req.emit(event)

    def _retire(self, finished: Callable[[_Row], bool]) -> None:
        """Free the rows `finished` picks, keeping the live rows packed in slots [0, n)."""
        i = 0
        while i < len(self.rows):
            if finished(self.rows[i]):
                last = len(self.rows) - 1
                if i != last:
                    self.cache.move(last, i)
                    self.rows[i] = self.rows[last]
                self.rows.pop()
                self.cache.live = len(self.rows)
            else:
                i += 1
