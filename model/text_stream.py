"""From token ids to printable text while generating: UTF-8 hold-back, stop strings, end-of-text.

A byte-level BPE can split one character over several tokens, so a token's bytes are fed to an incremental UTF-8
decoder that keeps an incomplete tail until the rest arrives. A stop string can also arrive split over tokens, so
any tail of the text that could still grow into a stop string is held back too; the stop string itself is never
printed.
"""
from __future__ import annotations

import codecs
from typing import Iterator, Sequence

import torch

from model.gpt import GPT
from model.inference import SamplingSettings, make_generator, stream_tokens
from model.param_error import ParamError


class TextStream:
    """Feed token ids with `push`; it returns the text that is safe to show now. `done` once a stop is reached."""

    def __init__(self, tokenizer, stop: Sequence[str] = (), stop_at_eot: bool = True):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.eot_id = tokenizer.eot_id if stop_at_eot else None
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self.done = False

    def push(self, token_id: int) -> str:
        if self.done:
            return ""
        if self.eot_id is not None and token_id == self.eot_id:
            out = self.finish()
            self.done = True
            return out
        self._pending += self._utf8.decode(self.tokenizer.decode_bytes([token_id]))
        return self._release(final=False)

    def finish(self) -> str:
        """The held-back rest at the end of generation (an incomplete character becomes U+FFFD)."""
        if self.done:
            return ""
        self._pending += self._utf8.decode(b"", final=True)
        out = self._release(final=True)
        self.done = True
        return out

    def _release(self, final: bool) -> str:
        hits = [i for i in (self._pending.find(s) for s in self.stop) if i >= 0]
        if hits:
            out, self._pending, self.done = self._pending[:min(hits)], "", True
            return out
        hold = 0 if final else self._partial_stop_length()
        cut = len(self._pending) - hold
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

    def _partial_stop_length(self) -> int:
        """Length of the longest tail of the pending text that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:n]):
                    best = n
                    break
        return best


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The token ids a generation starts from: `text` encoded, or, when that is nothing, the tokenizer's own start
    (`Tokenizer.start_ids`: end-of-text, else a newline), never an arbitrary id. A tokenizer's complaint (a
    character outside a char vocabulary) becomes a one-line ParamError naming `prompt`."""
    try:
        ids = list(tokenizer.encode(text))
    except (KeyError, ValueError) as e:
        raise ParamError("prompt", f"cannot be tokenized with this model's tokenizer ({e})") from None
    if ids:
        return ids
    try:
        return tokenizer.start_ids()
    except ValueError as e:
        raise ParamError("prompt", f"empty, and {e}") from None


def stream_text(model: GPT, tokenizer, prompt_ids: Sequence[int], max_new_tokens: int,
                settings: SamplingSettings | None = None, *, num_samples: int = 1, stop: Sequence[str] = (),
                generator: torch.Generator | None = None, stop_at_eot: bool = True, cached: bool = True,
                window_shift: int = 0) -> Iterator[tuple[int, str]]:
    """Yield (sample index, text chunk) as tokens arrive; all samples decode together as one batch and the batch
    stops as soon as every sample has hit a stop string, end-of-text, or max_new_tokens."""
    if num_samples < 1:
        raise ParamError("num_samples", f"{num_samples} must be >= 1")
    streams = [TextStream(tokenizer, stop, stop_at_eot) for _ in range(num_samples)]
    batch = [list(prompt_ids)] * num_samples
    tokens = stream_tokens(model, batch, max_new_tokens, settings, generator=generator, cached=cached,
                           window_shift=window_shift, vocab_limit=tokenizer.vocab_size)
    try:
        for step in tokens:
            for row, token in enumerate(step.tolist()):
                chunk = streams[row].push(token)
                if chunk:
                    yield row, chunk
            if all(s.done for s in streams):
                break
    finally:
        tokens.close()
    for row, s in enumerate(streams):
        chunk = s.finish()
        if chunk:
            yield row, chunk


def generate_text(model: GPT, tokenizer, prompt: str, max_new_tokens: int, settings: SamplingSettings | None = None,
                  *, num_samples: int = 1, stop: Sequence[str] = (), seed: int | None = None,
                  stop_at_eot: bool = True) -> list[str]:
    """The continuations (prompt not included) of `num_samples` samples, as strings."""
    ids = encode_prompt(tokenizer, prompt)
    texts = [""] * num_samples
    gen = make_generator(seed, model.wte.weight.device)
    for row, chunk in stream_text(model, tokenizer, ids, max_new_tokens, settings, num_samples=num_samples,
                                  stop=stop, generator=gen, stop_at_eot=stop_at_eot):
        texts[row] += chunk
    return texts
