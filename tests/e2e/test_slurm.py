"""tools/slurm/train.sbatch and tools/compare.py --launcher=slurm against a real one-node Slurm cluster (the
`slurm` fixture): a job requeued by hand and at the end of its time continues to the log of an uninterrupted
run; a failed run's output ends in its own error line; a study's table is the local launcher's though one of
its jobs is requeued mid-run. docs/cluster.md."""

import json
import os
import subprocess
import sys
import time

import pytest

from tools import compare

pytestmark = pytest.mark.slow

TEMPLATE = 'tools/slurm/train.sbatch'


def wait_for(path, slurm, job, timeout=120):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline or not slurm.state(job):
            pytest.fail(f"no {path}: job {job} is {slurm.state(job)}")
        time.sleep(0.2)


def test_a_job_requeued_by_hand_and_at_the_end_of_its_time_ends_as_the_uninterrupted_run(slurm, run, root, tiny,
                                                                                         char_data, tmp_path, logs):
    """`scontrol requeue` once the job holds its checkpoint at 20: the run saves at its next step (SIGTERM), and the
    job, run again, continues it (SLURM_RESTART_COUNT). Then the end of its time, as Slurm signals it
    (--signal=B:USR1@...): the template stops the run with a checkpoint and requeues the job itself."""
    args = ['--max_iters=200', '--eval_interval=20']
    full = run(*args, out='full')
    out, log = tmp_path / 'out', tmp_path / 'job.out'
    job = slurm.submit(f'--output={log}', f'--chdir={root}', TEMPLATE, 'config/shakespeare_add.py', *tiny,
                       f'--data_dir={char_data}', f'--out_dir={out}', *args)
    wait_for(out / 'ckpt-0000020.pt', slurm, job)
    slurm('scontrol', 'requeue', job)
    slurm.release(job)
    wait_for(out / 'ckpt-0000100.pt', slurm, job)
    slurm('scancel', '--batch', '--signal=USR1', job)
    slurm.release(job)
    slurm.wait(job)
    printed = log.read_text()
    assert printed.count('resuming from') == 2, printed[-3000:]
    assert "orthogpt: the job's time ends soon: stopping with a checkpoint, then requeueing" in printed
    assert 'stopped by SIGTERM at iteration' in printed and 'done: 200 iterations' in printed
    assert logs.losses(out) == logs.losses(full)


def test_a_failed_run_under_torchrun_ends_the_jobs_output_in_its_own_error_line(slurm, root, tiny, char_data, tmp_path):
    """Two processes (torchrun through srun) and a step of one micro-step, which two processes cannot share:
    torchrun's and srun's reports of the failed workers come after the workers' own line, and the template ends
    the output with it again."""
    log = tmp_path / 'job.out'
    job = slurm.submit(f'--output={log}', f'--chdir={root}', '--export=ALL,NPROC_PER_NODE=2', TEMPLATE,
                       'config/shakespeare_add.py', *tiny, f'--data_dir={char_data}', f'--out_dir={tmp_path / "out"}')
    slurm.wait(job)
    lines = log.read_text().strip().splitlines()
    assert 'ChildFailedError' in log.read_text(), lines[-20:]
    assert lines[-1] == 'error: gradient_accumulation_steps=1 is not divisible by the 2 processes; use a multiple of 2'
    assert lines.count(lines[-1]) == 3, lines[-20:]  # each worker's, then the template's


def test_a_study_on_slurm_with_a_requeued_job_gives_the_local_table(slurm, root, tiny, char_data, tmp_path, tables):
    """2 configs x 2 seeds, each run a Slurm job; one of them requeued mid-run. Its table is the local launcher's;
    the same command again submits nothing and writes the same table, and so does --collect."""
    args = ['config/shakespeare_add.py', 'config/shakespeare_ortho.py', '--seeds=2', *tiny, '--max_iters=80',
            '--eval_interval=20', f'--data_dir={char_data}', '--progress=0']
    os.environ['OMP_NUM_THREADS'] = '1'  # as the jobs (the slurm fixture's env)
    try:
        compare.main([*args, f'--out={tmp_path / "local"}', '--nproc=2'])
    finally:
        del os.environ['OMP_NUM_THREADS']
    out = tmp_path / 'slurm'
    cmd = [sys.executable, 'tools/compare.py', *args, f'--out={out}', '--launcher=slurm']
    proc = subprocess.Popen(cmd, cwd=root, env=slurm.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    target = out / 'shakespeare_add-s1'
    deadline = time.monotonic() + 120
    while not (target / 'ckpt-0000020.pt').exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    job = json.loads((target / 'run.json').read_text())['job']
    slurm('scontrol', 'requeue', job)
    slurm.release(job)
    printed, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, printed[-3000:]
    assert 'resuming from' in (target / 'stdout.log').read_text(), (target / 'stdout.log').read_text()[-2000:]

    def table(folder):
        text = (folder / 'results.md').read_text()
        return tables.cells(text[text.index('\n|'):])
    assert table(out) == table(tmp_path / 'local')
    again = subprocess.run(cmd, cwd=root, env=slurm.env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and 'submitted' not in again.stdout and table(out) == table(tmp_path / 'local')
    collected = subprocess.run(cmd + ['--collect'], cwd=root, env=slurm.env, capture_output=True, text=True, timeout=60)
    assert collected.returncode == 0 and table(out) == table(tmp_path / 'local'), collected.stdout[-2000:]
