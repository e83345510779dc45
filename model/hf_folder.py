"""Hugging Face model folders: export to the closest architecture, import any of the three, push to the hub.

Export picks the first architecture that expresses the model exactly: GPT2LMHeadModel, then LlamaForCausalLM,
then attngpt's own (remote code, model/hf_attngpt.py), which expresses everything. The folder holds
model.safetensors, config.json, generation_config.json and the tokenizer files (data/hf_tokenizer.py); config.json
also keeps attngpt's ModelConfig as `attngpt`, so an import restores settings HF has no name for (no biases,
`attention = "manual"`, ...) and gives back identical weights. Reading parses JSON and safetensors only (or
`torch.load(weights_only=True)` for an old pytorch_model.bin); the modeling file of a folder is never executed here.
"""
from __future__ import annotations

import json
import pickle
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from data.atomic import atomic_dir
from data.hf_tokenizer import HF_TOKENIZER, read_hf_tokenizer, write_hf_tokenizer
from data.tokenizers import TOKENIZER_FILE, Tokenizer, gpt2_tokenizer, load_tokenizer
from model.checkpoint import Checkpoint, imported_run_config, load_state, model_config_from_dict
from model.config import ModelConfig
from model.gpt import GPT
from model import hf_attngpt, hf_gpt2, hf_llama

ARCHS = {"gpt2": hf_gpt2, "llama": hf_llama, "attngpt": hf_attngpt}  # "auto" takes the first that fits
LABELS = {"gpt2": "GPT-2", "llama": "Llama", "attngpt": "attngpt"}
HUB_NAMES = {"gpt2": "openai-community/gpt2", "gpt2-medium": "openai-community/gpt2-medium",
             "gpt2-large": "openai-community/gpt2-large", "gpt2-xl": "openai-community/gpt2-xl"}
LEGACY_TOKENIZER = "attngpt_tokenizer.json"  # where earlier exports kept a tokenizer HF could not read
WEIGHTS, CONFIG, GENERATION_CONFIG = "model.safetensors", "config.json", "generation_config.json"


# --- out --------------------------------------------------------------------------------------------------------

def choose_arch(config: ModelConfig, arch: str = "auto") -> str:
    """The architecture to export as: `arch`, checked, or for "auto" the first native one that fits."""
    if arch == "auto":
        return next(name for name, module in ARCHS.items() if not module.problems(config))
    if arch not in ARCHS:
        raise ValueError(f"arch: {arch!r} is not one of auto, {', '.join(ARCHS)}")
    wrong = ARCHS[arch].problems(config)
    if wrong:
        raise ValueError(f"not a {LABELS[arch]}-shaped model: " + "; ".join(wrong))
    return arch


def check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ValueError(f"{out} already exists and is not empty (pass overwrite to replace it)")


def export_hf(ckpt: Checkpoint, out_dir: str | Path, arch: str = "auto", overwrite: bool = False) -> str:
    """Write `ckpt` as a Hugging Face folder; return the architecture chosen. The folder is built beside `out_dir`
    and renamed into place, so an existing folder is replaced only by a complete one."""
    config = ckpt.model.config
    name = choose_arch(config, arch)
    module = ARCHS[name]
    out = Path(out_dir)
    check_out_dir(out, overwrite)
    with atomic_dir(out) as tmp:
        hf = {**module.hf_config(config, ckpt.tokenizer), "attngpt": asdict(config)}
        save_file(module.state_to_hf(ckpt.model), str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(hf, indent=2))
        (tmp / GENERATION_CONFIG).write_text(json.dumps(
            {"bos_token_id": hf["bos_token_id"], "eos_token_id": hf["eos_token_id"], "use_cache": hf["use_cache"]},
            indent=2))
        write_hf_tokenizer(ckpt.tokenizer, tmp, config.block_size)
        if module is hf_attngpt:
            hf_attngpt.write_extra_files(tmp)
    return name


# --- in ---------------------------------------------------------------------------------------------------------

def hf_arch(path: Path) -> str | None:
    """The architecture of an HF folder (its config.json's model_type), or None if it is not one we read."""
    try:
        model_type = json.loads((path / CONFIG).read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return next((name for name, module in ARCHS.items() if module.MODEL_TYPE == model_type), None)


def _read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    st, binary = directory / WEIGHTS, directory / "pytorch_model.bin"
    try:
        if st.is_file():
            return load_file(str(st))
        if binary.is_file():
            return torch.load(binary, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, pickle.UnpicklingError, RuntimeError, ValueError) as e:
        raise ValueError(f"{directory}: unreadable weights ({type(e).__name__}: {str(e)[:120]})") from None
    raise ValueError(f"{directory}: no {WEIGHTS} or pytorch_model.bin")


def _hf_tokenizer(directory: Path, arch: str, vocab_size: int) -> Tokenizer:
    """The folder's tokenizer.json, else an earlier export's attngpt tokenizer, else GPT-2's BPE for a GPT-2."""
    if (directory / HF_TOKENIZER).is_file():
        return read_hf_tokenizer(directory)
    if (directory / LEGACY_TOKENIZER).is_file():
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(directory / LEGACY_TOKENIZER, Path(tmp) / TOKENIZER_FILE)
            return load_tokenizer(tmp)
    if arch == "gpt2" and vocab_size >= hf_gpt2.GPT2_VOCAB:
        return gpt2_tokenizer()
    raise ValueError(f"{directory}: no {HF_TOKENIZER} says which tokenizer goes with this model")


def _restore_saved(module, hf: dict, config: ModelConfig, tokenizer: Tokenizer) -> ModelConfig:
    """attngpt's own ModelConfig from config.json when it still describes the HF fields beside it."""
    try:
        saved = model_config_from_dict(hf["attngpt"])
        same = module.config_from_hf(module.hf_config(saved, tokenizer)) == config
    except (KeyError, TypeError, ValueError):
        return config
    return saved if same else config


def load_hf(path_or_name: str | Path, device: str | torch.device = "cpu") -> Checkpoint:
    """A GPT-2, Llama or attngpt HF folder (config.json + weights + tokenizer), or a GPT-2 hub name."""
    directory = Path(path_or_name)
    if not directory.exists():
        directory = download_hf_gpt2(str(path_or_name))
    try:
        hf = json.loads((directory / CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{directory}: no readable {CONFIG} ({e})") from None
    arch = hf_arch(directory)
    if arch is None:
        raise ValueError(f"{directory}: model_type {hf.get('model_type')!r} is not one of "
                         f"{', '.join(m.MODEL_TYPE for m in ARCHS.values())}")
    module = ARCHS[arch]
    config = module.config_from_hf(hf, str(directory / CONFIG))
    weights = _read_hf_weights(directory)
    tokenizer = _hf_tokenizer(directory, arch, config.vocab_size)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{directory}: the tokenizer has {tokenizer.vocab_size} ids, the model {config.vocab_size}")
    if module is not hf_attngpt:
        config = _restore_saved(module, hf, config, tokenizer)
    model = GPT(config)
    state = module.state_from_hf(weights, config, str(directory))
    load_state(model, state, f"{directory}: weights do not match a {LABELS[arch]} of this config")
    model.to(device).eval()
    return Checkpoint(model=model, tokenizer=tokenizer, config=imported_run_config(config, tokenizer.name),
                      path=directory)


def download_hf_gpt2(name: str) -> Path:
    """Fetch config.json and model.safetensors of an official GPT-2 from the hub (needs network)."""
    repo = HUB_NAMES.get(name, name)
    if repo not in HUB_NAMES.values():
        raise ValueError(f"{name}: no such path, and not a GPT-2 hub name ({', '.join(HUB_NAMES)})")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, allow_patterns=[CONFIG, WEIGHTS]))
    except Exception as e:  # noqa: BLE001 - offline, DNS, HTTP errors all mean the same to the user
        raise ValueError(f"could not download {repo} from the Hugging Face hub ({type(e).__name__}); "
                         "pass a local GPT-2 directory instead") from None


# --- up ---------------------------------------------------------------------------------------------------------

def check_logged_in() -> None:
    """Raise unless a hub token is at hand (HF_TOKEN, or the file `hf auth login` writes)."""
    from huggingface_hub import get_token

    if get_token() is None:
        raise ValueError("push to hub: not logged in to Hugging Face (run `hf auth login`, or set HF_TOKEN)")


def push_to_hub(folder: str | Path, repo_id: str, private: bool = False) -> str:
    """Upload an export folder to the hub (HF_ENDPOINT, HF_TOKEN and `hf auth login` apply); return its URL."""
    from huggingface_hub import HfApi

    check_logged_in()
    api = HfApi()
    try:
        url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(folder),
                          commit_message="Upload attngpt export")
    except Exception as e:  # noqa: BLE001 - network, auth and HTTP errors all end the same way for the user
        detail = (str(e).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"push to hub: uploading {repo_id} failed ({type(e).__name__}: {detail})") from None
    return str(url)
