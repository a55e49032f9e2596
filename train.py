"""Train a GPT (or a ViT, for an image dataset) whose residual update is pluggable.

    python train.py config/shakespeare_rot.py                        # one process
    python train.py config/shakespeare_rot.py config/cpu.py          # nanoGPT's CPU recipe
    python train.py config/shakespeare_rot.py --max_iters=500        # any key: python train.py --help
    torchrun --standalone --nproc_per_node=8 train.py config/...     # DDP: nccl on CUDA, gloo on CPU

gradient_accumulation_steps counts the micro-steps of one optimizer step over all processes:
a step always sees gradient_accumulation_steps * batch_size * block_size tokens, and each of
the N processes runs gradient_accumulation_steps / N of them (which must divide evenly).

Stopping and resuming: Ctrl-C or SIGTERM saves a checkpoint at the next step boundary (under
DDP, at the next log line), or after the current batch of an evaluation, and exits 0;
--init_from=resume continues from the newest checkpoint that verifies, exactly as if
uninterrupted (same process count), running an interrupted evaluation again first. A resumed run may switch residual between rules that build
the same parameters, such as 'additive' and 'orthogonal' (and change ortho_* or dropout), with
--reset_optimizer=True to restart AdamW and the schedule there; the change is recorded in the
checkpoint's history.
"""

import json
import os
import shlex
import signal
import statistics
import sys
import time
from dataclasses import asdict, replace

import torch
import torch.distributed as dist

import checkpoint
import configure
import diagnostics
import hf
from guards import Interrupt, Interrupted, NonFinite, StepScaler, rng_state, seed_all, set_rng_state
from tasks import DataError, make_task
from training import fail, fingerprint, get_lr, maps_of, parallelize, resume_problems, setup, train_step

UNRECORDED = {'init_from', 'eval_only', 'reset_optimizer'}
CPU_PATIENCE = 3600  # seconds: a CPU run expected to take longer is told of config/cpu.py


def out_of_memory(e):
    """Whether a RuntimeError is the allocator's: a GPU's OutOfMemoryError, or a CPU's message."""
    return isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e) or 'out of memory' in str(e)


def oom_advice(cfg, first):
    step = 'the first training step' if first else 'a training step'
    b, g = cfg.batch_size, cfg.gradient_accumulation_steps
    fix = (f"lower batch_size and raise gradient_accumulation_steps by the same factor, which keeps the tokens "
           f"per step: --batch_size={b // 2} --gradient_accumulation_steps={g * 2}" if b > 1 else
           "lower block_size, or the model size (n_layer, n_embd)")
    return f"out of memory in {step} (batch_size={b}, block_size={cfg.block_size}, gradient_accumulation_steps={g}): {fix}"


def open_log(path, start_iter):
    """log.jsonl for appending, holding only the records up to start_iter: a run that died after
    its last checkpoint logged steps the resumed run will log again."""
    kept = []
    if start_iter and os.path.exists(path):
        with open(path) as f:
            kept = [line for line in f if json.loads(line)['iter'] <= start_iter]
    f = open(path, 'w')
    f.writelines(kept)
    return f


def wandb_mode():
    """WANDB_MODE if set; else 'online' when a W&B key is configured (env or `wandb login`),
    else 'offline'."""
    if os.environ.get('WANDB_MODE'):
        return os.environ['WANDB_MODE']
    if os.environ.get('WANDB_API_KEY'):
        return 'online'
    netrc = os.path.expanduser('~/.netrc')
    if os.path.exists(netrc):
        with open(netrc) as f:
            if 'api.wandb.ai' in f.read():
                return 'online'
    return 'offline'


def flatten(record, prefix=''):
    """Numbers of a nested record as {'a/b/0': v} for wandb."""
    out = {}
    for k, v in record.items():
        if k == 'iter' and not prefix:
            continue
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}/"))
        elif isinstance(v, list):
            out.update({f"{prefix}{k}/{i}": e for i, e in enumerate(v) if isinstance(e, (int, float))})
        elif isinstance(v, (int, float)):
            out[prefix + k] = v
    return out


def describe(metrics):
    return ', '.join(f"{k.replace('_', ' ')} {v:.4f}" if 'loss' in k else f"{k} {v:.2f}%" for k, v in metrics.items())


def format_eta(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def cpu_command(argv):
    """The command of argv with config/cpu.py stacked after its config files; None if it has it."""
    files, overrides = [a for a in argv if not a.startswith('--')], [a for a in argv if a.startswith('--')]
    if any(os.path.basename(f) == 'cpu.py' for f in files):
        return None
    cpu = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'config', 'cpu.py'))
    return shlex.join(['python', 'train.py', *files, cpu, *overrides])


def starting_point(cfg, env, given):
    """(cfg, checkpoint, pretrained state): what the run starts from, a checkpoint of its own to
    resume (--init_from=resume), pretrained weights (a GPT-2 name or a Hugging Face folder: hf.py),
    or nothing. Pretrained weights fix the architecture, for the run and for its resumptions."""
    try:
        if cfg.init_from == 'resume':
            ckpt = read_checkpoint(cfg.out_dir, env)
            saved = configure.from_dict(ckpt['config'])
            if hf.is_pretrained(saved.init_from):  # the saved architecture again; the weights' origin kept
                cfg = replace(hf.adopt(cfg, asdict(configure.model_config(saved)), given),
                              init_from=saved.init_from)
            return cfg, ckpt, None
        path = os.path.join(cfg.out_dir, 'ckpt.pt')
        if os.path.exists(path):
            fail(f"{path} exists and a new run would overwrite it; continue it with --init_from=resume, or "
                 f"pick another --out_dir (or delete the old one)")
        if hf.is_pretrained(cfg.init_from):
            keys, state = hf.read(cfg.init_from)
            return hf.adopt(cfg, keys, given), None, state
        return cfg, None, None
    except hf.PretrainedError as e:
        fail(str(e))


def read_checkpoint(out_dir, env):
    try:
        ckpt, path, refused = checkpoint.load_latest(out_dir)
    except checkpoint.CheckpointError as e:
        fail(str(e))
    if env.master:
        for _, reason in refused:
            print(f"warning: {reason}")
        print(f"resuming from {path} (iteration {ckpt['iter_num']})")
    return ckpt


def resume_changes(cfg, task, ckpt):
    """(history, changes) of a resumed run, after checking that cfg can continue the checkpoint."""
    if ckpt is None:
        return [], {}
    saved = configure.from_dict(ckpt['config'])
    problems = resume_problems(saved, cfg) + task.resume_problems(saved, ckpt.get('meta'))
    if saved.optimizer != cfg.optimizer and not cfg.reset_optimizer:
        problems.append(f"optimizer {saved.optimizer!r} -> {cfg.optimizer!r}: the saved state is the other one's; "
                        f"add --reset_optimizer=True to start the new optimizer (and the schedule) there")
    if problems:
        fail(f"cannot resume from {cfg.out_dir} with this config:\n  " + "\n  ".join(problems))
    changes = {k: [v, getattr(cfg, k)] for k, v in asdict(saved).items()
               if k not in UNRECORDED and v != getattr(cfg, k)}
    return ckpt.get('history', []), changes


class Run:
    """One training run: the model, its optimizer and counters, the logs, and what saves them."""

    def __init__(self, cfg, task, env, ckpt, pretrained):
        self.cfg, self.task, self.env = cfg, task, env
        self.history, changes = resume_changes(cfg, task, ckpt)
        seed_all(cfg.seed)  # the same initial weights in every process
        self.raw_model = task.model()
        if pretrained is not None:
            try:
                hf.fit(self.raw_model, pretrained)
            except hf.PretrainedError as e:
                fail(f"{cfg.init_from}: {e}")
            if env.master:
                print(f"starting from the weights of {cfg.init_from}")
        self.raw_model.to(env.device)
        self.model, self.optimizer = parallelize(self.raw_model, cfg, env)
        self.scaler = StepScaler(env.device_type, env.dtype)
        self.iter_num, self.best_val_loss, self.schedule_start, self.last_eval = 0, float('inf'), 0, -1
        seed_all(cfg.seed + env.rank)  # dropout and stochastic connections differ per process
        if ckpt is not None:
            self.restore(ckpt, changes)
        self.start_iter = self.iter_num
        names = {p: n for n, p in self.raw_model.named_parameters()}
        self.nonfinite = NonFinite([names[p] for g in self.optimizer.param_groups for p in g['params']], env.device)
        self.open_logs()
        self.interrupt = Interrupt()

    def restore(self, ckpt, changes):
        cfg, env = self.cfg, self.env
        if bool(ckpt.get('sharded')) != env.fsdp:
            fail(f"the checkpoint in {cfg.out_dir} was written with parallel={'fsdp' if ckpt.get('sharded') else 'ddp'!r}; "
                 f"resume it with that value (FSDP under torchrun)")
        checkpoint.load_weights(self.raw_model, ckpt, os.path.join(cfg.out_dir, 'ckpt.pt'),
                                None if cfg.reset_optimizer else self.optimizer)
        self.iter_num, self.best_val_loss = ckpt['iter_num'], ckpt['best_val_loss']
        self.last_eval = ckpt.get('last_eval', self.iter_num)  # an interrupted evaluation is run again
        self.schedule_start = self.iter_num if cfg.reset_optimizer else ckpt.get('schedule_start', 0)
        if not cfg.reset_optimizer and ckpt['scaler']:
            self.scaler.load_state_dict(ckpt['scaler'])
        streams = ckpt['streams']
        if len(streams) == env.world:
            self.task.load_state_dict(streams[env.rank]['data'])
            set_rng_state(streams[env.rank]['rng'])
        elif env.master:
            print(f"note: checkpoint written by {len(streams)} processes, resuming on {env.world}: data streams re-seeded")
        if changes or cfg.reset_optimizer:
            self.history.append({'iter': self.iter_num, 'changes': changes, 'reset_optimizer': cfg.reset_optimizer})
            if env.master:
                print(f"at iteration {self.iter_num}: " + ', '.join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
                      + (" (optimizer and schedule reset)" if cfg.reset_optimizer else ""))

    def open_logs(self):
        cfg, env = self.cfg, self.env
        self.wandb = self.log_file = self.dynamics_file = None
        if not env.master:
            return
        os.makedirs(cfg.out_dir, exist_ok=True)
        if not cfg.eval_only:
            with open(os.path.join(cfg.out_dir, 'config.json'), 'w') as f:
                json.dump(asdict(cfg), f, indent=1)
        print(f"{self.raw_model.num_params() / 1e6:.2f}M parameters, residual={cfg.residual}, qkv={cfg.qkv}; "
              f"{self.task.items_per_iter:,} {self.task.unit} per iteration; {env.world} process(es) on "
              f"{env.device}, {env.dtype}")
        if cfg.wandb_log:
            import wandb
            self.wandb = wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name, config=asdict(cfg),
                                    dir=cfg.out_dir, mode=wandb_mode())
        self.log_file = open_log(os.path.join(cfg.out_dir, 'log.jsonl'), self.start_iter)
        if cfg.dynamics:
            self.dynamics_file = open_log(os.path.join(cfg.out_dir, 'dynamics.jsonl'), self.start_iter)
        if self.history and self.history[-1]['iter'] == self.start_iter:
            self.log({'iter': self.start_iter, 'event': 'resume', **self.history[-1]})

    def log(self, record, file=None):
        if self.env.master:
            file = file or self.log_file
            file.write(json.dumps(record) + '\n')
            file.flush()
            if self.wandb is not None:
                self.wandb.log(flatten(record), step=record['iter'])

    def save(self, best):
        """A checkpoint of every process's state, written by rank 0; best.pt too if best."""
        cfg, env, raw = self.cfg, self.env, self.raw_model
        mine = {'data': self.task.state_dict(), 'rng': rng_state(env.device_type),
                'batch_starts': getattr(self.task.loader, 'last_starts', None),
                'weights': fingerprint(raw)}
        streams = [mine]
        if env.ddp:
            streams = [None] * env.world
            dist.all_gather_object(streams, mine)
            if not env.fsdp and not all(torch.equal(s['weights'], mine['weights']) for s in streams):
                fail(f"at iteration {self.iter_num} the {env.world} processes hold different weights: "
                     f"DDP replicas diverged")
        sharded = checkpoint.save_sharded(raw, self.optimizer, cfg.out_dir, self.iter_num, env.master) if env.fsdp else None
        if not env.master:
            return
        path = os.path.join(cfg.out_dir, 'ckpt.pt')
        checkpoint.save({'model': None if sharded else raw.state_dict(),
                         'optimizer': None if sharded else self.optimizer.state_dict(), 'sharded': sharded,
                         'scaler': self.scaler.state_dict(), 'iter_num': self.iter_num,
                         'best_val_loss': self.best_val_loss, 'schedule_start': self.schedule_start,
                         'last_eval': self.last_eval,
                         'history': self.history, 'streams': streams, 'config': json.dumps(asdict(cfg)),
                         'meta': json.dumps(self.task.meta) if self.task.meta else None}, path)
        checkpoint.snapshot(cfg.out_dir, self.iter_num, cfg.keep_last_n)
        if best:
            checkpoint.link(path, os.path.join(cfg.out_dir, 'best.pt'))
        if sharded:
            checkpoint.prune_sharded(cfg.out_dir)

    def evaluates_at(self, i):
        """Whether the run evaluates at iteration i: every eval_interval, at max_iters, not twice."""
        return (i % self.cfg.eval_interval == 0 or i == self.cfg.max_iters) and i != self.last_eval

    def evaluate(self):
        """The task's metrics; a signal stops it between batches (guards.Interrupted)."""
        env = self.env
        with maps_of(self.model, env):
            return self.task.evaluate(self.model, env.autocast, env.ddp, self.cfg.eval_iters,
                                      lambda: self.interrupt.check(env.ddp, env.device))

    def evaluate_and_save(self):
        """An evaluation, logged, and a checkpoint of the iterations since the last one."""
        metrics = self.evaluate()
        best = metrics['val_loss'] < self.best_val_loss
        self.best_val_loss, self.last_eval = min(self.best_val_loss, metrics['val_loss']), self.iter_num
        record = {'iter': self.iter_num, **metrics}
        if self.env.master and self.cfg.dynamics:  # Oh et al. App. D: effective rank of the final representation
            self.raw_model.eval()
            record['effective_rank'] = diagnostics.effective_rank(
                diagnostics.final_features(self.raw_model, self.task.eval_inputs()))
            self.raw_model.train()
        if self.env.master:
            print(f"step {self.iter_num}: {describe(metrics)}{' (best)' if best else ''}")
        self.log(record)
        if self.iter_num > 0:  # from scratch, iteration 0 has nothing to save
            self.save(best)

    def step(self, lr):
        """One optimizer step at learning rate lr; returns its loss as a device tensor."""
        cfg = self.cfg
        self.optimizer.set_lr(lr / cfg.learning_rate)
        try:
            loss, grad_norms = train_step(self.model, self.optimizer, self.scaler, self.task.next_batch,
                                          cfg.gradient_accumulation_steps // self.env.world, cfg.grad_clip,
                                          self.env.autocast, self.env)
        except RuntimeError as e:  # torch.OutOfMemoryError included
            if not out_of_memory(e):
                raise
            fail(oom_advice(cfg, self.iter_num == self.start_iter))
        self.nonfinite.record(self.iter_num, loss, grad_norms)
        self.iter_num += 1
        if self.env.master and cfg.dynamics and self.iter_num % cfg.dynamics_interval == 0:
            self.raw_model.eval()  # no dropout, expected stochastic connections: no random numbers drawn
            stats = diagnostics.update_stats(self.raw_model, self.task.batch[0])
            self.raw_model.train()
            self.log(diagnostics.stats_record(self.iter_num, self.raw_model, stats), self.dynamics_file)
        return loss

    def check_nonfinite(self):
        """Warn of the non-finite steps since the last check; stop (saving first) as nan_policy says."""
        cfg = self.cfg
        count, first, streak, bad = self.nonfinite.check()
        if not count:
            return
        where = ', '.join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else '')
        report = (f"non-finite loss or gradients at iteration {first} ({count} of the last {cfg.log_interval} "
                  f"steps, skipped); parameters with non-finite gradients: {where or 'none (the loss itself)'}")
        self.log({'iter': self.iter_num, 'event': 'nonfinite', 'first': first, 'count': count, 'params': bad})
        if cfg.nan_policy == 'stop' or streak >= cfg.nan_max_skips:
            self.save(False)
            why = ("nan_policy='stop'" if cfg.nan_policy == 'stop'
                   else f"{streak} consecutive steps skipped (nan_max_skips={cfg.nan_max_skips})")
            fail(f"{report}.\nStopped ({why}); the parameters from before those steps are saved in "
                 f"{cfg.out_dir}/ckpt.pt. Resume with a lower learning_rate or longer warmup_iters, "
                 f"or with --nan_policy=skip")
        if self.env.master:
            print(f"warning: {report}")

    def loop(self):
        """Evaluate only, or train to max_iters; a signal stops either at the next step or
        evaluation batch, saving first (Run.stop)."""
        cfg, env = self.cfg, self.env
        try:
            if not cfg.eval_only:
                return self.train()
            metrics = self.evaluate()
            if env.master:
                print(f"iter {self.iter_num}: " + describe(metrics))
        except Interrupted as e:
            self.stop(e.args[0], evaluating=True)

    def train(self):
        cfg, env, task = self.cfg, self.env, self.task
        self.dts, t_last, since = [], time.perf_counter(), 0
        while True:
            if self.evaluates_at(self.iter_num):
                self.evaluate_and_save()
                t_last, since = time.perf_counter(), 0
            if self.iter_num >= cfg.max_iters:
                break
            lr = get_lr(self.iter_num, cfg, self.schedule_start)
            loss = self.step(lr)
            since += 1
            at_log = self.iter_num % cfg.log_interval == 0  # the host syncs here only
            if at_log:
                if env.master:
                    now = time.perf_counter()
                    dt, t_last, since = (now - t_last) / since, now, 0
                    self.dts.append(dt)
                    eta = statistics.median_high(self.dts) * (cfg.max_iters - self.iter_num)
                    lossf, per_iter = loss.item(), task.items_per_iter
                    print(f"iter {self.iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                          f"{per_iter / dt:,.0f} {task.unit}/s{task.progress()}, eta {format_eta(eta)}")
                    self.log({'iter': self.iter_num, 'loss': lossf, 'lr': lr, 'ms_per_iter': dt * 1000,
                              f'{task.unit}_per_s': per_iter / dt})
                self.check_nonfinite()
            signum = self.interrupt.agreed(env.ddp, env.device) if at_log or not env.ddp else 0
            if signum:
                return self.stop(signum)
        if env.master:
            median = statistics.median_high(self.dts) if self.dts else float('nan')
            print(f"done: {self.iter_num} iterations, best val loss {self.best_val_loss:.4f}, "
                  f"median {median * 1000:.1f} ms/iter, {task.items_per_iter / median:,.0f} {task.unit}/s")

    def stop(self, signum, evaluating=False):
        """After a signal: save what is new since the last checkpoint and say how to continue. An
        evaluation cut short runs again first on resume (last_eval)."""
        cfg = self.cfg
        saved = not cfg.eval_only and self.iter_num > self.start_iter
        if saved:
            self.save(False)
        if self.env.master:
            what = (f"checkpoint saved to {cfg.out_dir}/ckpt.pt; continue with --init_from=resume" if saved
                    else "nothing new to save")
            print(f"stopped by {signal.Signals(signum).name} {'during the evaluation ' if evaluating else ''}"
                  f"at iteration {self.iter_num}; {what}")

    def time_micro_step(self):
        """Seconds of one micro-batch's forward and backward here: a quarter of the pending batch,
        twice, scaled up; where that comes to under 2 s, the whole batch once more, which counts
        instead. Changes no weight, gradient, random state or data position."""
        rng, raw, (x, y) = torch.get_rng_state(), self.raw_model, self.task.batch
        sizes = [-(-len(x) // 4)] * 2
        try:
            while sizes:
                n = sizes.pop(0)
                t0 = time.perf_counter()
                with maps_of(raw, self.env, grad=True), self.env.autocast:
                    _, loss = raw(x[:n], y[:n])
                loss.backward()
                seconds = (time.perf_counter() - t0) * len(x) / n
                if not sizes and n < len(x) and seconds < 2:
                    sizes.append(len(x))
        except RuntimeError as e:
            if not out_of_memory(e):
                raise
            fail(oom_advice(self.cfg, True))
        raw.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
        return seconds

    def estimate(self, argv):
        """On a CPU, before the first evaluation: how long the run will take, and where that is
        over CPU_PATIENCE, the command that fits a CPU."""
        cfg = self.cfg
        seconds = self.time_micro_step()
        iters = cfg.max_iters - self.iter_num
        evals = sum(1 for i in range(self.iter_num, cfg.max_iters + 1) if self.evaluates_at(i))
        total = seconds * (iters * cfg.gradient_accumulation_steps // self.env.world
                           + evals * self.task.eval_batches(cfg.eval_iters) / 3)  # a forward: ~1/3 of both
        print(f"on this CPU: about {format_eta(total)} for {iters} iterations and {evals} evaluations "
              f"(from timing its forward and backward pass)")
        if total > CPU_PATIENCE:
            command = cpu_command(argv)
            if command:
                small = configure.load(shlex.split(command)[2:])
                fix = (f"for a CPU, stack config/cpu.py (nanoGPT's CPU recipe; here {small.n_layer} layers x "
                       f"{small.n_embd}, {small.max_iters} iterations):\n  {command}")
            else:
                fix = "lower max_iters, or the model size (n_layer, n_embd)"
            print(f"note: this config is sized for a GPU ({cfg.n_layer} layers x {cfg.n_embd}, {self.task.items_per_iter:,} "
                  f"{self.task.unit} a step) and runs on the CPU here; {fix}\nGoing on as asked (Ctrl-C stops it, saving what it "
                  f"has trained).")

    def finish(self):
        self.interrupt.restore()
        if self.env.master:
            for f in (self.log_file, self.dynamics_file):
                if f is not None:
                    f.close()
            if self.wandb is not None:
                self.wandb.finish()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if '-h' in argv or '--help' in argv:
        print(__doc__)
        print(configure.usage())
        return
    given = set()
    try:
        cfg = configure.load(argv, given=given)
    except configure.ConfigError as e:
        fail(f"config: {e}")
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    env = setup(cfg)
    try:
        cfg, ckpt, pretrained = starting_point(cfg, env, given)
        try:
            task = make_task(cfg, env.device, env.rank, env.world)
        except DataError as e:
            fail(str(e))
        run = Run(task.cfg, task, env, ckpt, pretrained)
        del ckpt, pretrained
        try:
            if env.device_type == 'cpu' and env.master and not env.fsdp and not task.cfg.eval_only:
                run.estimate(argv)
            run.loop()
        finally:
            run.finish()
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        if env.ddp:
            if sys.exc_info()[0] is None:
                # all processes ended cleanly: tear down together, after rank 0's last checkpoint
                # (a rank that got there first was seen to abort at exit)
                dist.barrier()
            dist.destroy_process_group()


if __name__ == '__main__':
    main()
