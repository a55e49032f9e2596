"""A run's state in one object, and the setup that builds it: what train.py, tools/bench.py,
resumption and checkpointing share.

A Run holds the config, this process's Env, the task (data, evaluation), the model (raw and
wrapped for DDP/FSDP), the optimizer and loss scaler, and the counters a checkpoint carries. A
checkpoint adds every process's data stream and RNG state (`save`), and `restore` puts them back.
"""

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.distributed as dist

import configure
from orthogpt import checkpoint, hf, parallel, resume
from orthogpt.errors import UserError
from orthogpt.optim import StepScaler, make_optimizer, oom_advice, train_step
from orthogpt.rng import rng_state, seed_all, set_rng_state
from orthogpt.tasks import make_task

@dataclass
class Counters:
    """What a run counts, saved in its checkpoint and restored with it."""
    iter_num: int = 0
    best_val_loss: float = math.inf
    schedule_start: int = 0  # where the schedule (re)started: 0, or an optimizer reset
    last_eval: int = -1
    history: list = field(default_factory=list)  # the config changes made on resuming
    train_s: float = 0.0  # seconds spent training (not evaluating), over every resumption


@dataclass
class Run:
    cfg: Any  # configure.Config, with the dataset's vocabulary or image shape
    env: parallel.Env
    task: Any  # orthogpt.tasks.Task
    raw_model: torch.nn.Module
    model: torch.nn.Module  # raw_model wrapped for DDP or sharded by FSDP: the one stepped
    optimizer: Any  # orthogpt.optim.Optimizers
    scaler: StepScaler
    counters: Counters = field(default_factory=Counters)
    flops_per_item: float | None = None  # of a training step, counted on rank 0 (orthogpt.flops)
    writer: checkpoint.Writer = field(default_factory=checkpoint.Writer)
    group: Any = None  # async_save under FSDP: the process group of the checkpoints' own collectives

    @property
    def micro_steps(self):
        """This process's micro-steps per optimizer step: its share of gradient_accumulation_steps."""
        return self.cfg.gradient_accumulation_steps // self.env.world

    def step(self, next_batch=None):
        """One optimizer step on the task's batches (or next_batch's); (loss, gradient norms)."""
        return train_step(self.model, self.optimizer, self.scaler, next_batch or self.task.next_batch,
                          self.micro_steps, self.cfg.grad_clip, self.env.autocast, self.env)

    def save(self, best):
        """A checkpoint of every process's state, written by rank 0 (under FSDP the weights and
        optimizer state by every process, sharded); best.pt too if best. With async_save, from a copy
        taken now (on the CPU), by the writer's thread: the loop goes on meanwhile, and waits only
        where the next save or the run's end meets the last one still in flight."""
        env, cfg = self.env, self.cfg
        self.writer.wait()
        mine = {'data': self.task.state_dict(), 'rng': rng_state(env.device_type),
                'weights': parallel.fingerprint(self.raw_model)}
        streams = [mine]
        if env.ddp:
            streams = [None] * env.world
            dist.all_gather_object(streams, mine)
            if not env.fsdp and not all(torch.equal(s['weights'], mine['weights']) for s in streams):
                raise UserError(f"at iteration {self.counters.iter_num} the {env.world} processes hold different "
                                f"weights: DDP replicas diverged")
        folder, written = None, None
        if env.fsdp:
            from orthogpt import sharded  # torch.distributed.checkpoint (and DTensor): loaded only where a run shards
            if cfg.async_save and self.group is None:  # every process saves together: a collective of all
                self.group = dist.new_group(backend='gloo')
            folder, written = sharded.save(self.raw_model, self.optimizer, cfg.out_dir, self.counters.iter_num,
                                           env.master, self.group if cfg.async_save else None)
        if not env.master:
            if written:
                self.writer.start(written, cfg.async_save)
            return
        state = {**asdict(self.counters), 'model': None if folder else self.raw_model.state_dict(),
                 'optimizer': None if folder else self.optimizer.state_dict(), 'sharded': folder,
                 'scaler': self.scaler.state_dict(), 'streams': streams, 'config': json.dumps(asdict(cfg)),
                 'meta': json.dumps(self.task.meta) if self.task.meta else None, 'best': best}
        if cfg.async_save:
            state = checkpoint.snapshot(state)

        def write():
            if written:
                written()
            checkpoint.save(state, os.path.join(cfg.out_dir, 'ckpt.pt'))
            checkpoint.retain(cfg.out_dir, state['iter_num'], cfg.keep_last_n, best)
            keep = checkpoint.named_folders(cfg.out_dir) if folder else None
            if keep is not None:
                sharded.prune(cfg.out_dir, keep)
        self.writer.start(write, cfg.async_save)

    def restore(self, ckpt):
        """The counters from the checkpoint, after checking that the config can continue it; the
        weights, optimizer and scaler state, and this process's data stream and RNG, loaded."""
        cfg, env = self.cfg, self.env
        saved = configure.from_dict(ckpt['config'])
        problems = resume.problems(saved, cfg) + self.task.resume_problems(saved, ckpt['meta'])
        if bool(ckpt['sharded']) != env.fsdp:
            problems.append(f"the checkpoint was written with parallel={'fsdp' if ckpt['sharded'] else 'ddp'!r}; "
                            f"resume it with that value (FSDP under torchrun)")
        if cfg.max_iters < ckpt['iter_num'] and not cfg.eval_only:
            problems.append(f"max_iters={cfg.max_iters} lies before the checkpoint's iteration {ckpt['iter_num']}; "
                            f"resume with --max_iters={ckpt['iter_num']} or more (or evaluate it: --eval_only=True)")
        if problems:
            raise UserError(resume.refusal(cfg.out_dir, problems))
        checkpoint.load_weights(self.raw_model, ckpt, os.path.join(cfg.out_dir, 'ckpt.pt'),
                                None if cfg.reset_optimizer else self.optimizer)
        self.counters = c = Counters(**{f.name: ckpt[f.name] for f in fields(Counters) if f.name in ckpt})
        if cfg.reset_optimizer:
            c.schedule_start = c.iter_num
        elif ckpt['scaler']:
            self.scaler.load_state_dict(ckpt['scaler'])
        streams = ckpt['streams']
        if len(streams) == env.world:
            self.task.load_state_dict(streams[env.rank]['data'])
            set_rng_state(streams[env.rank]['rng'])
        elif env.master:
            print(f"note: checkpoint written by {len(streams)} processes, resuming on {env.world}: data streams re-seeded")
        changes = resume.changes(saved, cfg)
        if changes or cfg.reset_optimizer:
            c.history.append({'iter': c.iter_num, 'changes': changes, 'reset_optimizer': cfg.reset_optimizer})
            if env.master:
                print(f"at iteration {c.iter_num}: " + ', '.join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
                      + (" (optimizer and schedule reset)" if cfg.reset_optimizer else ""))


def setup(cfg, env, pretrained=None, count_flops=False):
    """The Run of cfg in this process: its task, the model (initialised alike in every process, from
    `pretrained`'s state where given) on its device and wrapped, the optimizer and the scaler; then
    every process's own random stream (dropout, stochastic connections). count_flops: rank 0 counts
    a training step's FLOPs first, on the model alone (not yet sharded), its random draws undone by
    that seeding."""
    # data that one machine lacks stops every process with its line, not the others in their next collective
    task = parallel.every_rank(env, lambda: make_task(cfg, env.device, env.rank, env.world))
    cfg = task.cfg  # with the dataset's vocabulary, or its images' shape
    seed_all(cfg.seed)
    raw_model = task.model()
    if pretrained is not None:
        hf.fit(raw_model, pretrained)
    raw_model.to(env.device)
    try:
        flops = task.counted_flops(raw_model) if count_flops and env.master else None
    except torch.OutOfMemoryError:  # a step of two items
        raise UserError(oom_advice(cfg, True)) from None
    model = parallel.parallelize(raw_model, cfg, env)
    run = Run(cfg, env, task, raw_model, model, make_optimizer(raw_model, cfg, env.device_type),
              StepScaler(env.device_type, env.dtype), flops_per_item=flops)
    seed_all(cfg.seed + env.rank)
    return run
