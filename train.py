"""Train a GPT (or a ViT, for an image dataset) whose residual update is pluggable.

    python train.py config/shakespeare_rot.py                        # one process
    python train.py config/shakespeare_rot.py config/cpu.py          # nanoGPT's CPU recipe
    python train.py config/shakespeare_rot.py --max_iters=500        # any key: python train.py --help
    torchrun --standalone --nproc_per_node=8 train.py config/... --init_from=auto   # DDP: nccl on CUDA, gloo on CPU

gradient_accumulation_steps counts the micro-steps of one optimizer step over all processes:
a step always sees gradient_accumulation_steps * batch_size * block_size tokens, and each of
the N processes runs gradient_accumulation_steps / N of them (which must divide evenly).

Stopping and resuming: Ctrl-C or SIGTERM saves a checkpoint at the next step boundary (under
DDP, at the next log line), or after the current batch of an evaluation, and exits 0;
--init_from=resume continues from the newest checkpoint that verifies, exactly as if
uninterrupted (same process count), running an interrupted evaluation again first. A resumed
run may switch residual between rules that build the same parameters, such as 'additive' and
'orthogonal' (and change their options or dropout), with --reset_optimizer=True to restart the
optimizer and the schedule there; the change is recorded in the checkpoint's history.
--init_from=auto resumes where out_dir holds a checkpoint and starts fresh where not, and a run
that torchrun restarted or Slurm requeued continues its checkpoint whatever init_from says; a lost
process or machine ends the others in one line (docs/cluster.md).

One process writes an out_dir at a time: a second train.py on it is refused at once, naming the
first (a lock that the operating system releases when its holder dies, even by SIGKILL). Under
torchrun the workers stop as if by SIGTERM, saving first, when their launcher dies. A checkpoint
that cannot be written (a full disk) stops the run with the previous one intact. See
docs/reliability.md.
"""

import json
import os
import signal
import statistics
import sys
import time
from contextlib import suppress
from dataclasses import asdict, replace

import torch

import configure
from orthogpt import checkpoint, diagnostics, errors, hf, lock, logs, parallel, resume
from orthogpt.errors import UserError
from orthogpt.estimate import check_cpu_run, format_time
from orthogpt.files import write_text
from orthogpt.logs import RunLog
from orthogpt.optim import NonFinite, oom_advice, schedule, warmup_note
from orthogpt.run import setup
from orthogpt.signals import Interrupt, Interrupted


@errors.entry
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if '-h' in argv or '--help' in argv:
        print(__doc__)
        print(configure.usage())
        return
    given = set()
    cfg = configure.load(argv, given=given)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    with parallel.peers_lost(cfg):  # a process or machine of the run lost: one line, not the backend's traceback
        env = parallel.setup(cfg)
        fresh, failed = not os.path.exists(cfg.out_dir), False
        try:
            with parallel.master_holds(env, lambda: lock.hold(cfg.out_dir)):  # one run writes an out_dir
                try:
                    train(cfg, env, argv, given)
                except BaseException:
                    failed = fresh and env.master and discard(cfg.out_dir)
                    raise
        finally:
            if failed or (fresh and env.master and sys.exc_info()[0]):  # its lock released: the folder this run
                with suppress(OSError):  # made, empty now (a folder that holds anything stays)
                    os.rmdir(cfg.out_dir)
            torch.use_deterministic_algorithms(was_deterministic)
            parallel.teardown(env)


def train(cfg, env, argv, given):
    # ------------------------------------------------------------------ setup: data, model, optimizer
    start = starting_point(cfg, env, given)
    if start is None:  # --init_from=auto found the run complete
        return
    cfg, ckpt, pretrained = start
    run = setup(cfg, env, pretrained, count_flops=not cfg.eval_only)
    cfg, c = run.cfg, run.counters
    # ------------------------------------------------------------------ resume: weights, counters, data, RNG
    if ckpt is not None:
        run.restore(ckpt)
        c = run.counters
    start_iter = c.iter_num
    names = {p: n for n, p in run.raw_model.named_parameters()}
    nonfinite = NonFinite([names[p] for g in run.optimizer.param_groups for p in g['params']], env.device)
    log = RunLog(cfg, env.master, start_iter)
    announce(run, log, pretrained is not None)
    if env.device_type == 'cpu' and not env.fsdp and not cfg.eval_only:
        evals = sum(evaluates_at(i, cfg, c) for i in range(start_iter, cfg.max_iters + 1))
        check_cpu_run(run, argv, cfg.max_iters - start_iter, evals)
    # ------------------------------------------------------------------ the loop
    interrupt = Interrupt()

    def evaluate():  # a signal stops it between batches (Interrupted)
        with parallel.maps_of(run.model, env):
            return run.task.evaluate(run.model, env.autocast, env.ddp, cfg.eval_iters,
                                     lambda: interrupt.check(env.ddp, env.device))
    try:
        if cfg.eval_only:
            if env.master:
                print(f"iter {c.iter_num}: {describe(evaluate())}")
            return
        t_last, since, dts = time.perf_counter(), 0, []
        while True:
            it = c.iter_num
            if evaluates_at(it, cfg, c):
                c.train_s += time.perf_counter() - t_last
                metrics = evaluate()
                best = metrics['val_loss'] < c.best_val_loss
                c.best_val_loss, c.last_eval = min(c.best_val_loss, metrics['val_loss']), it
                if env.master and cfg.dynamics:  # Oh et al. App. D: effective rank of the final representation
                    metrics['effective_rank'] = diagnostics.final_rank(run.raw_model, run.task.eval_inputs())
                if env.master:
                    print(f"step {it}: {describe(metrics)}{' (best)' if best else ''}")
                record = {'iter': it, **metrics, 'train_s': c.train_s}
                if it > 0:  # from scratch, iteration 0 has nothing to save
                    t_save = time.perf_counter()
                    run.save(best)
                    record['save_s'] = time.perf_counter() - t_save  # how long the save held the loop
                log.write(record)
                t_last, since = time.perf_counter(), 0
            if it >= cfg.max_iters:
                break
            lr = schedule(run.optimizer, it, cfg, c.schedule_start)
            try:
                loss, grad_norms = run.step()
            except torch.OutOfMemoryError:
                raise UserError(oom_advice(cfg, it == start_iter)) from None
            nonfinite.record(it, loss, grad_norms)
            c.iter_num = it = it + 1
            since += 1
            if env.master and cfg.dynamics and it % cfg.dynamics_interval == 0:
                inputs, targets = run.task.batch
                last = it + cfg.dynamics_interval > cfg.max_iters  # no record after this one
                gains = it % cfg.dynamics_gain_interval < cfg.dynamics_interval or last  # costly: rarer
                log.write(diagnostics.dynamics_record(run.raw_model, inputs, it, targets, gains), 'dynamics')
            at_log = it % cfg.log_interval == 0  # the host syncs here only
            if at_log:
                now = time.perf_counter()
                dt, t_last, c.train_s = (now - t_last) / since, now, c.train_s + now - t_last
                since = 0
                if env.master:
                    dts.append(dt)
                    log_line(run, log, loss.item(), lr, dts)
                check_nonfinite(run, nonfinite, log)
            signum = interrupt.agreed(env.ddp, env.device) if at_log or not env.ddp else 0
            if signum:
                raise Interrupted(signum, evaluating=False)
        if env.master:
            med = statistics.median_high(dts) if dts else None
            print(f"done: {c.iter_num} iterations, best val loss {c.best_val_loss:.4f}"
                  + (f", median {med * 1000:.1f} ms/iter, {run.task.items_per_iter / med:,.0f} {run.task.unit}/s"
                     if dts else ''))
    except Interrupted as e:  # save what is new since the last checkpoint; an evaluation cut short runs again
        saved = c.iter_num > start_iter and not cfg.eval_only
        if saved:
            run.save(False)
            run.writer.wait()
        if env.master:
            what = (f"checkpoint saved to {cfg.out_dir}/ckpt.pt; continue with --init_from=resume" if saved
                    else "nothing new to save")
            print(f"stopped by {signal.Signals(e.signum).name} {'during the evaluation ' if e.evaluating else ''}"
                  f"at iteration {c.iter_num}; {what}")
    finally:
        interrupt.restore()
        try:
            run.writer.wait()  # the checkpoint in flight (async_save), written before the process group ends
        finally:
            log.close()


RECENT = 5  # log intervals whose median speed gives the time left: it follows a machine that slows or speeds up


def log_line(run, log, lossf, lr, dts):
    """Rank 0's line every log_interval iterations, printed and logged; dts: the seconds per iteration
    of each interval so far, the last one's, and the time left at the median of the last RECENT."""
    dt, task = dts[-1], run.task
    per_s = task.items_per_iter / dt
    eta = statistics.median_high(dts[-RECENT:]) * (run.cfg.max_iters - run.counters.iter_num)
    print(f"iter {run.counters.iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
          f"{per_s:,.0f} {task.unit}/s{task.progress()}, eta {format_time(eta)}")
    log.write({'iter': run.counters.iter_num, 'loss': lossf, 'lr': lr, 'ms_per_iter': dt * 1000,
               f'{task.unit}_per_s': per_s})


def evaluates_at(it, cfg, counters):
    """Whether the run evaluates at iteration it: every eval_interval, at max_iters, not twice."""
    return (it % cfg.eval_interval == 0 or it == cfg.max_iters) and it != counters.last_eval


def describe(metrics):
    return ', '.join(f"{k.replace('_', ' ')} {v:.4f}" if 'loss' in k or 'bpb' in k else f"{k} {v:.2f}%" if 'top' in k
                     else f"{k.replace('_', ' ')} {v:.2f}" for k, v in metrics.items())


def starting_point(cfg, env, given):
    """(cfg, checkpoint, pretrained state): what the run starts from, a checkpoint of its own to
    resume (--init_from=resume, or --init_from=auto where out_dir holds one), pretrained weights (a
    GPT-2 name or a Hugging Face folder), or nothing. Pretrained weights fix the architecture, for
    the run and for its resumptions. A run that its launcher restarted (restarted()) continues as
    with --init_from=auto. None where auto finds the run complete, after a line that says so:
    nothing is read or written then."""
    if cfg.init_from in ('resume', 'auto') or restarted():
        ckpt, path, refused = newest(cfg, env)
        if ckpt is None:  # nothing to continue: a fresh start
            return starting_fresh(cfg, given)
        asked, saved = cfg.init_from, configure.from_dict(ckpt['config'])
        if hf.is_pretrained(saved.init_from):  # the saved architecture again; the weights' origin kept
            cfg = replace(hf.adopt(cfg, asdict(configure.model_config(saved)), given), init_from=saved.init_from)
        if asked != 'resume' and not cfg.eval_only and ckpt['iter_num'] == cfg.max_iters == ckpt['last_eval']:
            found = resume.problems(saved, cfg)
            if found:
                raise UserError(resume.refusal(cfg.out_dir, found))
            if env.master:
                print(f"{cfg.out_dir} holds a complete run: iteration {ckpt['iter_num']} of max_iters={cfg.max_iters}, "
                      f"best val loss {ckpt['best_val_loss']:.4f}; nothing to do (to train on, raise --max_iters; for "
                      f"another run, give another --out_dir)")
            return None
        if env.master:
            for group in refused:  # a line per damaged file, its other names in it
                print(f"warning: {checkpoint.report([group])}")
            print(f"resuming from {path} (iteration {ckpt['iter_num']})"
                  + (", the newest checkpoint that verifies" if refused else ""))
        return cfg, ckpt, None
    return starting_fresh(cfg, given)


def starting_fresh(cfg, given):
    """(cfg, None, pretrained state or None) of a run that starts from scratch or from pretrained weights,
    refused where out_dir holds a checkpoint that it would overwrite."""
    path = os.path.join(cfg.out_dir, 'ckpt.pt')
    if os.path.exists(path):
        raise UserError(f"{path} exists and a new run would overwrite it; continue it with --init_from=auto (or "
                        f"--init_from=resume), or pick another --out_dir (or delete the old one)")
    if hf.is_pretrained(cfg.init_from):
        keys, state = hf.read(cfg.init_from)
        return hf.adopt(cfg, keys, given), None, state
    return cfg, None, None


def restarted():
    """Whether torchrun restarted this process's group (--max-restarts), or Slurm requeued its job: the same
    command again, which continues the run in out_dir where it holds a checkpoint, whatever init_from says."""
    return any(int(os.environ.get(k) or 0) for k in ('TORCHELASTIC_RESTART_COUNT', 'SLURM_RESTART_COUNT'))


def newest(cfg, env):
    """(checkpoint, path, refused) that a resume continues: the newest checkpoint in out_dir that
    verifies, found by rank 0 and read by every process; refused: [(names, why)] of rank 0's newer
    files that did not verify. (None, None, []) where --init_from=auto finds no checkpoint there."""
    found = {}

    def find():
        if cfg.init_from != 'resume' and not checkpoint.candidates(cfg.out_dir):
            return None
        found['ckpt'], path, found['refused'] = checkpoint.load_latest(cfg.out_dir)
        return path
    path = parallel.decided(env, find)
    if path is None:
        return None, None, []
    return parallel.every_rank(env, lambda: found.get('ckpt') or checkpoint.load(path)), path, found.get('refused', [])


def announce(run, log, pretrained):
    """What rank 0 says and records before the first step: the config, the model, the resumption."""
    cfg, env, task, c = run.cfg, run.env, run.task, run.counters
    if not env.master:
        return
    if not cfg.eval_only:
        write_text(os.path.join(cfg.out_dir, 'config.json'), json.dumps(asdict(cfg), indent=1))
    if pretrained:
        print(f"starting from the weights of {cfg.init_from}")
    params = run.raw_model.num_params()
    looked_up = sum(p.numel() for n, p in run.raw_model.named_parameters() if n.startswith('value_embeds.'))
    print(f"{params:,} parameters{f' ({looked_up:,} of them value embeddings)' if looked_up else ''}, "
          f"residual={cfg.residual}, qkv={cfg.qkv}, mlp={cfg.mlp}; "
          f"{task.items_per_iter:,} {task.unit} per iteration; {env.world} process(es) on {env.device}, {env.dtype}")
    names = {p: n for n, p in run.raw_model.named_parameters()}
    print('\n'.join('  ' + line for line in run.optimizer.summary(names)))
    note = None if cfg.eval_only else warmup_note(cfg, c.schedule_start)
    if note:
        print(note)
    if c.iter_num == 0 and not cfg.eval_only:
        log.write({'iter': 0, 'event': 'start', 'parameters': params, 'value_embed_parameters': looked_up,
                   f'flops_per_{task.item}': run.flops_per_item,
                   f'{task.item}s_per_iter': task.items_per_iter})
    if c.history and c.history[-1]['iter'] == c.iter_num:
        log.write({'iter': c.iter_num, 'event': 'resume', **c.history[-1]})


def check_nonfinite(run, nonfinite, log):
    """Warn of the non-finite steps since the last check; stop (saving first) as nan_policy says."""
    cfg = run.cfg
    count, first, streak, bad = nonfinite.check()
    if not count:
        return
    where = ', '.join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else '')
    report = (f"non-finite loss or gradients at iteration {first} ({count} of the last {cfg.log_interval} "
              f"steps, skipped); parameters with non-finite gradients: {where or 'none (the loss itself)'}")
    log.write({'iter': run.counters.iter_num, 'event': 'nonfinite', 'first': first, 'count': count, 'params': bad})
    if cfg.nan_policy == 'stop' or streak >= cfg.nan_max_skips:
        run.save(False)
        run.writer.wait()
        why = ("nan_policy='stop'" if cfg.nan_policy == 'stop'
               else f"{streak} consecutive steps skipped (nan_max_skips={cfg.nan_max_skips})")
        raise UserError(f"{report}.\nStopped ({why}); the parameters from before those steps are saved in "
                        f"{cfg.out_dir}/ckpt.pt. Resume with a lower learning_rate or longer warmup_iters, "
                        f"or with --nan_policy=skip")
    if run.env.master:
        print(f"warning: {report}")


def discard(out_dir):
    """Whether out_dir, made by a run that failed before its first log line, held only what such a run
    writes (its lock, config.json, the log's start record), now removed but for the lock: no empty
    folder is left behind. Anything else there keeps the whole folder as it is; a file that cannot be
    removed keeps the folder, and the run's own error is the one reported."""
    names = set(os.listdir(out_dir)) - {lock.NAME}
    if names - {'config.json', 'log.jsonl', 'dynamics.jsonl'} or any('loss' in r for r in logs.read(out_dir)):
        return False
    try:
        for name in names:
            os.remove(os.path.join(out_dir, name))
    except OSError:
        return False
    return True


if __name__ == '__main__':
    main()
