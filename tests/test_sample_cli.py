"""python -m scripts.sample as a user runs it: streaming, seeds, stop strings, interactive mode, one-line errors."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from model.checkpoint import load_checkpoint
from model.inference import SamplingSettings, generate, make_generator
from model.text_stream import generate_text, stream_text
from scripts import sample
from tests.inference_fixtures import ROOT, char_checkpoint, run_main_inprocess, run_script

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return char_checkpoint(tmp_path_factory.mktemp("run") / "best").parent  # a run folder: best/ is found


def test_tokens_reach_stdout_while_generation_is_still_running(ckpt_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "scripts.sample", "--ckpt", str(ckpt_dir), "--prompt", "All:",
                             "--max-new-tokens", "100000", "--seed", "1"], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = proc.stdout.read(8)
        assert first.startswith(b"All:") and len(first) == 8  # prompt echoed, then continuation tokens
        assert proc.poll() is None  # 100000 tokens are far from done: the output was streamed
    finally:
        proc.kill()
        proc.wait()


def test_cli_text_equals_in_process_sampling_with_the_same_seed_and_stop(ckpt_dir, tmp_path):
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("First Citizen:\n")
    ckpt = load_checkpoint(ckpt_dir)
    s = SamplingSettings(temperature=1.0, top_k=10, top_p=0.95, repetition_penalty=1.1)
    full = generate_text(ckpt.model, ckpt.tokenizer, "First Citizen:\n", 80, s, num_samples=2, seed=9)
    stop = full[0][20:22]
    expected = generate_text(ckpt.model, ckpt.tokenizer, "First Citizen:\n", 80, s, num_samples=2, seed=9, stop=[stop])
    assert expected[0] == full[0][:full[0].index(stop)]
    res = run_script("scripts.sample", "--ckpt", str(ckpt_dir), "--prompt-file", str(prompt_file), "--seed", "9",
                     "--max-new-tokens", "80", "--temperature", "1", "--top-k", "10", "--top-p", "0.95",
                     "--repetition-penalty", "1.1", "--num-samples", "2", "--stop", stop.replace("\n", "\\n"))
    assert res.returncode == 0, res.stderr
    sep = f"\n{sample.SEPARATOR}\n"
    assert res.stdout == "".join(f"First Citizen:\n{t}{sep}" for t in expected)


def test_stdin_prompt_greedy_past_block_size_equals_argmax_decoding(ckpt_dir):
    res = run_script("scripts.sample", "--ckpt", str(ckpt_dir), "--temperature", "0", "--max-new-tokens", "70",
                     "--no-echo", "--window-shift", "1", input="Speak, speak.")
    assert res.returncode == 0, res.stderr
    ckpt = load_checkpoint(ckpt_dir)
    ids = torch.tensor([ckpt.tokenizer.encode("Speak, speak.")])
    with torch.no_grad():
        for _ in range(70):  # 13 + 70 tokens > block_size 32: nanoGPT's crop-to-the-last-block
            ids = torch.cat([ids, ckpt.model(ids[:, -32:])[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert res.stdout == ckpt.tokenizer.decode(ids[0, 13:].tolist()) + "\n"


def test_interactive_mode_streams_each_prompt_and_survives_a_bad_one(ckpt_dir):
    res = run_script("scripts.sample", "--ckpt", str(ckpt_dir), "-i", "--seed", "3", "--max-new-tokens", "30",
                     input="All:\nZ€\nSpeak\n")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("error:") == 1 and "'€'" in res.stderr
    ckpt = load_checkpoint(ckpt_dir)
    gen = make_generator(3)
    expected = ""
    for prompt in ("All:", "Speak"):
        ids = ckpt.tokenizer.encode(prompt)
        s = SamplingSettings(temperature=0.8, top_k=200)
        expected += "".join(c for _, c in stream_text(ckpt.model, ckpt.tokenizer, ids, 30, s, generator=gen)) + "\n"
    assert res.stdout == expected


BAD = [
    (["--max-new-tokens", "-1"], "--max-new-tokens"),
    (["--max-new-tokens", "1000000000"], "absurdly large"),
    (["--temperature", "-0.5"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--top-k", "-3"], "--top-k"),
    (["--repetition-penalty", "0"], "--repetition-penalty"),
    (["--prompt", "hello €"], "not in the char vocabulary"),
    (["--num-samples", "0"], "--num-samples"),
    (["--threads", "-2"], "--threads"),
]


@pytest.mark.parametrize("argv, message", BAD)
def test_bad_input_is_one_line_and_exit_2(ckpt_dir, monkeypatch, capsys, argv, message):
    code, _, err = run_main_inprocess(sample.main, ["--ckpt", str(ckpt_dir), *argv], monkeypatch, capsys)
    assert code == 2 and err.startswith("error:") and message in err and len(err.splitlines()) == 1


def test_threads_sets_torchs_cpu_threads(ckpt_dir, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)  # the real call would outlive this test
    code, out, err = run_main_inprocess(sample.main, ["--ckpt", str(ckpt_dir), "--threads", "1", "--prompt", "a", "--max-new-tokens",
                                                      "3"], monkeypatch, capsys)
    assert code == 0 and asked == [1], err


def test_missing_and_corrupt_checkpoints_are_one_line_errors(tmp_path, monkeypatch, capsys):
    code, _, err = run_main_inprocess(sample.main, ["--ckpt", str(tmp_path / "nope")], monkeypatch, capsys)
    assert code == 2 and "does not exist" in err and len(err.splitlines()) == 1
    broken = char_checkpoint(tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"\x00garbage")
    code, _, err = run_main_inprocess(sample.main, ["--ckpt", str(broken)], monkeypatch, capsys)
    assert code == 2 and "corrupt checkpoint" in err and len(err.splitlines()) == 1
    (broken / "model.safetensors").unlink()
    broken2 = char_checkpoint(tmp_path / "broken2")
    (broken2 / "config.json").write_text('{"model": {"n_layer": "two"}}')
    code, _, err = run_main_inprocess(sample.main, ["--ckpt", str(broken2)], monkeypatch, capsys)
    assert code == 2 and err.startswith("error:") and len(err.splitlines()) == 1


def test_bad_input_exit_code_from_a_real_process(ckpt_dir):
    res = run_script("scripts.sample", "--ckpt", str(ckpt_dir), "--top-p", "2")
    assert res.returncode == 2 and res.stdout == "" and res.stderr.strip().count("\n") == 0
    assert res.stderr.startswith("error: --top-p")


def test_help_shows_every_option_with_its_default():
    parser = sample.build_parser()
    text = parser.format_help()
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    for action in options:
        assert action.option_strings[-1] in text
    assert text.count("(default:") == len(options)


def test_empty_prompt_of_a_char_vocabulary_starts_from_a_newline(ckpt_dir, monkeypatch, capsys):
    """A char vocabulary has no end-of-text token: its start is the newline its documents are separated by."""
    code, out, _ = run_main_inprocess(sample.main, ["--ckpt", str(ckpt_dir), "--prompt", "", "--temperature", "0",
                                                    "--max-new-tokens", "15"], monkeypatch, capsys)
    ckpt = load_checkpoint(ckpt_dir)
    ids = generate(ckpt.model, ckpt.tokenizer.encode("\n"), 15, SamplingSettings(temperature=0))
    assert code == 0 and out == ckpt.tokenizer.decode(ids[0, 1:].tolist()) + "\n"


def test_unescape_understands_newline_tab_and_backslash_only():
    assert sample.unescape(r"a\nb\tc\\n é\x") == "a\nb\tc\\n é\\x"


def test_greedy_is_the_same_through_generate(ckpt_dir, monkeypatch, capsys):
    code, out, _ = run_main_inprocess(sample.main, ["--ckpt", str(ckpt_dir), "--prompt", "All:", "--temperature", "0",
                                                    "--max-new-tokens", "20"], monkeypatch, capsys)
    ckpt = load_checkpoint(ckpt_dir)
    ids = generate(ckpt.model, ckpt.tokenizer.encode("All:"), 20, SamplingSettings(temperature=0))
    assert code == 0 and out == ckpt.tokenizer.decode(ids[0].tolist()) + "\n"


@pytest.mark.parametrize("usable, busy, chosen", [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 2.0, 1),
                                                  (8, 1.0, 4), (2, None, 2)])
def test_auto_threads_leaves_out_the_cores_other_processes_keep_busy(usable, busy, chosen):
    from scripts.inference_args import auto_threads
    default = 4 if usable == 8 else 2  # torch's default: one thread per physical core
    assert auto_threads(default, usable, busy) == chosen


def test_threads_auto_is_the_default_and_takes_fewer_where_cores_are_busy(ckpt_dir, monkeypatch, capsys):
    from train import runtime
    asked = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(runtime, "cores_busy_elsewhere", lambda: 1.0)
    argv = ["--ckpt", str(ckpt_dir), "--prompt", "a", "--max-new-tokens", "3"]
    code, _, err = run_main_inprocess(sample.main, argv, monkeypatch, capsys)
    assert code == 0 and asked == [1] and "threads:" not in err, err  # stderr is no terminal here: nothing said
    monkeypatch.setattr(runtime, "cores_busy_elsewhere", lambda: 0.1)  # an idle machine keeps torch's default
    code, _, err = run_main_inprocess(sample.main, argv, monkeypatch, capsys)
    assert code == 0 and asked == [1], err


def test_threads_auto_tells_a_terminal_what_it_chose(monkeypatch):
    import io
    import sys

    from scripts.inference_args import set_threads
    from train import runtime

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    asked = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(runtime, "cores_busy_elsewhere", lambda: 0.9)
    monkeypatch.setattr(sys, "stderr", Terminal())
    set_threads("auto")
    assert asked == [1]
    assert sys.stderr.getvalue() == ("threads: 1 of torch's 2, as other processes keep 0.9 cores busy "
                                     "(--threads N to choose)\n")
