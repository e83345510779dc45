"""--quantize int8 (model/quantize.py): what it changes, how close it stays, and how the scripts take it."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from data.config import DataConfig
from data.prepare import prepare
from data.tokenizers import load_tokenizer
from model.checkpoint import load_checkpoint
from model.inference import SamplingSettings, generate
from model.quantize import Int8Linear, check_quantize, quantize_model
from scripts import evaluate, sample
from scripts.attention import main as attention_main
from tests.inference_fixtures import (TEXT, char_checkpoint, run_main_inprocess, run_script,
                                      tiny_model)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    (root / "corpus.txt").write_text(TEXT * 5)
    data = prepare(DataConfig(source="files", path=str(root / "corpus.txt"), dir=str(root / "data"),
                              val_fraction=0.2), verbose=False)
    return root, char_checkpoint(root / "run" / "best", data_dir=str(data), tokenizer=load_tokenizer(data))


def unpacked(layer: Int8Linear) -> torch.Tensor:
    """The int8 weight fbgemm holds, as a quantized tensor."""
    weight, _ = torch.ops.quantized.linear_unpack(layer._packed)
    return weight


def test_every_linear_becomes_int8_per_output_channel_and_the_embedding_stays():
    model = tiny_model(bias=True)
    before = {name: m.weight.detach().clone() for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    wte = model.wte.weight.detach().clone()
    assert model.lm_head.weight is model.wte.weight  # tied: the head must get its own int8 copy
    quantize_model(model, "int8")
    layers = {name: m for name, m in model.named_modules() if isinstance(m, Int8Linear)}
    assert set(layers) == set(before) and "lm_head" in layers
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert torch.equal(model.wte.weight, wte) and model.wte.weight.dtype == torch.float32
    for name, layer in layers.items():
        w = unpacked(layer)
        assert w.dtype == torch.qint8 and w.q_per_channel_axis() == 0  # one scale per output row
        assert not w.q_per_channel_zero_points().any()  # symmetric
        scale = w.q_per_channel_scales().float()
        ref = before[name]
        assert torch.allclose(scale, ref.abs().amax(dim=1) / 127.5, rtol=1e-5)  # torchao's symmetric int8 scale
        assert ((w.dequantize() - ref).abs() <= scale[:, None] / 2 + 1e-7).all()  # rounded to the nearest step


def test_int8_logits_stay_close_and_greedy_decoding_runs():
    model = tiny_model(bias=True)
    idx = torch.randint(0, 40, (3, 20))
    with torch.no_grad():
        ref = model(idx)[0]
        out = quantize_model(model, "int8")(idx)[0]
    rel = (out - ref).norm() / ref.norm()
    assert 0 < rel < 0.05, rel  # changed (it is int8), but only by rounding noise
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8
    cont = generate(model, idx[:1, :5], 12, SamplingSettings(temperature=0.0))
    assert cont.shape == (1, 17) and bool((cont[:, 5:] < 40).all())


def test_fp32_decode_is_untouched_by_quantizing_a_copy():
    import copy
    model = tiny_model()
    greedy = SamplingSettings(temperature=0.0)
    before = generate(model, [[1, 2, 3]], 10, greedy)
    quantize_model(copy.deepcopy(model), "int8")
    assert torch.equal(generate(model, [[1, 2, 3]], 10, greedy), before)


@pytest.mark.parametrize("mode, device, dtype, message", [
    ("int4", "cpu", torch.float32, "unknown value 'int4'"),
    ("int8", "cpu", torch.bfloat16, "quantize: int8 on cpu needs dtype float32"),
    ("int8", "mps", torch.float32, "runs on cpu or cuda, not mps"),
])
def test_unsupported_requests_are_refused_in_one_line(mode, device, dtype, message):
    with pytest.raises(ValueError, match=message) as e:
        check_quantize(mode, torch.device(device), dtype)
    assert "\n" not in str(e.value)
    check_quantize("none", torch.device(device), dtype)  # nothing asked, nothing refused


def test_evaluate_prints_full_precision_and_int8_side_by_side(setup, monkeypatch, capsys):
    root, ckpt = setup
    code, out, err = run_main_inprocess(evaluate.main, ["--ckpt", str(ckpt), "--quantize", "int8", "--json"],
                                        monkeypatch, capsys)
    assert code == 0, err
    (r,) = json.loads(out)
    plain = evaluate.mean_loss(load_checkpoint(ckpt).model, *_val(ckpt))[0]
    assert r["loss"] == pytest.approx(plain, abs=1e-5) and r["quantize"] == "int8" and r["dtype"] == "float32"
    assert r["int8_loss"] != r["loss"] and abs(r["int8_loss_change"]) < 0.05
    assert r["int8_loss_change"] == pytest.approx(r["int8_loss"] / r["loss"] - 1, abs=1e-5)
    code, out, _ = run_main_inprocess(evaluate.main, ["--ckpt", str(ckpt), "--quantize", "int8"], monkeypatch, capsys)
    lines = out.splitlines()
    assert code == 0 and lines[3].split() == ["float32", "int8"]
    assert lines[4].split()[:3] == ["loss", f"{r['loss']}", f"{r['int8_loss']}"] and "%)" in lines[4]


def _val(ckpt):
    ck = load_checkpoint(ckpt)
    tokens = evaluate.split_tokens(ck, "val")[0]
    return tokens, 8


def test_sample_and_attention_run_int8(setup, tmp_path, monkeypatch, capsys):
    root, ckpt = setup
    code, out, err = run_main_inprocess(sample.main, ["--ckpt", str(ckpt), "--prompt", "All:", "--temperature", "0",
                                                      "--max-new-tokens", "20", "--quantize", "int8"],
                                        monkeypatch, capsys)
    assert code == 0 and out.startswith("All:") and len(out) > len("All:") + 5, err
    code, out, err = run_main_inprocess(lambda: attention_main(["--ckpt", str(ckpt), "--prompt", "Speak, speak.",
                                                                "--quantize", "int8", "--out", str(tmp_path / "a")]),
                                        [], monkeypatch, capsys)
    assert code == 0 and (tmp_path / "a" / "attention.html").exists(), err


UNKNOWN = (["--quantize", "int3"], "--quantize: unknown value 'int3'")
BF16 = (["--quantize", "int8", "--dtype", "bfloat16"], "needs --dtype float32")


@pytest.mark.parametrize("script, extra, argv, message", [
    ("scripts.sample", [], *UNKNOWN), ("scripts.sample", [], *BF16),
    ("scripts.evaluate", [], *UNKNOWN), ("scripts.evaluate", [], *BF16),
    ("scripts.attention", ["--prompt", "x"], *UNKNOWN),  # no --dtype there: it runs the checkpoint as saved
])
def test_bad_quantize_is_one_line_and_exit_2_before_loading(tmp_path, script, extra, argv, message):
    res = run_script(script, "--ckpt", str(tmp_path / "missing"), *extra, *argv)  # refused before the missing ckpt
    assert res.returncode == 2 and res.stderr.startswith("error: ") and message in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_int8_linear_matches_its_dequantized_weights_on_rounded_inputs():
    """fbgemm rounds the input to 7-bit unsigned steps per call; redoing that by hand gives its output."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    x = torch.randn(5, 64)
    ref_lin = nn.Linear(64, 48)
    ref_lin.load_state_dict(lin.state_dict())
    holder = nn.Sequential(lin)
    quantize_model(holder, "int8")
    layer = holder[0]
    w = unpacked(layer).dequantize()
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (hi - lo) / 127
    zero = round(-lo / scale)
    xq = (torch.clamp(torch.round(x / scale) + zero, 0, 127) - zero) * scale
    expect = F.linear(xq, w, ref_lin.bias)
    with torch.no_grad():
        got = layer(x)
    assert torch.allclose(got, expect, atol=1e-3, rtol=1e-3), (got - expect).abs().max()
    assert not torch.allclose(got, F.linear(x, w, ref_lin.bias), atol=1e-5)  # the input rounding is real


def test_comparison_table_gains_int8_columns(setup, monkeypatch, capsys):
    root, ckpt = setup
    code, out, err = run_main_inprocess(evaluate.main, ["--ckpt", str(ckpt), "--ckpt", str(ckpt), "--quantize", "int8"],
                                        monkeypatch, capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[-3:] == ["int8", "loss", "change"], err
    assert lines[2].endswith("%") and lines[2].split()[-3] != lines[2].split()[-2]  # fp32 and int8 losses differ


def test_bench_on_a_checkpoint_and_the_kernel_comparison(setup):
    root, ckpt = setup
    res = run_script("scripts.bench_decode", "--ckpt", str(ckpt), "--new-tokens", "3", "--prompt-tokens", "4",
                     "--skip-sampling", "--skip-hf", "--threads", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    names = [line[:38].strip() for line in res.stdout.splitlines() if line.startswith("attngpt")]
    assert names == ["attngpt cached, greedy", "attngpt cached, int8, greedy", "attngpt full recompute, greedy"]
    res = run_script("scripts.bench_decode", "--ckpt", str(ckpt), "--int8-kernels", "--rounds", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    rows = {line[:40].strip(): line.split()[-1] for line in res.stdout.splitlines()[1:]}
    assert list(rows) == ["fp32 Linear, oneDNN (the floor)", "fbgemm int8 (used on CPU)", "torchao Int8WeightOnlyConfig",
                          "torch._weight_int8pack_mm"]
    assert rows["fp32 Linear, oneDNN (the floor)"] == "1.00x" and all(r.endswith("x") for r in rows.values())
