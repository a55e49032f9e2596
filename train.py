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
uninterrupted (same process count), running an interrupted evaluation again first. A resumed
run may switch residual between rules that build the same parameters, such as 'additive' and
'orthogonal' (and change their options or dropout), with --reset_optimizer=True to restart the
optimizer and the schedule there; the change is recorded in the checkpoint's history.

One process writes an out_dir at a time: a second train.py on it is refused at once, naming the
first (a lock that the operating system releases when its holder dies, even by SIGKILL). Under
torchrun the workers stop as if by SIGTERM, saving first, when their launcher dies. A checkpoint
that cannot be written (a full disk) stops the run with the previous one intact. See
docs/reliability.md.
"""

import json
import math
import os
import signal
import statistics
import sys
import time
from dataclasses import asdict, replace

import torch
import torch.distributed as dist

import configure
from orthogpt import checkpoint, diagnostics, errors, hf, lock, parallel, resume, sharded
from orthogpt.errors import UserError
from orthogpt.estimate import check_cpu_run, format_time
from orthogpt.files import write_text
from orthogpt.logs import RunLog
from orthogpt.optim import NonFinite, StepScaler, make_optimizer, oom_advice, schedule, train_step
from orthogpt.rng import rng_state, seed_all, set_rng_state
from orthogpt.signals import Interrupt, Interrupted
from orthogpt.tasks import make_task


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
    env = parallel.setup(cfg)
    try:
        with parallel.master_holds(env, lambda: lock.hold(cfg.out_dir)):  # one run writes an out_dir
            train(cfg, env, argv, given)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        parallel.teardown(env)


def train(cfg, env, argv, given):
    # ------------------------------------------------------------------ setup: data, model, optimizer
    cfg, ckpt, pretrained = starting_point(cfg, env, given)
    task = make_task(cfg, env.device, env.rank, env.world)
    cfg = task.cfg  # with the dataset's vocabulary, or its images' shape
    seed_all(cfg.seed)  # the same initial weights in every process
    raw_model = task.model()
    if pretrained is not None:
        hf.fit(raw_model, pretrained)
    raw_model.to(env.device)
    model = parallel.parallelize(raw_model, cfg, env)
    optimizer = make_optimizer(raw_model, cfg, env.device_type)
    scaler = StepScaler(env.device_type, env.dtype)
    seed_all(cfg.seed + env.rank)  # dropout and stochastic connections differ per process
    # ------------------------------------------------------------------ resume: weights, counters, data, RNG
    run = dict(iter_num=0, best_val_loss=math.inf, schedule_start=0, last_eval=-1, history=[])
    if ckpt is not None:
        run = restore(ckpt, cfg, env, task, raw_model, optimizer, scaler)
    start_iter = run['iter_num']
    names = {p: n for n, p in raw_model.named_parameters()}
    nonfinite = NonFinite([names[p] for g in optimizer.param_groups for p in g['params']], env.device)
    log = RunLog(cfg, env.master, start_iter)
    announce(cfg, env, task, raw_model, optimizer, run, log, pretrained is not None)
    if env.device_type == 'cpu' and not env.fsdp and not cfg.eval_only:
        evals = sum(evaluates_at(i, cfg, run) for i in range(start_iter, cfg.max_iters + 1))
        check_cpu_run(cfg, env, task, raw_model, argv, cfg.max_iters - start_iter, evals)
    # ------------------------------------------------------------------ the loop
    interrupt = Interrupt()

    def evaluate():  # a signal stops it between batches (Interrupted)
        with parallel.maps_of(model, env):
            return task.evaluate(model, env.autocast, env.ddp, cfg.eval_iters, lambda: interrupt.check(env.ddp, env.device))
    try:
        if cfg.eval_only:
            if env.master:
                print(f"iter {run['iter_num']}: {describe(evaluate())}")
            return
        t_last, since, dts = time.perf_counter(), 0, []
        while True:
            it = run['iter_num']
            if evaluates_at(it, cfg, run):
                metrics = evaluate()
                best = metrics['val_loss'] < run['best_val_loss']
                run.update(best_val_loss=min(run['best_val_loss'], metrics['val_loss']), last_eval=it)
                if env.master and cfg.dynamics:  # Oh et al. App. D: effective rank of the final representation
                    metrics['effective_rank'] = diagnostics.final_rank(raw_model, task.eval_inputs())
                if env.master:
                    print(f"step {it}: {describe(metrics)}{' (best)' if best else ''}")
                log.write({'iter': it, **metrics})
                if it > 0:  # from scratch, iteration 0 has nothing to save
                    save(cfg, env, run, task, raw_model, optimizer, scaler, best)
                t_last, since = time.perf_counter(), 0
            if it >= cfg.max_iters:
                break
            lr = schedule(optimizer, it, cfg, run['schedule_start'])
            try:
                loss, grad_norms = train_step(model, optimizer, scaler, task.next_batch,
                                              cfg.gradient_accumulation_steps // env.world, cfg.grad_clip,
                                              env.autocast, env)
            except torch.OutOfMemoryError:
                raise UserError(oom_advice(cfg, it == start_iter)) from None
            nonfinite.record(it, loss, grad_norms)
            run['iter_num'] = it = it + 1
            since += 1
            if env.master and cfg.dynamics and it % cfg.dynamics_interval == 0:
                log.write(diagnostics.dynamics_record(raw_model, task.batch[0], it), 'dynamics')
            at_log = it % cfg.log_interval == 0  # the host syncs here only
            if at_log:
                if env.master:
                    now = time.perf_counter()
                    dt, t_last, since = (now - t_last) / since, now, 0
                    dts.append(dt)
                    eta = statistics.median_high(dts) * (cfg.max_iters - it)
                    lossf, per_s = loss.item(), task.items_per_iter / dt
                    print(f"iter {it}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                          f"{per_s:,.0f} {task.unit}/s{task.progress()}, eta {format_time(eta)}")
                    log.write({'iter': it, 'loss': lossf, 'lr': lr, 'ms_per_iter': dt * 1000,
                               f'{task.unit}_per_s': per_s})
                check_nonfinite(nonfinite, cfg, env, run, log, lambda: save(cfg, env, run, task, raw_model,
                                                                            optimizer, scaler, False))
            signum = interrupt.agreed(env.ddp, env.device) if at_log or not env.ddp else 0
            if signum:
                raise Interrupted(signum, evaluating=False)
        if env.master:
            med = statistics.median_high(dts) if dts else None
            print(f"done: {run['iter_num']} iterations, best val loss {run['best_val_loss']:.4f}"
                  + (f", median {med * 1000:.1f} ms/iter, {task.items_per_iter / med:,.0f} {task.unit}/s" if dts else ''))
    except Interrupted as e:  # save what is new since the last checkpoint; an evaluation cut short runs again
        saved = run['iter_num'] > start_iter and not cfg.eval_only
        if saved:
            save(cfg, env, run, task, raw_model, optimizer, scaler, False)
        if env.master:
            what = (f"checkpoint saved to {cfg.out_dir}/ckpt.pt; continue with --init_from=resume" if saved
                    else "nothing new to save")
            print(f"stopped by {signal.Signals(e.signum).name} {'during the evaluation ' if e.evaluating else ''}"
                  f"at iteration {run['iter_num']}; {what}")
    finally:
        interrupt.restore()
        log.close()


def evaluates_at(it, cfg, run):
    """Whether the run evaluates at iteration it: every eval_interval, at max_iters, not twice."""
    return (it % cfg.eval_interval == 0 or it == cfg.max_iters) and it != run['last_eval']


def describe(metrics):
    return ', '.join(f"{k.replace('_', ' ')} {v:.4f}" if 'loss' in k else f"{k} {v:.2f}%" if 'top' in k
                     else f"{k.replace('_', ' ')} {v:.2f}" for k, v in metrics.items())


def starting_point(cfg, env, given):
    """(cfg, checkpoint, pretrained state): what the run starts from, a checkpoint of its own to
    resume (--init_from=resume), pretrained weights (a GPT-2 name or a Hugging Face folder), or
    nothing. Pretrained weights fix the architecture, for the run and for its resumptions."""
    if cfg.init_from == 'resume':
        ckpt, path, refused = checkpoint.load_latest(cfg.out_dir)
        if env.master:
            for _, reason in refused:
                print(f"warning: {reason}")
            print(f"resuming from {path} (iteration {ckpt['iter_num']})"
                  + (", the newest checkpoint that verifies" if refused else ""))
        saved = configure.from_dict(ckpt['config'])
        if hf.is_pretrained(saved.init_from):  # the saved architecture again; the weights' origin kept
            cfg = replace(hf.adopt(cfg, asdict(configure.model_config(saved)), given), init_from=saved.init_from)
        return cfg, ckpt, None
    path = os.path.join(cfg.out_dir, 'ckpt.pt')
    if os.path.exists(path):
        raise UserError(f"{path} exists and a new run would overwrite it; continue it with --init_from=resume, or "
                        f"pick another --out_dir (or delete the old one)")
    if hf.is_pretrained(cfg.init_from):
        keys, state = hf.read(cfg.init_from)
        return hf.adopt(cfg, keys, given), None, state
    return cfg, None, None


def restore(ckpt, cfg, env, task, raw_model, optimizer, scaler):
    """The run's counters and history from its checkpoint, after checking that cfg can continue
    it; the weights, optimizer and scaler state, and this process's data stream and RNG, loaded."""
    saved = configure.from_dict(ckpt['config'])
    problems = resume.problems(saved, cfg) + task.resume_problems(saved, ckpt['meta'])
    if bool(ckpt['sharded']) != env.fsdp:
        problems.append(f"the checkpoint was written with parallel={'fsdp' if ckpt['sharded'] else 'ddp'!r}; "
                        f"resume it with that value (FSDP under torchrun)")
    if problems:
        raise UserError(f"cannot resume from {cfg.out_dir} with this config:\n  " + "\n  ".join(problems))
    checkpoint.load_weights(raw_model, ckpt, os.path.join(cfg.out_dir, 'ckpt.pt'),
                            None if cfg.reset_optimizer else optimizer)
    run = {k: ckpt[k] for k in ('iter_num', 'best_val_loss', 'schedule_start', 'last_eval', 'history')}
    if cfg.reset_optimizer:
        run['schedule_start'] = run['iter_num']
    elif ckpt['scaler']:
        scaler.load_state_dict(ckpt['scaler'])
    streams = ckpt['streams']
    if len(streams) == env.world:
        task.load_state_dict(streams[env.rank]['data'])
        set_rng_state(streams[env.rank]['rng'])
    elif env.master:
        print(f"note: checkpoint written by {len(streams)} processes, resuming on {env.world}: data streams re-seeded")
    changes = resume.changes(saved, cfg)
    if changes or cfg.reset_optimizer:
        run['history'].append({'iter': run['iter_num'], 'changes': changes, 'reset_optimizer': cfg.reset_optimizer})
        if env.master:
            print(f"at iteration {run['iter_num']}: " + ', '.join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
                  + (" (optimizer and schedule reset)" if cfg.reset_optimizer else ""))
    return run


def announce(cfg, env, task, raw_model, optimizer, run, log, pretrained):
    """What rank 0 says and records before the first step: the config, the model, the resumption."""
    if not env.master:
        return
    if not cfg.eval_only:
        write_text(os.path.join(cfg.out_dir, 'config.json'), json.dumps(asdict(cfg), indent=1))
    if pretrained:
        print(f"starting from the weights of {cfg.init_from}")
    print(f"{raw_model.num_params():,} parameters, residual={cfg.residual}, qkv={cfg.qkv}, mlp={cfg.mlp}; "
          f"{task.items_per_iter:,} {task.unit} per iteration; {env.world} process(es) on {env.device}, {env.dtype}")
    names = {p: n for n, p in raw_model.named_parameters()}
    print('\n'.join('  ' + line for line in optimizer.summary(names)))
    if run['iter_num'] == 0 and not cfg.eval_only:
        log.write({'iter': 0, 'event': 'start', 'parameters': raw_model.num_params()})
    if run['history'] and run['history'][-1]['iter'] == run['iter_num']:
        log.write({'iter': run['iter_num'], 'event': 'resume', **run['history'][-1]})


def save(cfg, env, run, task, raw_model, optimizer, scaler, best):
    """A checkpoint of every process's state, written by rank 0 (under FSDP the weights and optimizer
    state by every process, sharded); best.pt too if best."""
    mine = {'data': task.state_dict(), 'rng': rng_state(env.device_type), 'weights': parallel.fingerprint(raw_model)}
    streams = [mine]
    if env.ddp:
        streams = [None] * env.world
        dist.all_gather_object(streams, mine)
        if not env.fsdp and not all(torch.equal(s['weights'], mine['weights']) for s in streams):
            raise UserError(f"at iteration {run['iter_num']} the {env.world} processes hold different weights: "
                            f"DDP replicas diverged")
    folder = sharded.save(raw_model, optimizer, cfg.out_dir, run['iter_num'], env.master) if env.fsdp else None
    if not env.master:
        return
    path = os.path.join(cfg.out_dir, 'ckpt.pt')
    checkpoint.save({**run, 'model': None if folder else raw_model.state_dict(),
                     'optimizer': None if folder else optimizer.state_dict(), 'sharded': folder,
                     'scaler': scaler.state_dict(), 'streams': streams, 'config': json.dumps(asdict(cfg)),
                     'meta': json.dumps(task.meta) if task.meta else None}, path)
    checkpoint.snapshot(cfg.out_dir, run['iter_num'], cfg.keep_last_n)
    if best:
        checkpoint.keep_best(cfg.out_dir)
    keep = checkpoint.named_folders(cfg.out_dir) if folder else None
    if keep is not None:
        sharded.prune(cfg.out_dir, keep)


def check_nonfinite(nonfinite, cfg, env, run, log, save_now):
    """Warn of the non-finite steps since the last check; stop (saving first) as nan_policy says."""
    count, first, streak, bad = nonfinite.check()
    if not count:
        return
    where = ', '.join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else '')
    report = (f"non-finite loss or gradients at iteration {first} ({count} of the last {cfg.log_interval} "
              f"steps, skipped); parameters with non-finite gradients: {where or 'none (the loss itself)'}")
    log.write({'iter': run['iter_num'], 'event': 'nonfinite', 'first': first, 'count': count, 'params': bad})
    if cfg.nan_policy == 'stop' or streak >= cfg.nan_max_skips:
        save_now()
        why = ("nan_policy='stop'" if cfg.nan_policy == 'stop'
               else f"{streak} consecutive steps skipped (nan_max_skips={cfg.nan_max_skips})")
        raise UserError(f"{report}.\nStopped ({why}); the parameters from before those steps are saved in "
                        f"{cfg.out_dir}/ckpt.pt. Resume with a lower learning_rate or longer warmup_iters, "
                        f"or with --nan_policy=skip")
    if env.master:
        print(f"warning: {report}")


if __name__ == '__main__':
    main()
