"""Python's work in a training iteration, ours against nanoGPT's: each train.py run under cProfile for 200 and for 100
iterations (one evaluation each, at the same place), and the difference over 100, so that imports and setup cancel.
Prints the function calls an iteration and the 12 functions called most: counts, the same on any machine (the
times cProfile takes are its own hooks' and the machine's). Run through run.sh, which lays nanoGPT out and passes its folder:
CALLS=1 NANOGPT=../nanoGPT bash docs/logs/nanogpt_step/run.sh."""
import os
import pstats
import subprocess
import sys
import tempfile

NANO = sys.argv[1]  # a folder laid out as run.sh lays out nanoGPT (its scripts, data/shakespeare_char with meta.pkl)
RECIPE = ['--lr_decay_iters=2000', '--log_interval=10', '--eval_interval=1000', '--eval_iters=20']
RUNS = {
    'nanogpt': (NANO, ['train.py', 'config/train_shakespeare_char.py', '--device=cpu', '--compile=False',
                       '--block_size=64', '--batch_size=12', '--n_layer=4', '--n_head=4', '--n_embd=128',
                       '--dropout=0.0', '--always_save_checkpoint=False']),
    'ours': ('.', ['train.py', 'config/shakespeare_add.py', 'config/cpu.py']),
}
with tempfile.TemporaryDirectory() as tmp:
    for name, (cwd, argv) in RUNS.items():
        found = {}
        for iters in (200, 100):
            prof = os.path.join(tmp, f'{name}{iters}.prof')
            subprocess.run([sys.executable, '-m', 'cProfile', '-o', prof, *argv, *RECIPE, f'--max_iters={iters}',
                            f'--out_dir={os.path.join(tmp, f"out-{name}{iters}")}'], cwd=cwd, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            found[iters] = pstats.Stats(prof)
        a, b = found[200], found[100]
        print(f"{name}: {(a.total_calls - b.total_calls) / 100:,.0f} Python function calls an iteration; the most "
              f"called:")
        per = {k: (v[1] - b.stats.get(k, (0,) * 4)[1]) / 100 for k, v in a.stats.items()}
        for (path, line, func), calls in sorted(per.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {calls:6.1f}  {os.path.basename(path)}:{line} {func}")
