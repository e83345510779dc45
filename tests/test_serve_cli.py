"""`python -m scripts.serve` as a user runs it: serves, refuses a port in use, stops cleanly on SIGTERM/Ctrl-C."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.inference_fixtures import ROOT, char_checkpoint, run_script

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(ckpt, port: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("ATTNGPT_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "scripts.serve", "--ckpt", str(ckpt), "--port", str(port),
                             *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not come up in 60 s")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return char_checkpoint(tmp_path_factory.mktemp("serve") / "tiny", block_size=64)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_running_streams_with_a_finish_reason_and_exits_cleanly(ckpt, sig):
    port = free_port()
    proc = start(ckpt, port)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"] == "tiny"
        lines = []
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                          json={"prompt": "First", "max_tokens": 2000, "stream": True}) as r:
            for line in filter(None, r.iter_lines()):
                lines.append(line)
                if len(lines) == 3:
                    proc.send_signal(sig)
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] == "abort"
        assert len(events) < 2000 and lines[-1] == "data: [DONE]"
        assert proc.wait(timeout=30) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()


def test_port_in_use_is_one_line_and_exit_2(ckpt):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = run_script("scripts.serve", "--ckpt", str(ckpt), "--port", str(port), timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: --port: {port} on 127.0.0.1 is already in use"


@pytest.mark.parametrize("args,words", [
    (["--host", "0.0.0.0"], "give --api-key"),
    (["--max-batch", "0"], "--max-batch"),
    (["--port", "70000"], "--port"),
])
def test_bad_options_are_one_line_and_exit_2(ckpt, args, words):
    r = run_script("scripts.serve", "--ckpt", str(ckpt), *args, timeout=60)
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_missing_checkpoint_is_one_line_and_exit_2(tmp_path):
    r = run_script("scripts.serve", "--ckpt", str(tmp_path / "nope"), "--port", str(free_port()), timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


def test_int8_server_answers_like_the_int8_sampler(ckpt):
    """--quantize int8 reaches the served model: greedy tokens equal scripts.sample --quantize int8's."""
    port = free_port()
    proc = start(ckpt, port, "--quantize", "int8")
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                       json={"prompt": "First", "max_tokens": 12, "temperature": 0})
        served = r.json()["choices"][0]["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    sampled = run_script("scripts.sample", "--ckpt", str(ckpt), "--prompt", "First", "--max-new-tokens", "12",
                         "--temperature", "0", "--quantize", "int8")
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("First" + served) and len(served) == 12


def test_bad_quantize_is_one_line_and_exit_2(ckpt):
    r = run_script("scripts.serve", "--ckpt", str(ckpt), "--port", str(free_port()), "--quantize", "int4")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--quantize" in r.stderr
