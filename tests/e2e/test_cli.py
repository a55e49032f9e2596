"""What a new user meets at the command line: the CPU estimate, the busy machine named and the stop
of a GPU-sized run, progress bars on a terminal, stopping during an evaluation, torchrun's report of
a user error, the list of config files, a short run's schedule and no empty folder after a failed
start. Where a test needs a signalling model, it registers a residual rule of
its own, as a user would (the loop itself is not patched)."""

import os
import signal
import subprocess
import sys

import pytest

import train
from model import AdditiveUpdate
from orthogpt import checkpoint, estimate


class SignalInEvaluation(AdditiveUpdate):
    """x + u; in the evaluation after optimizer step `at`, block 0's attention update (residual layer
    0) sends SIGTERM to this process during the `batch`-th batch (after_step runs once at init and
    after every step)."""
    at, batch, steps, calls = None, 3, 0, 0

    @classmethod
    def from_config(cls, cfg, layer, causal):
        return cls() if layer == 0 else AdditiveUpdate()

    @classmethod
    def after_step(cls, model):
        cls.steps += 1

    def forward(self, x, u, sub=None):
        if not self.training and self.steps == self.at:
            type(self).calls += 1
            if self.calls == self.batch:
                os.kill(os.getpid(), signal.SIGTERM)
        return x + u


@pytest.mark.slow
def test_a_cpu_run_is_estimated_and_a_gpu_sized_one_stops_with_the_cpu_command(run, root, tmp_path, char_data, capsys):
    run('--max_iters=10', '--eval_interval=10', '--device=auto', out='small')
    out = capsys.readouterr().out
    assert 'on this CPU: about ' in out and 'for 10 iterations and 2 evaluations' in out
    assert 'sized for a GPU' not in out and 'done: 10 iterations' in out
    # the paper's 16 x 256 model with its batch of 64 x 256 tokens: hours on a CPU
    args = [os.path.join(root, 'config', 'shakespeare_rot.py'), f'--data_dir={char_data}', f'--out_dir={tmp_path / "big"}']
    with pytest.raises(SystemExit) as stop:
        train.main(args)
    message, printed = str(stop.value), capsys.readouterr().out
    assert 'this config is sized for a GPU (16 layers x 256, 16,384 tok a step) and no GPU is here' in message
    cpu = os.path.relpath(os.path.join(root, 'config', 'cpu.py'))
    assert f"config/shakespeare_rot.py {cpu} --data_dir=" in message and 'anyway with --device=cpu' in message
    assert 'step 0:' not in printed and not (tmp_path / 'big').exists()  # stopped before evaluating, its folder gone


@pytest.mark.parametrize('far,timed', [(0.0, False), (float('inf'), True)])
def test_a_run_far_past_the_limit_stops_after_its_first_passes_and_one_near_it_after_the_timings(
        run, capsys, monkeypatch, tmp_path, far, timed):
    """Injected: a limit of a nanosecond, and FAR at 0 (any first pass is far past it) or infinite (none is). The
    first pass of each kind is the timings' warm-up: a training pass and an evaluation batch, then 3 timings of each."""
    monkeypatch.setattr(estimate, 'LIMIT', 1e-9)
    monkeypatch.setattr(estimate, 'FAR', far)
    passes, real = [], estimate.one_pass
    monkeypatch.setattr(estimate, 'one_pass', lambda *a: passes.append(a[3]) or real(*a))  # a[3]: train
    with pytest.raises(SystemExit, match='this config is sized for a GPU'):
        run('--max_iters=10', '--device=auto')
    assert passes == ([True, False] + [True] * 3 + [False] * 3 if timed else [True, False])
    assert ('on this CPU: about' in capsys.readouterr().out) == timed and not (tmp_path / 'out').exists()


@pytest.mark.parametrize('load,named', [(0.0, False), (7.5, True)])
def test_a_busy_machine_is_named_at_the_start(run, capsys, monkeypatch, load, named):
    """The load average of the last minute (os.getloadavg, set here) leaves fewer free cores than the run's threads:
    one line says so and what helps; an idle machine gets none."""
    import torch
    monkeypatch.setattr(os, 'getloadavg', lambda: (load, load, load))
    monkeypatch.setattr(os, 'cpu_count', lambda: 2)
    monkeypatch.setattr(torch, 'get_num_threads', lambda: 2)
    run('--max_iters=5', '--eval_interval=5')
    printed = [line for line in capsys.readouterr().out.splitlines() if 'machine is busy' in line]
    assert printed == ([f"note: this machine is busy: a load average of 7.5 on 2 cores leaves about 0.0 free for "
                        f"this run's 2 threads, so its steps may take many times the estimate; one thread per process "
                        f"waits least under load: {estimate.FEWER} (docs/performance.md, \"Advice for CPU users\")"]
                       if named else [])


def test_a_short_run_warms_up_peaks_and_decays(run, logs, capsys, root):
    """--max_iters=100 on the CPU recipe, which warms up for 100 iterations: the warmup takes a fifth, and the run
    ends below half its peak rate; a tiny run whose warmup_iters is its whole length does the same, and says so."""
    import configure
    from orthogpt.optim import get_lr
    cfg = configure.load([os.path.join(root, 'config', f) for f in ('shakespeare_rot.py', 'cpu.py')] + ['--max_iters=100'])
    assert cfg.warmup_iters == 100
    assert max(get_lr(it, cfg) for it in range(100)) == cfg.learning_rate == get_lr(20, cfg)
    assert get_lr(99, cfg) < 0.5 * cfg.learning_rate
    out = run('--max_iters=20', '--eval_interval=20', '--warmup_iters=20', '--log_interval=1')
    assert ("warmup_iters=20 would take 100% of the schedule's 20 iterations: warming up over 4 instead, so that the "
            "rate peaks and decays") in capsys.readouterr().out
    lrs = [r['lr'] for r in logs.records(out) if 'lr' in r]
    peak = max(lrs)
    assert lrs.index(peak) == 4 and lrs[-1] < 0.5 * peak and lrs[0] < lrs[3]  # iterations 1..20 logged
    assert checkpoint.load(out / 'ckpt.pt')['config']['warmup_iters'] == 20  # the config keeps the value given


def test_a_run_that_fails_before_it_trains_leaves_no_empty_folder(run, tmp_path):
    """A typo in --dataset: the folder the run made is gone; a folder of the user's stays as it was, file and all."""
    with pytest.raises(SystemExit, match="shakespear_char"):
        run('--dataset=shakespear_char', out='new')
    assert not (tmp_path / 'new').exists()
    (tmp_path / 'mine').mkdir()
    (tmp_path / 'mine' / 'notes.txt').write_text('mine')
    with pytest.raises(SystemExit, match="shakespear_char"):
        run('--dataset=shakespear_char', out='mine')
    assert os.listdir(tmp_path / 'mine') == ['notes.txt']


def test_a_signal_during_an_evaluation_stops_it_and_resume_runs_it_again(run, logs, capsys, registered):
    """SIGTERM arrives in the third batch of the evaluation at iteration 20: the evaluation stops
    before its next batch, the 20 iterations are saved, and the resumed run evaluates at 20 first,
    so its log is the uninterrupted run's."""
    registered('signal', SignalInEvaluation)
    args = ['--max_iters=40', '--eval_interval=20', '--eval_iters=8', '--residual=signal']
    full = run(*args, out='full')
    SignalInEvaluation.at, SignalInEvaluation.steps, SignalInEvaluation.calls = 1 + 20, 0, 0
    part = run(*args, out='part')
    assert SignalInEvaluation.calls == 3  # the third batch ended; no fourth began
    assert 'stopped by SIGTERM during the evaluation at iteration 20; checkpoint saved' in capsys.readouterr().out
    assert checkpoint.load(part / 'ckpt.pt')['iter_num'] == 20
    SignalInEvaluation.at = None
    run(*args, '--init_from=resume', out='part')
    losses = lambda d: [{k: v for k, v in r.items() if 'loss' in k or k in ('iter', 'lr')} for r in logs.records(d)]  # noqa: E731
    assert losses(part) == losses(full)


def test_a_long_evaluation_shows_progress_and_sigterm_stops_it_at_its_next_batch(terminal, tiny, char_data, tmp_path):
    """On a terminal: a quick evaluation draws no bar; one of a million batches (hours) draws one
    with an ETA once it has run two seconds, and SIGTERM ends it at the batch after, exit 0."""
    args = ['config/shakespeare_add.py', *tiny, f'--data_dir={char_data}', '--max_iters=5', '--eval_interval=5']
    quick = terminal(*args, f'--out_dir={tmp_path / "quick"}')
    assert quick.finish() == 0 and 'done: 5 iterations' in quick.output and 'evaluating' not in quick.output
    long = terminal(*args, f'--out_dir={tmp_path / "long"}', '--eval_iters=1000000')
    assert 'evaluating train:' in long.read_until('evaluating train:'), long.output
    long.read_until('/1000000 [')  # the bar's count and its ETA
    long.proc.send_signal(signal.SIGTERM)
    assert long.finish() == 0, long.output
    last = [line for line in long.output.splitlines() if line.strip()][-1]
    assert 'stopped by SIGTERM during the evaluation at iteration 0; nothing new to save' in last


def test_torchrun_ends_with_the_users_error(torchrun, tmp_path):
    done = torchrun(1, '--dataset=openwebtext', f'--data_dir={tmp_path}', '--device=cpu', timeout=120)
    assert done.returncode != 0
    last = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-3:]
    assert any("error: dataset 'openwebtext' is not prepared" in line for line in last), '\n'.join(last)


@pytest.mark.parametrize('name,first', [('does_not_exist.py', None), ('shakespeare_rott.py', 'shakespeare_rot.py')])
def test_a_missing_config_file_lists_the_config_files_closest_first(root, name, first):
    with pytest.raises(SystemExit) as e:
        train.main([os.path.join(root, 'config', name)])
    listed = str(e.value).split('closest first:')[1].split()
    configs = sorted(f for f in os.listdir(os.path.join(root, 'config')) if f.endswith('.py') and f != '__init__.py')
    assert sorted(os.path.basename(f) for f in listed) == configs
    if first:
        assert os.path.basename(listed[0]) == first


def offline(tmp_path):
    """The environment of a machine with no network: an empty tiktoken cache, requests sent to a
    closed port, and huggingface.co's name unknown (HF_HUB_OFFLINE)."""
    cache = tmp_path / 'empty-cache'
    cache.mkdir(exist_ok=True)
    return dict(os.environ, TIKTOKEN_CACHE_DIR=str(cache), HTTPS_PROXY='http://127.0.0.1:9', HTTP_PROXY='http://127.0.0.1:9',
                HF_HUB_OFFLINE='1')


@pytest.mark.parametrize('script,args', [
    ('data/prepare_text.py', ['--files', 'FILE', '--name', 'x', '--out_dir', 'OUT']),
    ('tools/eval_hellaswag.py', ['--init_from=HF', '--data=FILE']),
])
def test_no_tokenizer_files_and_no_network_end_in_one_line(root, tmp_path, tiny_text, gpt2_folder, script, args):
    (tmp_path / 'text.txt').write_text(tiny_text)
    gpt2_folder(tmp_path / 'hf', vocab_size=50257)  # GPT-2's vocabulary: scored in its tokens
    args = [a.replace('FILE', str(tmp_path / 'text.txt')).replace('OUT', str(tmp_path / 'out'))
            .replace('HF', str(tmp_path / 'hf')) for a in args]
    done = subprocess.run([sys.executable, script, *args], cwd=root, capture_output=True, text=True, env=offline(tmp_path),
                          timeout=120)
    assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith('error: the GPT-2 BPE files could not be read or downloaded')
    assert 'set TIKTOKEN_CACHE_DIR to a folder holding them' in done.stderr


def test_offline_gpt2_weights_end_in_one_line_at_once(root, tmp_path):
    """HF_HUB_OFFLINE (or a hub whose name does not resolve): the hub's cache alone, no retries."""
    done = subprocess.run([sys.executable, 'train.py', '--init_from=gpt2', f'--out_dir={tmp_path / "o"}'], cwd=root,
                          capture_output=True, text=True, env=offline(tmp_path), timeout=120)
    assert done.returncode == 1 and 'Traceback' not in done.stderr and 'Retrying' not in done.stderr, done.stderr
    assert "error: init_from='gpt2': could not fetch gpt2 from the Hugging Face hub (the hub is out of reach" in done.stderr


def test_max_iters_keeps_the_schedule_in_every_config(root):
    """--max_iters=N on any config file with config/cpu.py stacked (N = 200, the README's example,
    or twice a longer warmup): the cosine ends at its floor at iteration N, since no config pins
    lr_decay_iters."""
    import glob

    import configure
    from orthogpt.optim import get_lr
    for path in sorted(glob.glob(os.path.join(root, 'config', '*.py'))):
        if path.endswith(('__init__.py', 'cpu.py', 'muon.py')):
            continue
        stacked = [path, os.path.join(root, 'config', 'cpu.py')]
        n = max(200, 2 * configure.load(stacked).warmup_iters)
        cfg = configure.load([*stacked, f'--max_iters={n}'])
        assert cfg.lr_decay_iters is None, path
        if cfg.decay_lr:
            assert get_lr(n, cfg) == pytest.approx(cfg.learning_rate * cfg.min_lr_ratio), path
            assert get_lr(n // 2 + 1, cfg) > get_lr(3 * n // 4, cfg) > get_lr(n - 1, cfg), path
