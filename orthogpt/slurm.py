"""A plan's runs as Slurm jobs (tools/compare.py and tools/miniseries.py, --launcher=slurm): each
unfinished run submitted once, as a job of tools/slurm/train.sbatch, which Slurm may requeue and
which continues the run's checkpoint whenever it runs again; the jobs watched through squeue and
scontrol (a cluster without slurmdbd has no sacct) and the runs' own folders. The same command
again waits for the jobs that are still queued or running and submits again those that ended
before their run finished; a run that finished is read, never run again."""

import json
import os
import shlex
import subprocess
import time

from orthogpt import files
from orthogpt.errors import UserError
from orthogpt.launcher import ROOT, Stopped, finished, keep, start

TEMPLATE = os.path.join(ROOT, 'tools', 'slurm', 'train.sbatch')
POLL = 5  # seconds between looks at the queue
# the states of a job that will still run, or runs: squeue lists a job in these until it has ended
QUEUED = {'PENDING', 'CONFIGURING', 'RUNNING', 'COMPLETING', 'REQUEUED', 'REQUEUE_HOLD', 'REQUEUE_FED', 'RESIZING',
          'SUSPENDED', 'STOPPED', 'SIGNALING', 'STAGE_OUT'}


class Job:
    """A run's Slurm job: its id."""

    def __init__(self, run, job_id):
        self.run, self.id = run, job_id


def command(cmd):
    """A Slurm command's output; a UserError in one line where it is missing or fails."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UserError(f"{cmd[0]} is not on this machine: --launcher=slurm submits the runs from a machine of a Slurm "
                        f"cluster (a login node); without one, leave --launcher out") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"{shlex.join(cmd)} did not answer in 60 s: is slurmctld up? (scontrol ping)") from None
    if done.returncode:
        raise UserError(f"{shlex.join(cmd)} failed: {' '.join(done.stderr.split()) or f'exit {done.returncode}'}")
    return done.stdout


def queue(tries=3):
    """{job id: state} of this user's jobs that Slurm still lists. A busy slurmctld can time squeue out: it is
    asked again, POLL seconds on, before that counts as an error."""
    for attempt in range(tries):
        try:
            listed = command(['squeue', '--me', '--noheader', '--format=%i %T'])
            break
        except UserError:
            if attempt == tries - 1:
                raise
            time.sleep(POLL)
    return {job: state for job, state in (line.split() for line in listed.splitlines() if line.strip())}


def exit_status(job_id):
    """A job's exit status as scontrol still remembers it (MinJobAge after its end), else None."""
    try:
        shown = command(['scontrol', 'show', 'job', job_id])
    except UserError:  # purged from slurmctld's memory
        return None
    code = next((word.split('=', 1)[1] for word in shown.split() if word.startswith('ExitCode=')), None)
    return int(code.split(':')[0]) if code else None


def submit(run, options):
    """run's job (train.sbatch with its train.py arguments, its output appended to its stdout.log),
    recorded in its run.json."""
    argv, resuming = start(run)
    train_args = argv[2:]  # past the Python and train.py, which the template runs itself
    job_id = command(['sbatch', '--parsable', f'--job-name=orthogpt-{run.name}', f'--chdir={ROOT}',
                      f"--output={os.path.join(run.out_dir, 'stdout.log')}", *options, TEMPLATE, *train_args]).split(';')[0].strip()
    files.write_text(os.path.join(run.out_dir, 'run.json'), json.dumps({'argv': run.argv, 'job': job_id}))
    print(f"{run.name}: submitted as Slurm job {job_id}{' (it resumes)' if resuming else ''}", flush=True)
    return Job(run, job_id)


def recorded_job(run):
    """The id of the job last submitted for run, from its run.json, or None."""
    try:
        with open(os.path.join(run.out_dir, 'run.json')) as f:
            return json.load(f).get('job')
    except (OSError, ValueError):
        return None


def execute(runs, options, watch):
    """Submits the unfinished runs that have no job queued or running, then waits until every job has
    ended, watch.tick(todo, jobs) between looks; records each ended job's exit status in its run's
    run.json. Ctrl-C or SIGTERM stops the waiting, not the jobs (Stopped)."""
    todo = [r for r in runs if not finished(r)]
    for r in runs:
        if r not in todo:
            keep(r)
    listed = queue()
    jobs = []
    for run in todo:
        job_id = recorded_job(run)
        if job_id and listed.get(job_id) in QUEUED:
            print(f"{run.name}: Slurm job {job_id} is {listed[job_id].lower()}; waiting for it", flush=True)
            jobs.append(Job(run, job_id))
        else:
            jobs.append(submit(run, options))
    try:
        while jobs:
            time.sleep(POLL)
            listed = queue()
            for job in [j for j in jobs if listed.get(j.id) not in QUEUED]:
                jobs.remove(job)
                ended(job)
            watch.tick([], jobs)
    except KeyboardInterrupt:
        print("the jobs go on in Slurm: the same command waits for them again, --collect reads what they have done",
              flush=True)
        raise Stopped from None


def ended(job):
    """Records a job's exit status (where scontrol still has it) beside its run, and says how it ended."""
    code = exit_status(job.id)
    files.write_text(os.path.join(job.run.out_dir, 'run.json'),
                     json.dumps({'argv': job.run.argv, 'job': job.id, 'returncode': code}))
    state = 'done' if finished(job.run) else 'FAILED'
    print(f"{job.run.name}: {state} (Slurm job {job.id}, exit {code if code is not None else 'unknown'})", flush=True)
