"""nanoGPT checkpoints in: a `ckpt.pt` (model_args + GPT-2-named state dict) and its char-level `meta.pkl`.

Nothing here executes code from a file it reads: `torch.load` with `weights_only=True` (tensors and plain
containers only), and an unpickler for `meta.pkl` that admits no class at all, so only dicts, strings and ints
can come out of it. nanoGPT's MLP uses the exact (erf) GELU, so imports set `mlp = "gelu_exact"`.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch

from data.tokenizers import CharTokenizer, Tokenizer, gpt2_tokenizer
from model.checkpoint import Checkpoint, imported_run_config, load_state
from model.config import ModelConfig
from model.gpt import GPT
from model.hf_gpt2 import GPT2_VOCAB, state_from_external
from model.param_error import ParamError


class _PlainDataUnpickler(pickle.Unpickler):
    """Refuses every global: dicts, lists, strings and numbers are built by opcodes, everything else is an error."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: meta.pkl may only hold dicts, str and int")


def read_nanogpt_meta(path: str | Path) -> CharTokenizer:
    """nanoGPT's char-level meta.pkl ({'vocab_size', 'itos', 'stoi'}) as a CharTokenizer, without running code."""
    try:
        meta = _PlainDataUnpickler(io.BytesIO(Path(path).read_bytes())).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: unreadable meta.pkl ({e})") from None
    itos = meta.get("itos") if isinstance(meta, dict) else None
    if not isinstance(itos, dict) or not all(isinstance(k, int) and isinstance(v, str) for k, v in itos.items()):
        raise ValueError(f"{path}: meta.pkl has no int -> str 'itos' table")
    chars = [itos[i] for i in sorted(itos)]
    if sorted(itos) != list(range(len(itos))) or chars != sorted(set(chars)):
        raise ValueError(f"{path}: meta.pkl vocabulary is not the sorted characters 0..n-1 nanoGPT writes")
    return CharTokenizer(chars)


def is_nanogpt(path: Path) -> bool:
    return (path.is_file() and path.suffix == ".pt") or (path / "ckpt.pt").is_file()


def load_nanogpt(ckpt_path: str | Path, meta_path: str | Path | None = None,
                 device: str | torch.device = "cpu") -> Checkpoint:
    """A nanoGPT ckpt.pt (model_args + model state dict, `_orig_mod.` prefixes allowed) with its tokenizer:
    meta.pkl if given or beside the checkpoint, else GPT-2's BPE when the vocabulary is GPT-2's size."""
    path = Path(ckpt_path)
    if path.is_dir():
        path = path / "ckpt.pt"
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such nanoGPT checkpoint") from None
    except Exception as e:  # noqa: BLE001 - unpickling errors come in many types
        raise ValueError(f"{path}: not a loadable nanoGPT checkpoint ({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model_args"), dict) or "model" not in ckpt:
        raise ValueError(f"{path}: expected a dict with 'model_args' and 'model' (a nanoGPT ckpt.pt)")
    args = ckpt["model_args"]
    try:
        config = ModelConfig(vocab_size=int(args["vocab_size"]), block_size=int(args["block_size"]),
                             n_layer=int(args["n_layer"]), n_head=int(args["n_head"]), n_embd=int(args["n_embd"]),
                             bias=bool(args.get("bias", True)), dropout=float(args.get("dropout", 0.0)),
                             mlp="gelu_exact", positions="learned", norm="layernorm", tie_embeddings=True)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: model_args incomplete ({e})") from None
    model = GPT(config)
    load_state(model, state_from_external(ckpt["model"], conv1d=False),
               f"{path}: weights do not match a GPT-2 of this config")
    model.to(device).eval()
    meta = Path(meta_path) if meta_path else path.parent / "meta.pkl"
    if meta.is_file():
        tokenizer: Tokenizer = read_nanogpt_meta(meta)
    elif meta_path:
        raise ValueError(f"{meta}: no such meta.pkl")
    elif config.vocab_size >= GPT2_VOCAB:
        tokenizer = gpt2_tokenizer()
    else:
        raise ParamError("meta_path", f"{path}: vocab_size {config.vocab_size} is not GPT-2's and there is no "
                         "meta.pkl beside it; give the dataset's meta.pkl (data/<dataset>/meta.pkl)")
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{meta}: {tokenizer.vocab_size} characters, but the model has only {config.vocab_size}")
    return Checkpoint(model=model, tokenizer=tokenizer, config=imported_run_config(config, tokenizer.name), path=path)
