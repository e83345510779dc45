"""Checkpoint directories: weights in safetensors, the run config as JSON, the tokenizer's files, trainer state.

A directory is written under a temporary name and swapped in by renames (`data.atomic.atomic_dir`), so a kill at any
moment leaves either the old or the new checkpoint complete. Loading never unpickles arbitrary objects: safetensors for weights, JSON for
config, and `torch.load(weights_only=True)` for the optimizer and RNG state.
"""
from __future__ import annotations

import json
import os
import pickle
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from data.atomic import atomic_dir, old_name
from data.tokenizers import Tokenizer, load_tokenizer
from model.config import ModelConfig
from model.gpt import GPT

WEIGHTS, CONFIG, TRAINER_STATE = "model.safetensors", "config.json", "trainer_state.pt"
FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    model: GPT
    tokenizer: Tokenizer
    config: dict  # the resolved run config: {"model": {...}, "data": {...}, "train": {...}, "log": {...}}
    path: Path


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain GPT inside DDP and torch.compile wrappers."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """State dict without the tied head (safetensors stores each tensor once) and without wrapper prefixes."""
    model = unwrap(model)
    return weights_to_store(model.state_dict(), model.config.tie_embeddings)


def weights_to_store(state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """What model.safetensors holds of a full state dict: each tensor once (no tied head), contiguous, on the CPU."""
    if tied:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def save_checkpoint(directory: str | os.PathLike, model: torch.nn.Module, tokenizer: Tokenizer, run_config: dict,
                    trainer_state: dict[str, Any] | None = None) -> Path:
    """Write a complete checkpoint to `directory`, replacing any previous one only once the new one is whole."""
    final = Path(directory)
    with atomic_dir(final) as tmp:
        write_checkpoint_files(tmp, model_state(model), tokenizer, run_config, trainer_state)
    return final


def write_checkpoint_files(tmp: Path, weights: dict[str, torch.Tensor], tokenizer: Tokenizer, run_config: dict,
                           trainer_state: dict[str, Any] | None) -> None:
    """Everything of a checkpoint into the folder being built (a sharded save adds its shards beside)."""
    save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
    (tmp / CONFIG).write_text(json.dumps({"format_version": FORMAT_VERSION, **run_config}, indent=2))
    tokenizer.save(tmp)
    if trainer_state is not None:
        torch.save(trainer_state, tmp / TRAINER_STATE)


def resolve_checkpoint_dir(path: str | os.PathLike) -> Path:
    """A checkpoint directory itself, or a run's out_dir (best/, else latest/); a swap cut short is recovered."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"no checkpoint at {p}: the path does not exist")
    for candidate in (p, p / "best", p / "latest", old_name(p / "best"), old_name(p / "latest")):
        if (candidate / WEIGHTS).is_file() and (candidate / CONFIG).is_file():
            return candidate
    raise ValueError(f"no checkpoint at {p}: expected {WEIGHTS} and {CONFIG}, or a run folder with best/ or latest/")


def read_run_config(directory: Path) -> dict:
    try:
        cfg = json.loads((directory / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"corrupt checkpoint {directory}: {CONFIG} unreadable ({e})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise ValueError(f"corrupt checkpoint {directory}: {CONFIG} has no model section")
    cfg.pop("format_version", None)
    return cfg


def model_config_from_dict(d: dict) -> ModelConfig:
    known = {f.name for f in fields(ModelConfig)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"checkpoint config has unknown model keys: {', '.join(sorted(unknown))}")
    return ModelConfig(**d)


def load_weights(model: GPT, directory: Path, device: str | torch.device = "cpu") -> None:
    try:
        state = load_file(str(directory / WEIGHTS), device=str(device))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"corrupt checkpoint {directory}: {WEIGHTS} unreadable ({e})") from None
    load_state(model, state, f"checkpoint {directory} does not match its config")


def load_state(model: GPT, state: dict[str, torch.Tensor], mismatch: str) -> None:
    """load_state_dict that tolerates only the tied head being absent; anything else missing or extra is an error."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if model.config.tie_embeddings:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"{mismatch}: missing {missing[:3]}, unexpected {unexpected[:3]}")


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> Checkpoint:
    """Build the model from a checkpoint (or run) directory, in eval mode, on `device`."""
    directory = resolve_checkpoint_dir(path)
    cfg = read_run_config(directory)
    model = GPT(model_config_from_dict(cfg["model"]))
    load_weights(model, directory)
    model.to(device).eval()
    return Checkpoint(model=model, tokenizer=load_tokenizer(directory), config=cfg, path=directory)


def load_trainer_state(directory: str | os.PathLike) -> dict[str, Any]:
    """Optimizer, RNG and progress state; weights_only=True refuses anything but tensors and plain containers."""
    path = Path(directory) / TRAINER_STATE
    try:
        return load_tensors_only(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: no trainer state in this checkpoint (cannot resume from it)") from None
    except pickle.UnpicklingError:
        raise ValueError(f"{path}: refused, it holds objects other than tensors and plain containers "
                         "(unpickling them could run code)") from None
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
        raise ValueError(f"{path}: unreadable trainer state ({type(e).__name__})") from None


def load_tensors_only(path: str | os.PathLike) -> Any:
    """torch.load with weights_only=True and no warnings: a file from elsewhere pickled with another protocol makes
    torch warn on stderr even when it refuses the file, and bad input should cost the user one line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(path, map_location="cpu", weights_only=True)


def imported_run_config(config: ModelConfig, tokenizer_name: str) -> dict:
    """The run config an imported checkpoint carries: its model, and a data section with no corpus."""
    return {"model": asdict(config), "data": {"tokenizer": tokenizer_name, "dir": ""}}


def load_any(spec: str | os.PathLike, device: str | torch.device = "cpu") -> Checkpoint:
    """What `--ckpt` accepts: an attngpt checkpoint or run folder, a Hugging Face GPT-2 / Llama / attngpt folder,
    a nanoGPT ckpt.pt, or a GPT-2 hub name (downloaded when online)."""
    from model.hf_folder import HUB_NAMES, hf_arch, load_hf  # they build on this module
    from model.nanogpt import is_nanogpt, load_nanogpt

    path = Path(spec)
    if is_nanogpt(path):
        return load_nanogpt(path, device=device)
    if path.is_dir() and hf_arch(path) is not None:
        return load_hf(path, device)
    if not path.exists() and str(spec) in {*HUB_NAMES, *HUB_NAMES.values()}:
        return load_hf(str(spec), device)
    resolve_checkpoint_dir(path)  # one-line error for a missing path or a folder that is no checkpoint
    try:
        return load_checkpoint(path, device)
    except (TypeError, KeyError, AttributeError) as e:  # a config.json of the wrong shape
        raise ValueError(f"corrupt checkpoint {path}: {type(e).__name__}: {e}") from None
