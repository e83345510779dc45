"""Token-by-token generation: logits processors, two decoders (KV-cached and full recompute), and a token stream.

Decoding is split in three layers so each can be checked alone:
- `sampling_logits` / `sample_next`: the one sampling chain (every decoder, the server, the trainer's samples and
  the benchmarks draw through `sample_next`), following Hugging Face transformers' logits processors of the same
  names in the same order (repetition penalty, temperature, top-k, top-p); `process_logits` is its full-vocabulary
  view;
- `CachedDecoder` and `RecomputeDecoder`: "logits of the next token given everything fed so far". They share one
  context-window policy, so their logits agree step for step; the cached one prefills once and then runs one token
  per step, the other re-runs the whole window (the slow reference);
- `stream_tokens`: prefill, then sample -> yield -> step, so a caller can print each token as it arrives.
Text (UTF-8 hold-back, stop strings) lives in `model.text_stream`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from model.checkpoint import unwrap
from model.eval_mode import eval_mode
from model.gpt import GPT
from model.kv_cache import KVCache
from model.param_error import ParamError

MAX_NEW_TOKENS = 100_000  # beyond this a request is a typo, not a plan


@dataclass
class SamplingSettings:
    """Hugging Face names and meanings; the defaults leave the model's distribution untouched."""

    temperature: float = 1.0  # 0 = greedy (argmax)
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set whose probability reaches p; 1 = off
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the context; 1 = off

    def validate(self) -> None:
        """Raise a ParamError naming the field (scripts show it as their flag, the server as its JSON field)."""
        if not self.temperature >= 0:
            raise ParamError("temperature", f"{self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ParamError("top_k", f"{self.top_k} must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ParamError("top_p", f"{self.top_p} must lie in (0, 1]")
        if not self.repetition_penalty > 0:
            raise ParamError("repetition_penalty", f"{self.repetition_penalty} must be > 0 (1 = off)")


def check_max_new_tokens(n: int) -> None:
    if n < 0:
        raise ParamError("max_new_tokens", f"{n} must be >= 0")
    if n > MAX_NEW_TOKENS:
        raise ParamError("max_new_tokens", f"{n} is absurdly large (at most {MAX_NEW_TOKENS})")


# --- logits processors (Hugging Face semantics) -------------------------------------------------------------------

NUCLEUS_CANDIDATES = 256  # top-p first looks among this many tokens; sorting all 50k costs ~20x more

def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """For every token present in the context (`seen` [B, V] bool), divide a positive logit by `penalty` and
    multiply a negative one by it, so penalty > 1 always lowers the token's probability (CTRL, HF's
    RepetitionPenaltyLogitsProcessor). Each token is penalised once, however often it occurred."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set to -inf every logit below the k-th largest of its row; ties with the k-th survive (HF TopKLogitsWarper)."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float, log_norm: torch.Tensor | None = None) -> torch.Tensor:
    """Nucleus filtering (HF TopPLogitsWarper): sort ascending, drop tokens whose cumulative probability is
    <= 1 - p; what is left is the smallest most-likely set whose probability reaches p. The top token always stays.

    `log_norm` [B, 1]: `logits` are only the most likely candidates of a larger vocabulary whose logsumexp this is;
    the probability of the rest, all below them, then starts the cumulative sum."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    if log_norm is None:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    else:
        probs = torch.exp(sorted_logits - log_norm)
        cumulative = (1.0 - probs.sum(dim=-1, keepdim=True)) + probs.cumsum(dim=-1)
    remove_sorted = cumulative <= (1.0 - p)
    remove_sorted[..., -1] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def sampling_logits(logits: torch.Tensor, settings: SamplingSettings, seen: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The one implementation of the sampling chain, in Hugging Face's order: repetition penalty on the raw logits,
    then temperature, top-k, top-p. Returns (logits [B, n], their token ids [B, n]) over n candidates, or
    (logits [B, V], None) over the whole vocabulary; filtered-out entries are -inf. Temperature 0 (greedy) returns
    the penalised logits: the filters never move their argmax.

    The candidates are what makes it cheap: with top-k only the k largest are filtered (unless some logit ties
    with the k-th, which HF keeps too); top-p alone first looks among the top NUCLEUS_CANDIDATES, which hold the
    whole nucleus whenever their probability already reaches p (the nucleus is a prefix of the ranking)."""
    logits = logits.float()
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, settings.repetition_penalty)
    if settings.temperature == 0:
        return logits, None
    if settings.temperature != 1.0:
        logits = logits / settings.temperature
    V = logits.size(-1)
    k = settings.top_k
    if 0 < k < V:
        values, ids = torch.topk(logits, k + 1, dim=-1)  # one more: a tie with the k-th shows as an equal (k+1)-th
        if not bool((values[..., k] == values[..., k - 1]).any()):
            return top_p_filter(values[..., :k], settings.top_p), ids[..., :k]
        return top_p_filter(top_k_filter(logits, k), settings.top_p), None
    if settings.top_p < 1.0:
        values, ids = torch.topk(logits, min(NUCLEUS_CANDIDATES, V), dim=-1)
        log_norm = torch.logsumexp(logits, dim=-1, keepdim=True)
        if bool((torch.exp(values - log_norm).sum(dim=-1) >= settings.top_p).all()):
            return top_p_filter(values, settings.top_p, log_norm), ids
    return top_p_filter(logits, settings.top_p), None


def process_logits(logits: torch.Tensor, settings: SamplingSettings, seen: torch.Tensor | None = None) -> torch.Tensor:
    """`sampling_logits` over the whole vocabulary, [B, V]: what HF's chain of logits processors returns."""
    values, ids = sampling_logits(logits, settings, seen)
    if ids is None:
        return values
    return torch.full(logits.shape, float("-inf"), device=values.device).scatter_(-1, ids, values)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row from probs [B, n] by inverting the CDF: one uniform number per row and a binary search,
    about 10x cheaper on CPU than torch.multinomial over 50k entries. Zero-probability entries are never drawn."""
    cdf = probs.double().cumsum(dim=-1)
    u = torch.rand(probs.size(0), 1, generator=generator, dtype=torch.float64, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.size(-1) - 1).squeeze(-1)


def sample_next(logits: torch.Tensor, settings: SamplingSettings, seen: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [B, V] -> next token ids [B], drawn from softmax(sampling_logits). Temperature 0 takes the argmax
    (first index on ties)."""
    values, ids = sampling_logits(logits, settings, seen)
    if settings.temperature == 0:
        choice = values.argmax(dim=-1)
    else:
        choice = draw(torch.softmax(values, dim=-1), generator)
    if ids is not None:
        choice = ids.gather(-1, choice.unsqueeze(-1)).squeeze(-1)
    return choice


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A private RNG: the same seed gives the same text whatever else touched torch's global RNG."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


# --- decoders -------------------------------------------------------------------------------------------------------

class _WindowDecoder:
    """What both decoders share: the tokens the model currently sees, [B, <= block_size], kept in a preallocated
    buffer, their sliding policy, and the prefill.

    Past block_size the window slides: the oldest `shift` tokens are dropped in one go and the rest is run again
    from position 0. Learned and sinusoidal positions are absolute, so cached keys of a shifted window are stale and
    must be recomputed; shifting by a quarter of the block pays that prefill once every block_size/4 tokens instead
    of every token. shift=1 reproduces nanoGPT's crop-to-the-last-block_size exactly (and recomputes every step).
    """

    def __init__(self, model: GPT, batch_size: int, shift: int = 0):
        self.model = model
        self.block_size = model.config.block_size
        self.shift = shift or max(1, self.block_size // 4)
        if not 1 <= self.shift <= self.block_size:
            raise ParamError("window_shift", f"{self.shift} must lie in [1, block_size = {self.block_size}]")
        device = model.wte.weight.device
        self.tokens = torch.zeros(batch_size, self.block_size, dtype=torch.long, device=device)
        self.length = 0

    def _load(self, idx: torch.Tensor) -> None:
        idx = idx[:, -self.block_size:]
        self.tokens[:, :idx.size(1)] = idx
        self.length = idx.size(1)

    def _push(self, token: torch.Tensor) -> bool:
        """Append one token per row; True when the window had to slide (everything must be recomputed)."""
        slid = self.length == self.block_size
        if slid:
            keep = self.block_size - self.shift
            self.tokens[:, :keep] = self.tokens[:, self.shift:].clone()
            self.length = keep
        self.tokens[:, self.length] = token
        self.length += 1
        return slid

    @property
    def context(self) -> torch.Tensor:
        return self.tokens[:, :self.length]

    @torch.inference_mode()
    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """idx [B, T] (T >= 1; only the last block_size are kept) -> logits [B, V] for the next token."""
        self._load(idx)
        return self._run_window()

    def _run_window(self) -> torch.Tensor:
        raise NotImplementedError


class CachedDecoder(_WindowDecoder):
    """Prefill once, then one token per step through a static KVCache (see model/kv_cache.py for its layout)."""

    def __init__(self, model: GPT, batch_size: int, shift: int = 0, max_len: int | None = None):
        """max_len: the most tokens this generation can hold (prompt + new), if known; the cache is sized to
        min(max_len, block_size) so a short generation does not allocate a whole block's cache."""
        super().__init__(model, batch_size, shift)
        size = min(max_len or self.block_size, self.block_size)
        self.cache = KVCache(model.config, batch_size, max_len=size, device=self.tokens.device,
                             dtype=model.wte.weight.dtype)

    @torch.inference_mode()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """token [B] -> logits [B, V] for the token after it."""
        if self._push(token):
            return self._run_window()
        logits, _ = self.model(token.view(-1, 1), cache=self.cache)
        return logits[:, -1]

    def _run_window(self) -> torch.Tensor:
        self.cache.reset()
        logits, _ = self.model(self.context, cache=self.cache, logits_to_keep=1)
        return logits[:, -1]


class RecomputeDecoder(_WindowDecoder):
    """The reference: every step runs the model over the whole window, no cache."""

    @torch.inference_mode()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        self._push(token)
        return self._run_window()

    def _run_window(self) -> torch.Tensor:
        logits, _ = self.model(self.context, logits_to_keep=1)
        return logits[:, -1]


# --- the token stream -----------------------------------------------------------------------------------------------

def as_batch(prompt: torch.Tensor | Sequence[int] | Sequence[Sequence[int]], device: torch.device | str
             ) -> torch.Tensor:
    """A prompt as a [B, T] LongTensor; rows must have equal length (samples of one prompt decode together)."""
    idx = torch.as_tensor(prompt, dtype=torch.long, device=device)
    if idx.dim() == 1:
        idx = idx.unsqueeze(0)
    if idx.dim() != 2 or idx.size(1) == 0:
        raise ParamError("prompt", "must hold at least one token")
    return idx


def stream_tokens(model: GPT, prompt: torch.Tensor | Sequence[int] | Sequence[Sequence[int]], max_new_tokens: int,
                  settings: SamplingSettings | None = None, *, generator: torch.Generator | None = None,
                  cached: bool = True, window_shift: int = 0, vocab_limit: int | None = None
                  ) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, [B] ids, one step at a time, up to max_new_tokens steps.

    The prompt is prefilled once; the next step is only computed when the caller asks for it, so stopping early
    (break, or closing the generator) costs nothing. `vocab_limit` restricts sampling to ids a tokenizer can decode
    (nanoGPT pads GPT-2's 50257 to 50304). The repetition penalty counts prompt tokens too, as HF does.
    """
    settings = settings or SamplingSettings()
    settings.validate()
    check_max_new_tokens(max_new_tokens)
    model = unwrap(model)  # decode with the plain GPT: DDP has no cache path, a compiled one would recompile per length
    idx = as_batch(prompt, model.wte.weight.device)
    # the checks above run at the call; the decoding itself runs as the caller pulls tokens
    return _decode_stream(model, idx, max_new_tokens, settings, generator, cached, window_shift, vocab_limit)


def _decode_stream(model: GPT, idx: torch.Tensor, max_new_tokens: int, settings: SamplingSettings,
                   generator: torch.Generator | None, cached: bool, window_shift: int, vocab_limit: int | None
                   ) -> Iterator[torch.Tensor]:
    """The body of `stream_tokens`; eval mode holds until the stream ends, is closed, or is garbage-collected."""
    if max_new_tokens == 0:
        return
    with eval_mode(model):
        device = idx.device
        if cached:
            decoder = CachedDecoder(model, idx.size(0), window_shift, max_len=idx.size(1) + max_new_tokens)
        else:
            decoder = RecomputeDecoder(model, idx.size(0), window_shift)
        vocab = min(vocab_limit or model.config.vocab_size, model.config.vocab_size)
        seen = None
        if settings.repetition_penalty != 1.0:
            seen = torch.zeros(idx.size(0), vocab, dtype=torch.bool, device=device)
            rows, cols = (idx < vocab).nonzero(as_tuple=True)
            seen[rows, idx[rows, cols]] = True
        logits = decoder.prefill(idx)
        for i in range(max_new_tokens):
            token = sample_next(logits[:, :vocab], settings, seen, generator)
            yield token
            if i + 1 == max_new_tokens:
                return
            if seen is not None:
                seen.scatter_(1, token.unsqueeze(1), True)
            logits = decoder.step(token)


def generate(model: GPT, prompt: torch.Tensor | Sequence[int] | Sequence[Sequence[int]], max_new_tokens: int,
             settings: SamplingSettings | None = None, *, seed: int | None = None, cached: bool = True,
             window_shift: int = 0, vocab_limit: int | None = None) -> torch.Tensor:
    """Prompt plus continuation, [B, T + max_new_tokens]: the non-streaming convenience (as in nanoGPT)."""
    device = unwrap(model).wte.weight.device
    idx = as_batch(prompt, device)
    steps = list(stream_tokens(model, idx, max_new_tokens, settings, generator=make_generator(seed, device),
                               cached=cached, window_shift=window_shift, vocab_limit=vocab_limit))
    if not steps:
        return idx
    return torch.cat([idx, torch.stack(steps, dim=1)], dim=1)
