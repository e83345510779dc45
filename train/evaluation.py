"""What happens at each evaluation: mean losses on fixed batches, samples, and the attention probe."""
from __future__ import annotations

from pathlib import Path

import torch

from data.loader import ShardLoader
from model.eval_mode import eval_mode
from train.config import RunConfig
from train.runtime import Runtime

EVAL_SEED_OFFSET = 10_000  # eval batches come from their own stream, fixed for the whole run


@torch.no_grad()
def estimate_losses(model: torch.nn.Module, cfg: RunConfig, rt: Runtime) -> dict[str, float]:
    """Mean loss over the same `eval_iters` batches of each split at every evaluation, in eval mode."""
    out = {}
    with eval_mode(model):
        for split in ("train", "val"):
            loader = ShardLoader(cfg.data.dir, split, cfg.train.batch_size, cfg.model.block_size,
                                 cfg.train.seed + EVAL_SEED_OFFSET)
            total = 0.0
            for k in range(cfg.train.eval_iters):
                x, y = loader.get_batch(k)
                with rt.autocast():
                    _, loss = model(x.to(rt.device), y.to(rt.device))
                total += loss.item()
            out[split] = total / cfg.train.eval_iters
    return out


def probe_text(cfg: RunConfig, tokenizer) -> str:
    """The text whose attention is captured at each eval: log.probe_prompt, else the built-in probe, else (a char
    vocabulary that cannot spell it) a fixed window of the val split, so every eval and every run sees the same."""
    from inspector.report import DEFAULT_PROBE
    from model.text_stream import encode_prompt

    try:
        encode_prompt(tokenizer, cfg.log.probe_prompt or DEFAULT_PROBE)
        return cfg.log.probe_prompt
    except ValueError:
        if cfg.log.probe_prompt:
            raise ValueError("log.probe_prompt: the data's tokenizer cannot encode it") from None
    x, _ = ShardLoader(cfg.data.dir, "val", 1, min(64, cfg.model.block_size), cfg.train.seed).get_batch(0)
    return tokenizer.decode(x[0].tolist())


@torch.no_grad()
def draw_samples(model: torch.nn.Module, tokenizer, prompt: str, n_tokens: int, seed: int, n: int = 2) -> list[str]:
    """A few continuations with a fixed seed, so samples across evals differ only because the model changed."""
    from model.inference import SamplingSettings, generate
    from model.text_stream import encode_prompt

    ids = encode_prompt(tokenizer, prompt)  # an empty prompt starts from the tokenizer's start token
    out = generate(model, [ids] * n, n_tokens, SamplingSettings(temperature=0.8, top_k=200), seed=seed,
                   vocab_limit=tokenizer.vocab_size)  # a padded head may hold ids the tokenizer lacks
    return [tokenizer.decode(row[len(ids):].tolist()) for row in out]


def eval_extras(model: torch.nn.Module, tokenizer, cfg: RunConfig, rt: Runtime, step: int, out_dir: Path,
                tracker) -> None:
    """Samples and attention at this step: to the run folder (samples.txt; attention/step_N/ with the images, the
    head statistics and the frame the film is made of) and to the tracker's backends.

    `model` must be the bare GPT (not DDP or compiled): the attention hooks live on its modules.
    """
    samples: list[str] = []
    if cfg.log.sample_tokens > 0:
        try:
            samples = draw_samples(model, tokenizer, cfg.log.sample_prompt, cfg.log.sample_tokens, cfg.train.seed)
        except ValueError as e:  # e.g. a prompt with characters outside a char vocabulary
            samples = [f"(no sample: {e})"]
        with (out_dir / "samples.txt").open("a") as f:
            for s in samples:
                f.write(f"--- step {step} ---\n{s}\n")
    probe = None
    if cfg.log.attention:
        from inspector.film import save_frame
        from inspector.report import probe_attention

        folder = out_dir / "attention" / f"step_{step:06d}"
        probe = probe_attention(model, tokenizer, cfg.log.probe_prompt, folder)
        save_frame(folder, step, probe["capture"])
        tracker.log({"step": step, **probe["scalars"]})
    tracker.log_eval(step, samples, probe)
