"""The `train` and `log` sections, and RunConfig: the whole resolved config of one run."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from data.config import DataConfig
from model.config import ModelConfig


@dataclass
class TrainConfig:
    out_dir: str = "checkpoints/run"  # run folder: metrics.jsonl, latest/, best/
    max_iters: int = 5000  # optimizer steps
    max_seconds: float = 0.0  # wall-clock budget; when set, the LR schedule follows elapsed time
    eval_interval: int = 250  # steps between evaluations (and checkpoints)
    eval_iters: int = 20  # batches averaged per split at each evaluation
    log_interval: int = 10  # steps between metrics.jsonl lines
    batch_size: int = 64  # sequences per micro-batch, per process
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3  # peak learning rate (AdamW; for muon, the embeddings/head/1-D params)
    min_lr: float = 1e-4  # floor of the decay
    muon_lr: float = 0.02  # peak learning rate of Muon's 2-D hidden weights
    warmup_iters: int = 100
    schedule: str = "cosine"  # cosine | wsd (warmup-stable-decay)
    decay_fraction: float = 0.2  # wsd: the final fraction of training that decays
    weight_decay: float = 0.1  # applied to 2-D weights only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    optimizer: str = "adamw"  # adamw | muon
    device: str = "auto"  # auto (cuda, mps, cpu) | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto (bf16 on CUDA, fp16 if not supported; on CPU see README) | float32 | bfloat16 | float16
    compile: bool = False  # torch.compile the model
    parallel: str = "ddp"  # ddp | fsdp (torchrun: replicate the model, or shard params, grads and optimizer state)
    activation_checkpointing: bool = False  # recompute each block's activations in backward: less memory, more compute
    dist_timeout: float = 3600.0  # seconds a torchrun process waits in a collective before failing
    resume: str = "never"  # never | auto (continue from out_dir/latest if present)
    stop_at: int = 0  # end this invocation after this many steps, saving latest/ (resume later); 0 = off
    overwrite: bool = False  # allow an out_dir that holds a different run to be replaced
    seed: int = 1337

    def validate(self) -> None:
        for key in ("max_iters", "eval_interval", "eval_iters", "log_interval", "batch_size", "grad_accum"):
            if getattr(self, key) < 1:
                raise ValueError(f"train.{key}: {getattr(self, key)} must be >= 1")
        for key in ("stop_at", "max_seconds", "lr", "min_lr", "muon_lr", "weight_decay", "grad_clip", "warmup_iters"):
            if getattr(self, key) < 0:
                raise ValueError(f"train.{key}: {getattr(self, key)} must be >= 0")
        if self.dist_timeout <= 0:
            raise ValueError(f"train.dist_timeout: {self.dist_timeout} must be > 0 (seconds)")
        if self.min_lr > self.lr:
            raise ValueError(f"train.min_lr: {self.min_lr} is above train.lr = {self.lr}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"train.decay_fraction: {self.decay_fraction} must lie in (0, 1]")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"train.{key}: {getattr(self, key)} must lie in [0, 1)")
        choices = {"schedule": ("cosine", "wsd"), "optimizer": ("adamw", "muon"), "resume": ("never", "auto"),
                   "dtype": ("auto", "float32", "bfloat16", "float16"), "parallel": ("ddp", "fsdp")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"train.{key}: {getattr(self, key)!r} is not one of {', '.join(allowed)}")
        if self.parallel == "fsdp" and self.optimizer == "muon":
            raise ValueError("train.optimizer: muon cannot run under train.parallel fsdp: it orthogonalises each whole "
                             "matrix, and fsdp leaves each rank a shard of it; use adamw, or ddp")
        if self.parallel == "fsdp" and self.dtype == "float16":
            raise ValueError("train.dtype: float16 cannot run under train.parallel fsdp: torch's GradScaler "
                             "does not combine its overflow check across the shards; use bfloat16 or float32")
        if not (self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:")):
            raise ValueError(f"train.device: {self.device!r} is not one of auto, cpu, cuda, cuda:N, mps")
        if not self.out_dir:
            raise ValueError("train.out_dir: must name a folder")


@dataclass
class LogConfig:
    wandb: bool = False  # log to Weights & Biases; WANDB_MODE=offline|disabled is honoured
    wandb_project: str = "attngpt"
    wandb_run_name: str = ""  # empty = wandb picks a name
    tensorboard: bool = False  # write TensorBoard event files into out_dir/tensorboard (local only, no account)
    sample_prompt: str = "\n"  # prompt of the samples drawn at each evaluation
    sample_tokens: int = 200  # tokens per eval sample; 0 = no samples
    probe_prompt: str = ""  # text whose attention is captured at each eval; empty = a built-in probe
    attention: bool = True  # capture attention maps and head statistics at each eval

    def validate(self) -> None:
        if self.sample_tokens < 0:
            raise ValueError(f"log.sample_tokens: {self.sample_tokens} must be >= 0")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def validate(self) -> None:
        for section in (self.model, self.data, self.train, self.log):
            section.validate()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict, base: "RunConfig | None" = None) -> "RunConfig":
        """Nested {section: {key: value}} onto the defaults (or `base`); unknown keys and wrong types refused."""
        from train.config_io import apply_dict
        return apply_dict(raw, base)

    @classmethod
    def from_toml(cls, path: str) -> "RunConfig":
        """A preset file: TOML data, never executed."""
        from train.config_io import apply_dict, read_toml
        return apply_dict(read_toml(path))

    @classmethod
    def from_checkpoint(cls, path: str) -> "RunConfig":
        """The resolved config a checkpoint (or run folder) was trained with."""
        from train.config_io import apply_dict, checkpoint_sections
        return apply_dict(checkpoint_sections(path))

    def with_overrides(self, overrides: dict) -> "RunConfig":
        """A copy with {"section.key": value} applied (strings are parsed as on the command line)."""
        from train.config_io import apply_overrides
        return apply_overrides(self, overrides)
