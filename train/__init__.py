"""Training, read top to bottom: config -> run folder -> data -> model -> step loop -> checkpoints.

config / config_io  RunConfig and its sections; TOML, overrides, help text; RunConfig.from_checkpoint
rundir              the run folder: its lock, new run or resume (what may change on resume), clearing
loop                train(cfg): a run's set-up, in order, then the Trainer
trainer             the step loop: micro-steps, clipping, logging, evaluation, checkpoints, stopping
state               TrainerState (what a resume restores besides the weights) and the RNG streams
parallel            ddp or fsdp across torchrun processes; sharded_checkpoint: fsdp saves and any-layout resumes
collectives         what the ranks say to each other besides gradients (agree, broadcast, raise everywhere)
runtime             device, precision, process group, peak FLOP/s; optim: optimizers and LR schedules
evaluation, tracking, tensorboard_log, signals, memory: what each name says
"""
