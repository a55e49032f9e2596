"""What a user is told while work runs: the time left at the recent speed (progress.Speed), a busy
machine named (estimate.busy), and the figure of short runs drawn from their training loss."""

import json

import pytest

from orthogpt import estimate, logs, plots, progress


def test_the_time_left_follows_the_recent_speed():
    """10 units in the first minute, then 60 a minute: two minutes on, the window holds the fast work alone."""
    speed = progress.Speed(window=120)
    assert speed.left(100) is None
    speed.see(0, now=0)
    assert speed.left(100) is None  # one look: no speed yet
    for t, done in ((60, 10), (120, 70), (180, 130)):
        speed.see(done, now=t)
    assert speed.left(120) == pytest.approx(120)  # from (60, 10) to (180, 130): a unit a second
    speed.see(190, now=240)
    assert speed.left(60) == pytest.approx(60)


@pytest.mark.parametrize('load,threads,processes,named', [
    (0.3, 2, 1, False),  # an idle machine's own noise
    (1.0, 1, 1, False),  # a core left for a one-thread run
    (1.0, 2, 1, True),
    (0.2, 1, 2, False),
    (1.2, 1, 2, True),  # two DDP processes of a thread each
])
def test_a_busy_machine_is_named_when_its_load_leaves_fewer_cores_than_threads(monkeypatch, load, threads,
                                                                              processes, named):
    monkeypatch.setattr('os.getloadavg', lambda: (load, 0.0, 0.0))
    monkeypatch.setattr('os.cpu_count', lambda: 2)
    hint = estimate.busy(threads, processes)
    assert (hint is not None) == named
    if named:
        assert hint.startswith(f"note: this machine is busy: a load average of {load:.1f} on 2 cores leaves about "
                               f"{2 - load:.1f} free for this run's {threads * processes} threads")
        assert ('OMP_NUM_THREADS=1' in hint) == (threads > 1)  # a process of one thread is told it has the best


def write_log(path, evals, lines):
    records = [{'iter': i, 'loss': 4.0 - i / 100, 'lr': 1e-3} for i in range(10, 10 * lines + 1, 10)] + \
              [{'iter': i, 'val_loss': 4.0 - i / 90} for i in range(0, 10 * lines + 1, 10 * lines // (evals - 1))]
    path.write_text(''.join(json.dumps(r) + '\n' for r in sorted(records, key=lambda r: r['iter'])))
    return logs.read(str(path))


@pytest.mark.parametrize('evals,drawn', [(2, 'training'), (6, 'val')])
def test_a_short_runs_figure_draws_its_training_loss(tmp_path, capsys, evals, drawn):
    """Two evaluations draw a spike: the figure takes the log lines' training loss instead, and says so."""
    runs = {'a': [write_log(tmp_path / 'a.jsonl', evals, 10)], 'b': [write_log(tmp_path / 'b.jsonl', evals, 10)]}
    plots.curves(runs, tmp_path / 'curves.png')
    printed = capsys.readouterr().out.strip()
    assert printed == f"wrote {tmp_path / 'curves.png'}" + (
        " (the training loss: a run evaluated fewer than 5 times)" if drawn == 'training' else '')
    assert (tmp_path / 'curves.png').stat().st_size > 10_000
