"""The TensorBoard backend: event files read back with TensorBoard's own reader hold what metrics.jsonl holds,
the samples, the attention images and the hparams; a resumed run appends with no step twice."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.hparams import plugin_data_pb2

from train.loop import train
from train.tensorboard_log import drop_events_after, flat_hparams

pytestmark = pytest.mark.slow


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def read_events(run: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars_of_jsonl(run: Path) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for record in metrics(run):
        for key, value in record.items():
            if key != "step" and (value is None or isinstance(value, (int, float))):
                out.setdefault(key, {})[record["step"]] = math.nan if value is None else float(value)
    return out


def assert_events_match_metrics(run: Path) -> EventAccumulator:
    acc = read_events(run)
    want = scalars_of_jsonl(run)
    assert set(acc.Tags()["scalars"]) == set(want)
    for tag, by_step in want.items():
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{tag}: a step written twice: {steps}"
        assert steps == sorted(by_step), tag
        for e in events:  # TensorBoard keeps float32
            assert e.value == pytest.approx(by_step[e.step], rel=1e-6, abs=1e-6, nan_ok=True), (tag, e.step)
    return acc


@pytest.fixture
def tb_config(tiny_config):
    tiny_config.log.tensorboard = True
    tiny_config.log.attention = True
    tiny_config.log.sample_tokens = 12
    tiny_config.train.log_interval = 1
    tiny_config.train.eval_interval = 5
    return tiny_config


def test_event_files_hold_every_scalar_the_samples_images_and_hparams(tb_config):
    train(tb_config)
    run = Path(tb_config.train.out_dir)
    acc = assert_events_match_metrics(run)
    scalars = set(acc.Tags()["scalars"])
    assert {"train/loss", "val/loss", "lr", "grad_norm", "tokens/s", "mfu", "attn/max_induction"} <= scalars
    for tag in ("attn/grid", "attn/head_scores"):
        images = acc.Images(tag)
        assert [im.step for im in images] == [5, 10, 15, 20]
        assert images[0].width > 100 and images[0].height > 100
        assert images[0].encoded_image_string.startswith(b"\x89PNG")
    samples = acc.Tensors("samples/text_summary")
    assert [t.step for t in samples] == [5, 10, 15, 20]
    assert b"sample 1:" in samples[0].tensor_proto.string_val[0]
    table = acc.Tensors("attn/head_stats/text_summary")[0].tensor_proto.string_val[0].decode()
    assert len(table.splitlines()) == 2 + 2 * 2 and "induction" in table  # header, rule, 2 layers x 2 heads
    start = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    assert hparams["model.n_layer"].number_value == 2 and hparams["train.optimizer"].string_value == "adamw"
    experiment = acc.SummaryMetadata("_hparams_/experiment").plugin_data.content
    metric_tags = [m.name.tag for m in plugin_data_pb2.HParamsPluginData.FromString(experiment).experiment.metric_infos]
    assert metric_tags == ["val/best_loss"]


def test_resume_after_a_kill_past_the_checkpoint_has_no_duplicate_steps(tb_config, tmp_path):
    run = Path(tb_config.train.out_dir)
    tb_config.train.stop_at = 10
    train(tb_config)
    shutil.copytree(run / "latest", tmp_path / "latest_at_10")
    tb_config.train.stop_at, tb_config.train.resume = 0, "auto"
    train(tb_config)  # steps 11..20 reach metrics.jsonl and the event files ...
    shutil.rmtree(run / "latest")
    shutil.copytree(tmp_path / "latest_at_10", run / "latest")  # ... but, as after a kill, latest/ is at step 10
    assert max(e.step for e in read_events(run).Scalars("train/loss")) == 20
    train(tb_config)
    acc = assert_events_match_metrics(run)
    assert [e.step for e in acc.Scalars("val/loss")] == [5, 10, 15, 20]
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 21))
    assert [im.step for im in acc.Images("attn/grid")] == [5, 10, 15, 20]
    files = sorted((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 3  # one file per process, appended
    starts = [v for f in files for e in EventFileLoader(str(f)).Load() for v in e.summary.value
              if v.tag == "_hparams_/session_start_info"]
    assert len(starts) == 1  # the config is written once, by the first process


def test_drop_events_after_keeps_only_earlier_steps(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path)) as w:
        for step in range(1, 8):
            w.add_scalar("x", step * 1.5, step)
    assert drop_events_after(tmp_path, 4) == 3
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("x")] == [(1, 1.5), (2, 3.0), (3, 4.5), (4, 6.0)]
    assert drop_events_after(tmp_path, 4) == 0


def test_flat_hparams():
    assert flat_hparams({"model": {"n_layer": 2, "bias": False}, "train": {"lr": 1e-3, "x": None}}) == {
        "model.n_layer": 2, "model.bias": False, "train.lr": 1e-3, "train.x": "None"}


def test_tensorboard_and_wandb_together(tb_config, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    tb_config.log.wandb = True
    tb_config.train.max_iters = 10
    train(tb_config)
    run = Path(tb_config.train.out_dir)
    assert len(list(run.glob("wandb/offline-run-*"))) == 1
    acc = assert_events_match_metrics(run)
    assert [im.step for im in acc.Images("attn/grid")] == [5, 10]
