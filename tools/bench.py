"""Training throughput per residual variant, measured side by side.

    python tools/bench.py config/shakespeare_add.py config/cpu.py
    python tools/bench.py config/shakespeare_add.py --variants=additive,rotation --steps=20 --repeats=9
    python tools/bench.py config/shakespeare_add.py --compile --profile=trace   # CUDA: add --peak_tflops if unknown
    python tools/bench.py config/shakespeare_add.py --sample --compile          # generation: cached, uncached, compiled
    python tools/bench.py config/shakespeare_add.py config/cpu.py --rules       # each update rule and Q/K/V map alone

For each variant the config is rebuilt with that variant's keys, then timed on one real batch
of its dataset, reused (a step's speed does not depend on the data): forward, backward and
AdamW step per iteration, at the config's batch_size, block_size and gradient_accumulation_steps
(tokens/s for a GPT, images/s for a ViT). The
variants are timed in interleaved rounds (A B C A B C ...) so that a machine whose speed
drifts biases none of them; each cell is the median over rounds, with the min-max spread, and
the overhead against the first variant is the median of the per-round ratios (each variant
against the first in the same round: paired, so drift between rounds cancels).
--sample times generation instead (orthogpt/decoding.py): --sample_tokens new tokens after a
one-token prompt, batch 1, top_k 200, with the model's DecodeState ('cached', eager) and without
('uncached': the whole window read for every token, the same tokens), and with --compile the
cached step compiled ('compiled': a block at a time, or whole for a variant's compile_scope=model). Each variant and decoder first makes one whole untimed
generation (the compiled one compiles its step there), then the timed ones run in interleaved
rounds; the time to compile is that first generation's time less the timed generations' median.
--rules times forward + backward of each piece a variant adds, alone, at the config's shape: the
update rule on (batch_size, block_size, n_embd) tensors (its wider stream where it keeps one), the
orthogonal Q/K/V map of one layer, and every layer's maps in one batched call (as training
computes them). The step table's "saved for backward" column is the activation memory of one
eager forward of a micro-batch (what a wider stream multiplies), on a CPU as on a GPU.
The variants are every residual rule in model.RESIDUALS (with dense Q/K/V) and every orthogonal
Q/K/V map in model.QKV_MAPS (with the additive rule); `--variants=hc,hc:hc_recompute=True`
sets keys of a variant's own, such as its rule's options, and `additive:config/modern.py` stacks
a config file over one (the rule in the modern block). With --compile the table gives each variant's
time to compile (its first iteration's less a timed one's); `--variants=mhc:compile=False,mhc,
mhc:compile_scope=model` times mHC eager, compiled a block at a time (the default) and whole.
"""

import argparse
import os
import resource
import sys
import time
from dataclasses import replace
from statistics import median_high as median  # a value that was measured, never an average of two

import torch
from torch._dynamo.utils import counters
from torch.autograd import DeviceType

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
import configure  # noqa: E402
from model import QKV_MAPS, RESIDUALS, OrthogonalQKV, Sublayer, copied  # noqa: E402
from orthogpt import decoding, diagnostics, errors, parallel  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402
from orthogpt.run import setup  # noqa: E402

DECODERS = {'cached': dict(), 'uncached': dict(use_cache=False), 'compiled': dict(compile=True)}  # --sample's
PEAK_TFLOPS = {'H100': 989.0, 'H200': 989.0, 'A100': 312.0, 'L4': 121.0, 'A10': 125.0}  # bf16 dense


def variants():
    """{variant: its config keys}: every residual rule registered now, then every Q/K/V map."""
    return {**{name: dict(residual=name, qkv='dense') for name in RESIDUALS},
            **{kind: dict(residual='additive', qkv=kind) for kind, f in QKV_MAPS.items() if f is not None}}


def paired_overhead(times, reference):
    """Median over rounds of times[r] / reference[r] - 1: each round compared with the same round."""
    return median([t / r for t, r in zip(times, reference)]) - 1


def peak_flops(device, override):
    if override:
        return override * 1e12
    if device.startswith('cuda'):
        name = torch.cuda.get_device_name(device)
        for key, tflops in PEAK_TFLOPS.items():
            if key in name:
                return tflops * 1e12
    return None


class Runner:
    """One variant's model, optimizer and batch, stepped as train.py steps them (env: its process,
    device, dtype and DDP or FSDP)."""

    def __init__(self, cfg, env):
        self.run = setup(cfg, env)
        self.x, self.y = self.run.task.batch

    def step(self):
        self.run.step(lambda: (self.x, self.y))

    def saved_for_backward(self):
        """Bytes of the activations one eager forward of a micro-batch keeps for its backward: every
        storage saved, once, but the parameters' (what a wider stream costs in memory, on any device)."""
        if self.run.env.fsdp:  # its forward takes every process
            return None
        params = {p.untyped_storage().data_ptr() for p in self.run.raw_model.parameters()}
        seen = set()

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                seen.add((storage.data_ptr(), storage.nbytes()))
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), parallel.maps_of(self.run.raw_model, self.run.env), \
                self.run.env.autocast:
            self.run.raw_model(self.x, self.y)
        return sum(n for _, n in seen)

    def time_dynamics(self, gains):
        """Seconds for one --dynamics record, as train.py makes it, with or without the stream map's gains."""
        self.sync()
        t0 = time.perf_counter()
        diagnostics.dynamics_record(self.run.raw_model, self.x, 0, self.y, gains)
        self.sync()
        return time.perf_counter() - t0

    def time_sampling(self, new_tokens, decoder):
        """Seconds of one generation by `decoder` (one of DECODERS)."""
        self.run.raw_model.eval()
        prompt = torch.zeros(1, 1, dtype=torch.long, device=self.run.env.device)
        generator = torch.Generator(self.run.env.device).manual_seed(0)
        self.sync()
        t0 = time.perf_counter()
        with self.run.env.autocast:
            decoding.generate(self.run.raw_model, prompt, new_tokens, top_k=200, generator=generator,
                              compile_scope=self.run.cfg.compile_scope, **DECODERS[decoder])
        self.sync()
        self.run.raw_model.train()
        return time.perf_counter() - t0

    def sync(self):
        if self.run.env.device_type == 'cuda':
            torch.cuda.synchronize(self.run.env.device)

    def time(self, steps):
        """Mean seconds per iteration over `steps` iterations; on CUDA also records the peak
        memory of this model alone (its weights and optimizer state plus the step's transients)."""
        self.sync()
        if self.run.env.device_type == 'cuda':
            torch.cuda.reset_peak_memory_stats(self.run.env.device)
            resident = torch.cuda.memory_allocated(self.run.env.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.sync()
        if self.run.env.device_type == 'cuda':
            own = sum(t.numel() * t.element_size() for t in self.run.raw_model.parameters())
            own += sum(t.numel() * t.element_size() for o in self.run.optimizer for s in o.state.values()
                       for t in s.values() if torch.is_tensor(t))
            self.peak_memory = max(getattr(self, 'peak_memory', 0),
                                   torch.cuda.max_memory_allocated(self.run.env.device) - resident + own)
        return (time.perf_counter() - t0) / steps


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config', nargs='*', help='config files and --key=value overrides, as for train.py')
    p.add_argument('--variants', default=','.join(variants()), help=f"any of {','.join(variants())} (default: all)")
    p.add_argument('--steps', type=int, default=20, help='iterations per timed round')
    p.add_argument('--repeats', type=int, default=7, help='timed rounds per variant')
    p.add_argument('--warmup', type=int, default=5, help='untimed iterations per variant first')
    p.add_argument('--compile', action='store_true', help='torch.compile each model')
    p.add_argument('--peak_tflops', type=float, default=None, help='device peak for MFU (default: a table for known GPUs)')
    p.add_argument('--profile', default=None, help='write a torch profiler trace of each variant to this folder')
    p.add_argument('--dynamics', action='store_true',
                   help="also time train.py's --dynamics records, with and without the stream map's gains, against the steps")
    p.add_argument('--sample', action='store_true',
                   help='time generation instead: cached, uncached and, with --compile, compiled')
    p.add_argument('--sample_tokens', type=int, default=500, help='new tokens per timed generation')
    p.add_argument('--rules', action='store_true', help='time each update rule and Q/K/V map alone instead')
    args, rest = p.parse_known_args(argv)
    # cold compiles: the compile column times one, not a hit in inductor's caches of an earlier run
    torch._inductor.config.force_disable_caches = args.compile
    compiled = [f'--compile={args.compile}']  # before the variants' keys: `additive:compile=False` times eager mode
    configs = {v: configure.load(args.config + rest + compiled + overrides(v)) for v in args.variants.split(',')}
    base = replace(configure.load(args.config + rest), compile=args.compile)
    env = parallel.setup(base)
    try:
        bench(base, configs, env, args)
    finally:
        parallel.teardown(env)


def overrides(variant):
    """The config overrides of a variant: NAME (one of variants()), or NAME:key=value:... with more
    keys set over it, such as its rule's options (mhc:mhc_res=identity:hc_recompute=True), or config
    files stacked over it (additive:config/modern.py, the rule in the modern block)."""
    name, *keys = variant.split(':')
    known = variants()
    if name not in known:
        raise UserError(f"unknown variant {name!r} in {variant!r}; choose from {', '.join(known)}, each optionally "
                        f"followed by :key=value or :CONFIG_FILE.py")
    bad = [k for k in keys if '=' not in k and not k.endswith('.py')]
    if bad:
        raise UserError(f"variant {variant!r}: {', '.join(bad)} is neither key=value nor a config file (.py)")
    return [f'--{k}={v}' for k, v in known[name].items()] + [k if k.endswith('.py') else f'--{k}' for k in keys]


def bench(base, configs, env, args):
    if args.rules:
        return bench_rules(base, env.device, args)
    if args.sample and env.fsdp:
        raise UserError("--sample times generation with one process's whole model; use --parallel=ddp")
    runners = {v: Runner(cfg, env) for v, cfg in configs.items()}
    if args.sample:
        return bench_sampling(runners, args)
    # before any step, while each model holds only its weights: beside every model's gradients and
    # optimizer state, an eager forward at the GPT-2 shape does not fit in one GPU
    saved = {v: r.saved_for_backward() for v, r in runners.items()}
    times, first = time_steps(runners, args)
    if args.profile:
        for v, r in runners.items():
            profile(r, os.path.join(args.profile, v))
    if env.master:
        step_table(runners, times, first, saved, args)
    if args.dynamics and env.master:
        dynamics_table(runners, times, base, args)


def dynamics_table(runners, times, base, args):
    """train.py's --dynamics records, without and with the stream map's gains, and their cost against the steps."""
    every, gains = base.dynamics_interval, base.dynamics_gain_interval
    print(f"\n| variant | a dynamics record, ms | one with the stream map's gains, ms | overhead at dynamics_interval="
          f"{every}, gains every {gains} |\n|---|---|---|---|")
    for v, r in runners.items():
        plain, full = (median([r.time_dynamics(g) for _ in range(args.repeats)]) for g in (False, True))
        cost = plain / every + (full - plain) / max(gains, every)
        print(f"| {v} | {plain * 1e3:.1f} | {full * 1e3:.1f} | {cost / median(times[v]):.2%} |")


def time_steps(runners, args):
    """({variant: seconds per iteration in each round}, {variant: seconds of its first iteration}): warmup, then
    interleaved rounds. Compiled, the first iteration compiles (training's graphs; evaluation's would be more)."""
    first = {}
    for v, r in runners.items():
        t0 = time.perf_counter()
        r.step()
        r.sync()
        first[v] = time.perf_counter() - t0
        for _ in range(args.warmup - 1):
            r.step()
        r.sync()
        if r.run.env.master:  # as it goes: a run stopped at a time limit still shows how far it got
            print(f"{v}: warmed up ({args.warmup} iterations{', compiled in the first' if args.compile else ''}) in "
                  f"{time.perf_counter() - t0:.1f} s, the first {first[v]:.1f} s", flush=True)
    times = {v: [] for v in runners}
    for _ in range(args.repeats):
        for v, r in runners.items():
            times[v].append(r.time(args.steps))
    return times, first


def step_table(runners, times, first, saved, args):
    first_variant = next(iter(runners))
    r0 = runners[first_variant]
    c, peak = r0.run.task.cfg, peak_flops(r0.run.env.device, args.peak_tflops)
    shape = f"block {c.block_size}" if r0.run.task.unit == 'tok' else f"{c.image_size}px images in {c.patch_size}px patches"
    print(f"{r0.run.env.device}, {r0.run.env.dtype}, {torch.get_num_threads()} threads, compile={args.compile}, "
          f"{r0.run.env.world} process(es){', FSDP' if r0.run.env.fsdp else ''}; batch {c.batch_size} x {shape} x accum "
          f"{c.gradient_accumulation_steps}, {c.n_layer} layers x {c.n_embd}; median of {args.repeats} interleaved "
          f"rounds of {args.steps} iterations")
    compiling = ' compile, s |' if args.compile else ''  # the first iteration's time less a timed one's
    print(f"| variant | parameters | ms/iter (median) | spread (min-max) | {r0.run.task.unit}/s | MFU | peak memory | "
          f"saved for backward | vs {first_variant} |{compiling}")
    print("|---|---|---|---|---|---|---|---|---|" + '---|' * bool(compiling))
    for v, r in runners.items():
        ts = sorted(times[v])
        med, items = median(ts), r.run.task.items_per_iter
        mfu = f"{r.run.task.flops_per_item(r.run.raw_model) * items / med / peak:.1%}" if peak else '-'
        mem = (f"{r.peak_memory / 2**30:.2f} GiB" if r.run.env.device_type == 'cuda' else
               f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (process)")
        print(f"| {v} | {r.run.raw_model.num_params():,} | {med * 1e3:.1f} | {ts[0] * 1e3:.1f}-{ts[-1] * 1e3:.1f} | "
              f"{items / med:,.0f} | {mfu} | {mem} | {mib(saved[v])} | "
              f"{paired_overhead(times[v], times[first_variant]) * 100:+.1f}% |"
              + (f" {first[v] - med:.1f} |" if compiling else ''))


def mib(n):
    return '-' if n is None else f"{n / 2**20:,.3f} MiB"


def profile(runner, path, steps=3, top=15):
    """A torch.profiler trace of `steps` iterations to PATH.json, and PATH.md: the top kernels (on
    a CPU, operators) by their own time, with their share of the whole."""
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    cuda = runner.run.env.device_type == 'cuda'
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        runner.time(steps)
    prof.export_chrome_trace(path + '.json')
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    # on CUDA the kernels alone: an operator's (and a Triton launcher's) own device time is its kernels' again
    kept = (lambda e: e.device_type == DeviceType.CUDA) if cuda else (lambda e: True)
    events = sorted((e for e in prof.key_averages() if kept(e) and own(e) > 0), key=own, reverse=True)
    total = sum(own(e) for e in events)
    lines = [f"{'kernels' if cuda else 'operators'} of {steps} steps by own {'GPU' if cuda else 'CPU'} time "
             f"({total / 1e3 / steps:.1f} ms a step)", "",
             f"| {'kernel' if cuda else 'operator'} | calls | ms a step | share |", "|---|---|---|---|"]
    lines += [f"| `{e.key[:80]}` | {e.count // steps} | {own(e) / 1e3 / steps:.2f} | {own(e) / total:.1%} |"
              for e in events[:top]]
    with open(path + '.md', 'w') as f:
        f.write('\n'.join(lines) + '\n')
    print(f"wrote {path}.json (chrome://tracing or ui.perfetto.dev) and {path}.md:\n" + '\n'.join(lines))


def bench_sampling(runners, args):
    if any(r.run.task.unit != 'tok' for r in runners.values()):
        raise UserError("--sample times text generation; give a language-model config")
    decoders = [d for d in DECODERS if args.compile or d != 'compiled']
    # every variant's graphs count against one limit: the whole step's, one a model; a block's, a few a model (a
    # graph a block with Q/K/V maps)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               len(runners) * (max(r.run.cfg.n_layer for r in runners.values()) + 2))
    first = {(v, d): r.time_sampling(args.sample_tokens, d) for v, r in runners.items() for d in decoders}
    times = {key: [] for key in first}
    for _ in range(args.repeats):
        for v, r in runners.items():
            for d in decoders:
                times[v, d].append(r.time_sampling(args.sample_tokens, d))
    r0 = next(iter(runners.values()))
    c = r0.run.cfg
    print(f"{r0.run.env.device}, {r0.run.env.dtype}, {torch.get_num_threads()} threads; {c.n_layer} layers x "
          f"{c.n_embd}, block {c.block_size}; {args.sample_tokens} new tokens after a 1-token prompt, batch 1, top_k "
          f"200, window shift block // 4; median of {args.repeats} interleaved rounds, after one untimed generation "
          f"of each")
    columns = ['cached tokens/s', 'uncached tokens/s', 'cached / uncached']
    columns += ['compiled tokens/s', 'compiled / cached', 'time to compile, s'] if args.compile else []
    print(f"| variant | {' | '.join(columns)} |")
    print('|---' * (len(columns) + 1) + '|')
    for v in runners:
        rate = {d: args.sample_tokens / median(times[v, d]) for d in decoders}
        cells = [f"{rate['cached']:,.0f}", f"{rate['uncached']:,.0f}", f"{rate['cached'] / rate['uncached']:.1f}x"]
        if args.compile:
            cells += [f"{rate['compiled']:,.0f}", f"{rate['compiled'] / rate['cached']:.1f}x",
                      f"{first[v, 'compiled'] - median(times[v, 'compiled']):.1f}"]
        print(f"| {v} | {' | '.join(cells)} |")
    if args.compile and r0.run.env.device_type == 'cuda':  # inductor skips a CUDA graph silently, for a slower step
        skips = counters['inductor']['cudagraph_skips']
        print(f"- `compiled`: CUDA graphs skipped {skips} times" + (" (TORCH_LOGS=cudagraphs says why)" if skips else ""))


def update(rule, x, u, g):
    """One sublayer's update, forward and backward: the stream prepared, then u written in; g the
    stream's gradient (the branch input's: u's values)."""
    sub = Sublayer()
    h = rule.prepare(x, sub)
    torch.autograd.backward([rule(x, u, sub), h], [g, u.detach()])


def bench_rules(cfg, device, args):
    """Microseconds per forward + backward of each piece alone, median of interleaved rounds."""
    shape, d = (cfg.batch_size, cfg.block_size, cfg.n_embd), cfg.n_embd
    x, u, g = (torch.randn(shape, device=device, requires_grad=i < 2) for i in range(3))
    w = torch.randn(3 * d, d, device=device).mul_(0.02).requires_grad_()
    ws = torch.randn(cfg.n_layer, 3 * d, d, device=device).mul_(0.02).requires_grad_()  # as batched_maps stacks them
    pieces = {}
    for name, rule in RESIDUALS.items():
        own = replace(cfg, residual=name)
        xs, gs = copied(x, rule.copies(own)).detach().requires_grad_(), copied(g, rule.copies(own))  # the rule's stream
        pieces[f'{name} update'] = lambda r=rule.from_config(own, 0, True).to(device), xs=xs, gs=gs: update(r, xs, u, gs)
    for kind in (k for k, f in QKV_MAPS.items() if f is not None):
        pieces[f'{kind} Q/K/V map, one layer'] = lambda m=OrthogonalQKV(kind): m(w).sum().backward()
        pieces[f'{kind} Q/K/V maps, {cfg.n_layer} layers batched'] = lambda m=OrthogonalQKV(kind): m(ws).sum().backward()
    sync = torch.cuda.synchronize if device.startswith('cuda') else (lambda: None)
    times = {k: [] for k in pieces}
    for _ in range(args.repeats):
        for k, f in pieces.items():
            f()
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                f()
            sync()
            times[k].append((time.perf_counter() - t0) / args.steps)
    print(f"{device}, {torch.get_num_threads()} threads; update rules on {shape} float32 tensors, maps of "
          f"(3 x {d} x {d}); median of {args.repeats} interleaved rounds of {args.steps}")
    print("| piece | forward + backward, us | spread (min-max) |")
    print("|---|---|---|")
    for k, ts in times.items():
        ts.sort()
        print(f"| {k} | {median(ts) * 1e6:,.0f} | {ts[0] * 1e6:,.0f}-{ts[-1] * 1e6:,.0f} |")


if __name__ == '__main__':
    main()
