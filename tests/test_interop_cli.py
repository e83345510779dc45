"""`scripts.convert` end to end, as a user runs it: each of the three paths (GPT-2, Llama, attngpt) exports, loads in
a fresh transformers process with logits equal to attngpt's, continues a prompt in `pipeline("text-generation")`
exactly as `scripts.sample --temperature 0` does, and comes back through `from-hf` with identical weights. Then
--push-to-hub against a local stand-in of the hub, and the one-line errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
from safetensors.torch import load_file

from data.bpe_train import train_bpe
from data.tokenizers import CharTokenizer, gpt2_tokenizer
from model.checkpoint import load_checkpoint, model_state, save_checkpoint
from tests.hub_standin import HubStandIn
from tests.inference_fixtures import ROOT, TEXT, char_checkpoint, run_script, tiny_model

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
CASES = {  # arch -> (class transformers builds, model settings, tokenizer)
    "gpt2": ("GPT2LMHeadModel", dict(bias=False), gpt2_tokenizer),
    "llama": ("LlamaForCausalLM", dict(positions="rope", norm="rmsnorm", mlp="swiglu", bias=False, n_kv_head=2),
              lambda: CharTokenizer.from_text(TEXT)),
    "attngpt": ("AttnGPTForCausalLM", dict(positions="rope", qk_norm=True, mlp="relu2", bias=False),
                lambda: train_bpe([TEXT * 3], 300)),
}
PROMPT, NEW_TOKENS = "First Citizen:", 12


def probe(folder, ids: torch.Tensor, tmp_path) -> dict:
    """Load `folder` in a fresh interpreter that cannot import attngpt (tests/hf_probe.py)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "hf_probe.py"), str(folder), json.dumps(ids.tolist()),
                          PROMPT, str(NEW_TOKENS), str(tmp_path / "logits.safetensors")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return {**json.loads(res.stdout.splitlines()[-1]), **load_file(str(tmp_path / "logits.safetensors"))}


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(CASES))
def test_export_pipeline_matches_sample_and_round_trip_is_identical(tmp_path, arch):
    cls, settings, make_tokenizer = CASES[arch]
    tokenizer = make_tokenizer()
    model = tiny_model(vocab_size=tokenizer.vocab_size, **settings)
    save_checkpoint(tmp_path / "ckpt", model, tokenizer,
                    {"model": asdict(model.config), "data": {"tokenizer": tokenizer.name, "dir": ""}})
    res = run_script("scripts.convert", "to-hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"))
    assert res.returncode == 0, res.stderr
    assert f"as {cls}" in res.stdout and ("trust_remote_code=True" in res.stdout) == (arch == "attngpt")

    ids = torch.randint(0, tokenizer.vocab_size, (2, 24))
    seen = probe(tmp_path / "hf", ids, tmp_path)
    assert seen["class"] == cls
    with torch.no_grad():
        assert (seen["logits"] - model(ids)[0]).abs().max().item() < 1e-4
    sample = run_script("scripts.sample", "--ckpt", str(tmp_path / "ckpt"), "--prompt", PROMPT,
                        "--temperature", "0", "--max-new-tokens", str(NEW_TOKENS))
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout == seen["text"] + "\n" and len(seen["text"]) > len(PROMPT)

    res = run_script("scripts.convert", "from-hf", "--src", str(tmp_path / "hf"), "--out", str(tmp_path / "back"))
    assert res.returncode == 0, res.stderr
    back = load_checkpoint(tmp_path / "back")
    ours, theirs = model_state(model), model_state(back.model)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert back.model.config == model.config and back.tokenizer.encode(TEXT) == tokenizer.encode(TEXT)


def test_push_to_hub_uploads_the_export_folder(tmp_path):
    char_checkpoint(tmp_path / "ckpt")
    with HubStandIn(token="hf_standin_token") as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_standin_token", "HF_HOME": str(tmp_path / "hf_home"),
               "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0"}  # the suite runs offline; 127.0.0.1 is fine
        res = run_script("scripts.convert", "to-hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"),
                         "--push-to-hub", "tester/tiny-attngpt", "--private", env=env)
    assert res.returncode == 0, res.stderr
    assert f"pushed to {hub.url}/tester/tiny-attngpt" in res.stdout
    created = hub.created["tester/tiny-attngpt"]  # huggingface_hub 1.x sends private, 2.x visibility
    assert created.get("private") is True or created.get("visibility") == "private"
    sent = hub.repos["tester/tiny-attngpt"]
    assert sent == {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= sent.keys()


def test_push_to_hub_without_login_stops_before_writing(tmp_path):
    char_checkpoint(tmp_path / "ckpt")
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_TOKEN": "", "HF_ENDPOINT": "http://127.0.0.1:9"}
    res = run_script("scripts.convert", "to-hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"),
                     "--push-to-hub", "tester/x", env=env)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and "not logged in" in res.stderr
    assert not (tmp_path / "hf").exists()


def test_arch_that_cannot_express_the_model_is_one_line_naming_what_stands_in_the_way(tmp_path):
    model = tiny_model(positions="rope", qk_norm=True, vocab_size=CharTokenizer.from_text(TEXT).vocab_size)
    save_checkpoint(tmp_path / "ckpt", model, CharTokenizer.from_text(TEXT), {"model": asdict(model.config)})
    for arch, named in (("gpt2", "positions = 'rope'"), ("llama", "qk_norm = True")):
        res = run_script("scripts.convert", "to-hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / arch),
                         "--arch", arch)
        assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
        assert res.stderr.startswith(f"error: --arch {arch}: not a ") and named in res.stderr
        assert not (tmp_path / arch).exists()


def test_export_into_a_non_empty_folder_needs_overwrite_and_keeps_what_is_there(tmp_path):
    char_checkpoint(tmp_path / "ckpt")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    res = run_script("scripts.convert", "to-hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"))
    assert res.returncode == 2 and res.stderr.startswith("error: --out") and len(res.stderr.splitlines()) == 1
    assert (tmp_path / "hf" / "notes.txt").read_text() == "mine"
    res = run_script("scripts.convert", "to-hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"),
                     "--overwrite")
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "hf" / "notes.txt").exists() and (tmp_path / "hf" / "tokenizer.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folders left
