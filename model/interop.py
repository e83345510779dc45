"""GPT-2 weights in and out: Hugging Face GPT-2 directories or hub names, nanoGPT `ckpt.pt`, export to HF.

Nothing here executes code from a file it reads: weights come from safetensors, or from `torch.load` with
`weights_only=True` (tensors and plain containers only); configs are JSON; nanoGPT's `meta.pkl` goes through an
unpickler that admits no class at all, so only dicts, strings and ints can come out of it.

Name mapping. attngpt uses GPT-2's names under `blocks.{i}` instead of `transformer.h.{i}`. HF stores its four
projections as Conv1D, weight [in, out]; ours (and nanoGPT's) are nn.Linear, weight [out, in], so those are transposed.
transformers itself is never imported here; the hub path imports `huggingface_hub` lazily.
"""
from __future__ import annotations

import io
import json
import pickle
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from data.tokenizers import TOKENIZER_FILE, CharTokenizer, Tokenizer, gpt2_files, gpt2_tokenizer, load_tokenizer
from model.checkpoint import Checkpoint, load_checkpoint, load_state, model_state, resolve_checkpoint_dir
from model.config import ModelConfig
from model.gpt import GPT

HUB_NAMES = {"gpt2": "openai-community/gpt2", "gpt2-medium": "openai-community/gpt2-medium",
             "gpt2-large": "openai-community/gpt2-large", "gpt2-xl": "openai-community/gpt2-xl"}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GPT2_VOCAB = 50257
EXPORTED_TOKENIZER = "attngpt_tokenizer.json"  # our own tokenizer file, renamed so HF does not try to parse it


# --- name mapping ---------------------------------------------------------------------------------------------------

def _to_ours(key: str) -> str | None:
    """HF/nanoGPT key -> attngpt key; None for buffers we do not keep (the causal-mask `attn.bias`)."""
    for prefix in ("_orig_mod.", "module.", "transformer."):
        key = key.removeprefix(prefix)
    parts = key.split(".")
    if len(parts) == 4 and parts[0] == "h" and parts[2] == "attn" and parts[3] in ("bias", "masked_bias"):
        return None
    if parts[0] == "h":
        parts[0] = "blocks"
    return ".".join(parts)


def state_from_external(state: dict[str, torch.Tensor], conv1d: bool) -> dict[str, torch.Tensor]:
    """An HF (conv1d=True) or nanoGPT (conv1d=False) GPT-2 state dict in attngpt's names and layouts."""
    out = {}
    for key, value in state.items():
        ours = _to_ours(key)
        if ours is None:
            continue
        if conv1d and ours.endswith(CONV1D):
            value = value.t()
        out[ours] = value.contiguous()
    return out


def state_to_hf(model: GPT) -> dict[str, torch.Tensor]:
    """attngpt weights as an HF GPT2LMHeadModel state dict; a model without biases gets zero biases (same output)."""
    state = model_state(model)
    out = {}
    for key, value in state.items():
        name = key.replace("blocks.", "h.", 1)
        if key.endswith(CONV1D):
            value = value.t()
        out[name if name == "lm_head.weight" else f"transformer.{name}"] = value.contiguous()
    if not model.config.bias:
        for key, value in list(out.items()):
            if key.endswith(".weight") and not key.endswith(("wte.weight", "wpe.weight", "lm_head.weight")):
                bias_len = value.shape[1] if key.endswith(CONV1D) else value.shape[0]
                out.setdefault(key[:-len("weight")] + "bias", torch.zeros(bias_len, dtype=value.dtype))
    return out


def _load_matching(model: GPT, state: dict[str, torch.Tensor], source: str) -> None:
    load_state(model, state, f"{source}: weights do not match a GPT-2 of this config")


# --- Hugging Face GPT-2 in ------------------------------------------------------------------------------------------

# HF activation_function -> attngpt mlp: GPT-2's tanh GELU, or the exact erf GELU (nanoGPT-trained models)
HF_ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact"}


def config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    """ModelConfig from an HF GPT2Config dict; settings we cannot reproduce exactly are refused by name."""
    if hf.get("model_type") != "gpt2":
        raise ValueError(f"{source}: model_type {hf.get('model_type')!r} is not gpt2")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in HF_ACTIVATIONS:
        raise ValueError(f"{source}: activation_function {activation!r} is not one of {', '.join(HF_ACTIVATIONS)}")
    for key, ok in (("scale_attn_by_inverse_layer_idx", False), ("add_cross_attention", False)):
        if hf.get(key, ok) != ok:
            raise ValueError(f"{source}: {key} = {hf[key]!r} is not supported")
    if abs(hf.get("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12:
        raise ValueError(f"{source}: layer_norm_epsilon {hf['layer_norm_epsilon']} differs from attngpt's 1e-5")
    try:
        return ModelConfig(vocab_size=int(hf["vocab_size"]), block_size=int(hf.get("n_positions", 1024)),
                           n_layer=int(hf["n_layer"]), n_head=int(hf["n_head"]), n_embd=int(hf["n_embd"]),
                           d_ff=int(hf.get("n_inner") or 0), bias=True, norm="layernorm", positions="learned",
                           mlp=HF_ACTIVATIONS[activation], scaled=bool(hf.get("scale_attn_weights", True)),
                           tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source}: not a usable GPT-2 config ({e})") from None


def is_hf_gpt2_dir(path: Path) -> bool:
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == "gpt2"
    except (OSError, ValueError, AttributeError):
        return False


def _read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    st, binary = directory / "model.safetensors", directory / "pytorch_model.bin"
    try:
        if st.is_file():
            return load_file(str(st))
        if binary.is_file():
            return torch.load(binary, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, pickle.UnpicklingError, RuntimeError, ValueError) as e:
        raise ValueError(f"{directory}: unreadable weights ({type(e).__name__}: {str(e)[:120]})") from None
    raise ValueError(f"{directory}: no model.safetensors or pytorch_model.bin")


def _hf_tokenizer(directory: Path, vocab_size: int) -> Tokenizer:
    """Our own tokenizer if the directory came from export_hf, else GPT-2's BPE (any vocab of GPT-2's size)."""
    ours = directory / EXPORTED_TOKENIZER
    if ours.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(ours, Path(tmp) / TOKENIZER_FILE)
            return load_tokenizer(tmp)
    if vocab_size >= GPT2_VOCAB:
        return gpt2_tokenizer()
    raise ValueError(f"{directory}: vocab_size {vocab_size} is smaller than GPT-2's and no {EXPORTED_TOKENIZER} "
                     "says which tokenizer goes with it")


def load_hf_gpt2(path_or_name: str | Path, device: str | torch.device = "cpu") -> Checkpoint:
    """GPT-2 from an HF directory (config.json + model.safetensors or pytorch_model.bin), or a hub name."""
    directory = Path(path_or_name)
    if not directory.exists():
        directory = download_hf_gpt2(str(path_or_name))
    try:
        hf = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{directory}: no readable config.json ({e})") from None
    config = config_from_hf(hf, str(directory / "config.json"))
    model = GPT(config)
    _load_matching(model, state_from_external(_read_hf_weights(directory), conv1d=True), str(directory))
    model.to(device).eval()
    return Checkpoint(model=model, tokenizer=_hf_tokenizer(directory, config.vocab_size),
                      config=_run_config(config, "gpt2"), path=directory)


def download_hf_gpt2(name: str) -> Path:
    """Fetch config.json and model.safetensors of an official GPT-2 from the hub (needs network)."""
    repo = HUB_NAMES.get(name, name)
    if repo not in HUB_NAMES.values():
        raise ValueError(f"{name}: no such path, and not a GPT-2 hub name ({', '.join(HUB_NAMES)})")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError("downloading from the hub needs huggingface_hub (pip install huggingface_hub)") from None
    try:
        return Path(snapshot_download(repo, allow_patterns=["config.json", "model.safetensors"]))
    except Exception as e:  # noqa: BLE001 - offline, DNS, HTTP errors all mean the same to the user
        raise ValueError(f"could not download {repo} from the Hugging Face hub ({type(e).__name__}); "
                         "pass a local GPT-2 directory instead") from None


def _run_config(config: ModelConfig, tokenizer_name: str) -> dict:
    """The run config an imported checkpoint carries: its model, and a data section with no corpus."""
    return {"model": asdict(config), "data": {"tokenizer": tokenizer_name, "dir": ""}}


# --- nanoGPT in -----------------------------------------------------------------------------------------------------

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
    _load_matching(model, state_from_external(ckpt["model"], conv1d=False), str(path))
    model.to(device).eval()
    meta = Path(meta_path) if meta_path else path.parent / "meta.pkl"
    if meta.is_file():
        tokenizer: Tokenizer = read_nanogpt_meta(meta)
        name = "char"
    elif meta_path:
        raise ValueError(f"{meta}: no such meta.pkl")
    elif config.vocab_size >= GPT2_VOCAB:
        tokenizer, name = gpt2_tokenizer(), "gpt2"
    else:
        raise ValueError(f"{path}: vocab_size {config.vocab_size} is not GPT-2's and there is no meta.pkl beside "
                         "it; pass --meta data/<dataset>/meta.pkl")
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{meta}: {tokenizer.vocab_size} characters, but the model has only {config.vocab_size}")
    return Checkpoint(model=model, tokenizer=tokenizer, config=_run_config(config, name), path=path)


# --- anything in, HF out --------------------------------------------------------------------------------------------

def load_any(spec: str | Path, device: str | torch.device = "cpu") -> Checkpoint:
    """What `--ckpt` accepts: an attngpt checkpoint or run folder, an HF GPT-2 directory, a nanoGPT ckpt.pt,
    or a GPT-2 hub name (downloaded when online)."""
    path = Path(spec)
    if (path.is_file() and path.suffix == ".pt") or (path / "ckpt.pt").is_file():
        return load_nanogpt(path, device=device)
    if path.is_dir() and is_hf_gpt2_dir(path) and not (path / TOKENIZER_FILE).is_file():
        return load_hf_gpt2(path, device)
    if not path.exists() and str(spec) in {**HUB_NAMES, **{v: v for v in HUB_NAMES.values()}}:
        return load_hf_gpt2(str(spec), device)
    resolve_checkpoint_dir(path)  # one-line error for a missing path or a folder that is no checkpoint
    try:
        return load_checkpoint(path, device)
    except (TypeError, KeyError, AttributeError) as e:  # a config.json of the wrong shape
        raise ValueError(f"corrupt checkpoint {path}: {type(e).__name__}: {e}") from None


def check_gpt2_shape(config: ModelConfig) -> None:
    """Raise ValueError naming every setting that GPT2LMHeadModel cannot express."""
    wrong = [f"{key} = {getattr(config, key)!r} (GPT-2: {want!r})" for key, want in
             (("positions", "learned"), ("norm", "layernorm"), ("qk_norm", False),
              ("logit_softcap", 0.0)) if getattr(config, key) != want]
    if config.mlp not in ("gelu", "gelu_exact"):
        wrong.append(f"mlp = {config.mlp!r} (GPT-2: 'gelu' or 'gelu_exact')")
    if config.kv_heads != config.n_head:
        wrong.append(f"n_kv_head = {config.n_kv_head} (GPT-2 has one key/value head per query head)")
    if config.attention == "additive":
        wrong.append("attention = 'additive' (GPT-2 uses dot-product attention)")
    if wrong:
        raise ValueError("not a GPT-2-shaped model: " + "; ".join(wrong))


def hf_config(config: ModelConfig, tokenizer: Tokenizer) -> dict:
    eot = tokenizer.eot_id if tokenizer.eot_id is not None and tokenizer.eot_id < config.vocab_size else None
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": config.vocab_size,
            "n_positions": config.block_size, "n_ctx": config.block_size, "n_embd": config.n_embd,
            "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": config.d_ff or None,
            "activation_function": "gelu" if config.mlp == "gelu_exact" else "gelu_new", "layer_norm_epsilon": 1e-5, "resid_pdrop": config.dropout,
            "embd_pdrop": config.dropout, "attn_pdrop": config.dropout, "scale_attn_weights": config.scaled,
            "tie_word_embeddings": config.tie_embeddings, "bos_token_id": eot, "eos_token_id": eot,
            "initializer_range": 0.02, "use_cache": True}


def export_hf(ckpt: Checkpoint, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write an HF GPT-2 directory (config.json, model.safetensors, tokenizer files) that GPT2LMHeadModel loads
    with the same logits. GPT-2's BPE gets HF's vocab.json/merges.txt; other tokenizers travel as
    attngpt_tokenizer.json, which load_hf_gpt2 picks up again."""
    check_gpt2_shape(ckpt.model.config)
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out} exists and is not empty (pass --overwrite to replace its files)")
    out.mkdir(parents=True, exist_ok=True)
    save_file(state_to_hf(ckpt.model), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(ckpt.model.config, ckpt.tokenizer), indent=2))
    if ckpt.tokenizer.name == "gpt2":
        encoder_json, vocab_bpe = gpt2_files()
        shutil.copy(encoder_json, out / "vocab.json")
        shutil.copy(vocab_bpe, out / "merges.txt")
        (out / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "GPT2Tokenizer", "model_max_length": ckpt.model.config.block_size,
             "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, indent=2))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(ckpt.tokenizer.save(tmp), out / EXPORTED_TOKENIZER)
    return out
