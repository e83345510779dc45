"""The run directory (train.out_dir): who may write into it, whether a run continues there, and clearing it.

One live process trains into an out_dir at a time. The lock is an advisory `flock` on `out_dir/.lock`, which the
kernel drops when its holder exits in any way (kill -9 included), so a stale lock file never blocks a resume: only a
live holder does. The file's text names the holder (pid, host) for the refusal message. Under torchrun, rank 0 takes
the lock for the whole job.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from data.atomic import is_temp_name
from data.meta import read_meta
from model.checkpoint import read_run_config, resolve_checkpoint_dir
from model.run_data import KEY as DATA_LOCATION
from train.config import RunConfig

LOCK_FILE = ".lock"
RUN_ARTIFACTS = ("metrics.jsonl", "samples.txt", "latest", "best", ".latest.old", ".best.old", "attention", "wandb",
                 "tensorboard")


class RunLock:
    """Held from `acquire` until `release` (or the process's end); a second holder is refused with ValueError."""

    def __init__(self, out: Path):
        self.path = Path(out) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise ValueError(f"train.out_dir: {self.path.parent} is in use by a live run ({holder}); wait for it to "
                             "finish or stop it, or pick another out_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on host {info['host']}, since {info.get('started', '?')}"
    except (ValueError, KeyError, OSError):
        return "holder unknown: the lock file is being written"


def holds_run(out: Path) -> bool:
    return any((out / name).exists() for name in ("metrics.jsonl", "latest", "best", ".latest.old"))


# What a resume may change. The model's shape and the data's identity are the run; its schedule, budget, evaluation
# and logging may be adjusted (a longer run, a lower lr, more frequent evals). Dropout changes no weight.
FROZEN_SECTIONS = ("model", "data")
MAY_CHANGE = {"model.dropout", "data.dir", "data.path", "data.num_proc", "data.dtype", "data.shard_tokens",
              "data.streaming"}
FROZEN_TRAIN = {"train.optimizer", "train.seed", "train.batch_size", "train.grad_accum"}
WORLD_SIZE = "world_size"  # config.json: how many processes trained the run


def config_changes(saved: dict, wanted: dict) -> list[tuple[str, object, object]]:
    """(section.key, saved value, new value) for every field that differs, in section order."""
    out = []
    for section in ("model", "data", "train", "log"):
        old, new = saved.get(section) or {}, wanted.get(section) or {}
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                out.append((f"{section}.{key}", old.get(key), new.get(key)))
    return out


def frozen(key: str) -> bool:
    return (key.split(".")[0] in FROZEN_SECTIONS and key not in MAY_CHANGE) or key in FROZEN_TRAIN


def resume_point(cfg: RunConfig, out: Path, world_size: int = 1) -> Path | None:
    """The checkpoint to continue from, or None; refuses an out_dir holding another run unless overwrite.

    A resume compares the saved config with this one field by field: a change to a frozen field (the model's shape,
    the data's identity, the optimizer, batch or seed) is another run and is refused with the fields named; other
    changes are applied and listed on stderr. data.path may change (a moved corpus) because the text itself is
    checked after preparing (`check_same_text`). On another number of processes, grad_accum changes with it
    (`_keep_micro_batches`).
    """
    if cfg.train.resume == "auto" and ((out / "latest").exists() or (out / ".latest.old").exists()):
        latest = resolve_checkpoint_dir(out / "latest" if (out / "latest").exists() else out / ".latest.old")
        if latest.name == "best":
            return None
        saved = read_run_config(latest)
        asked_accum = cfg.train.grad_accum
        _keep_micro_batches(cfg, saved, world_size)
        wanted = cfg.to_dict()
        if wanted["model"]["vocab_size"] == 0:  # "take it from the data": the saved run has the resolved number
            wanted["model"]["vocab_size"] = saved.get("model", {}).get("vocab_size")
        changes = config_changes(saved, wanted)
        blocked = [c for c in changes if frozen(c[0])]
        if blocked:
            if cfg.train.overwrite:
                cfg.train.grad_accum = asked_accum  # a new run: as asked
                return None
            named = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in blocked[:3])
            more = f" and {len(blocked) - 3} more" if len(blocked) > 3 else ""
            raise ValueError(f"train.out_dir: {out} holds a different run ({named}{more}); pick another out_dir "
                             "or set train.overwrite = true")
        shown = [c for c in changes if c[0] not in ("train.resume", "train.overwrite", "log.probe_prompt")]
        if shown:
            print("resuming with changed settings: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in shown),
                  file=sys.stderr)
        return latest
    if holds_run(out) and not cfg.train.overwrite:
        if cfg.train.resume == "auto":
            raise ValueError(f"train.out_dir: {out} holds a run with no checkpoint to resume from; "
                             "replace it with train.overwrite = true")
        raise ValueError(f"train.out_dir: {out} already holds a run; continue it with train.resume = \"auto\" "
                         "or replace it with train.overwrite = true")
    return None


def _keep_micro_batches(cfg: RunConfig, saved: dict, world_size: int) -> None:
    """A step holds grad_accum x world_size micro-batches, and the loader deals the same windows to them however
    they are split (data/loader.py): on another number of processes grad_accum takes up the difference, so the run
    goes on with the same steps. An explicit grad_accum is accepted when it keeps the product."""
    saved_world, saved_accum = saved.get(WORLD_SIZE, 1), (saved.get("train") or {}).get("grad_accum")
    if saved_world == world_size or not isinstance(saved_accum, int):
        return
    micro = saved_accum * saved_world
    if cfg.train.grad_accum == saved_accum:
        if micro % world_size:
            raise ValueError(f"train.grad_accum: the run takes {saved_accum} micro-batches x {saved_world} processes "
                             f"= {micro} per step, which {world_size} processes cannot share evenly; resume on a "
                             f"number of processes that divides {micro}")
        cfg.train.grad_accum = micro // world_size
        print(f"resuming on {world_size} processes instead of {saved_world}: train.grad_accum {saved_accum} -> "
              f"{cfg.train.grad_accum}, so each step still takes {micro} micro-batches", file=sys.stderr)
    if cfg.train.grad_accum * world_size == micro:
        saved["train"]["grad_accum"] = cfg.train.grad_accum  # the same steps: not a frozen change


def check_same_text(checkpoint: Path, data_dir: str) -> None:
    """A resumed run must see the text it trained on, wherever data.path or data.dir now point."""
    want = (read_run_config(checkpoint).get(DATA_LOCATION) or {}).get("text_sha256")
    have = read_meta(data_dir)["text_sha256"]
    if want and have != want:
        raise ValueError(f"data: {data_dir} holds other text (sha256 {have[:12]}...) than the run being resumed "
                         f"trained on ({want[:12]}...); point data.path at the original corpus")


def clear_run(out: Path) -> None:
    """Remove a previous run's outputs (not the lock, which the current run holds)."""
    leftovers = [p.name for p in out.iterdir() if is_temp_name(p.name)] if out.exists() else []  # cut short
    for name in (*RUN_ARTIFACTS, *leftovers):
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
