"""Tiny Shakespeare preparation and the token-window loader."""

import json
import urllib.request

import numpy as np
import pytest
import torch

from orthogpt import chars
from orthogpt.errors import UserError
from orthogpt.windows import TokenWindows, open_tokens

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20


def test_prepare_writes_vocab_split_and_round_trips(tmp_path):
    src = tmp_path / 'shakespeare.txt'
    src.write_text(TEXT, encoding='utf-8')
    out = tmp_path / 'out'
    meta = chars.prepare(str(src), str(out))
    symbols = sorted(set(TEXT))
    assert meta['itos'] == symbols and meta['vocab_size'] == len(symbols)
    assert json.loads((out / 'meta.json').read_text(encoding='utf-8')) == meta
    train = np.fromfile(out / 'train.bin', dtype=np.uint16)
    val = np.fromfile(out / 'val.bin', dtype=np.uint16)
    assert len(train) == int(0.9 * len(TEXT)) and len(train) + len(val) == len(TEXT)
    decoded = ''.join(meta['itos'][i] for i in np.concatenate([train, val]))
    assert decoded == TEXT


def test_prepare_reads_input_txt_in_out_dir(tmp_path):
    (tmp_path / 'input.txt').write_text(TEXT, encoding='utf-8')
    chars.prepare(None, str(tmp_path))
    assert (tmp_path / 'train.bin').exists()


def test_failed_download_says_how_to_supply_the_file(tmp_path, monkeypatch):
    def offline(*a, **k):
        raise OSError('network unreachable')
    monkeypatch.setattr(urllib.request, 'urlopen', offline)
    with pytest.raises(UserError) as e:
        chars.prepare(None, str(tmp_path))
    msg = str(e.value)
    assert 'network unreachable' in msg and str(tmp_path / 'input.txt') in msg and '--input' in msg


def test_a_missing_input_is_named(tmp_path):
    with pytest.raises(UserError, match='nope.txt: no such file'):
        chars.prepare(str(tmp_path / 'nope.txt'), str(tmp_path))


def test_windows_are_shifted_slices_of_the_file(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    path = tmp_path / 'train.bin'
    tokens.tofile(path)
    loader = TokenWindows([open_tokens(str(path), False)], block_size=16, batch_size=5, seed=3)
    x, y = loader.next()
    assert x.shape == y.shape == (5, 16) and x.dtype == torch.long
    assert torch.equal(y, x + 1)  # consecutive tokens in this file
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)
    state = loader.state_dict()
    a = loader.next()
    loader.load_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(a, loader.next()))
    loader.reset()
    assert torch.equal(loader.next()[0], x)


def test_too_short_file_is_refused():
    with pytest.raises(UserError, match='too few for 2 windows of block_size=16'):
        TokenWindows([np.arange(10, dtype=np.uint16)], block_size=16, batch_size=2, seed=0)


def test_windows_span_several_arrays_in_proportion():
    arrays = [np.full(1000, 1, dtype=np.uint16), np.full(3000, 2, dtype=np.uint16), np.full(8, 3, dtype=np.uint16)]
    x, _ = TokenWindows(arrays, block_size=8, batch_size=3000, seed=0).next()
    assert x.min(1).values.eq(x.max(1).values).all(), "a window never straddles two arrays"
    share = (x[:, 0] == 2).float().mean().item()
    assert abs(share - 2992 / (992 + 2992)) < 0.03 and not (x == 3).any()


def test_processes_draw_disjoint_windows_and_one_process_is_unchanged():
    tokens = np.arange(60, dtype=np.uint16)  # 52 windows of 8: collisions are likely without the redraw
    single = TokenWindows([tokens], block_size=8, batch_size=6, seed=5)
    first = torch.randint(52, (6,), generator=torch.Generator().manual_seed(5))
    assert torch.equal(single.next()[0][:, 0], first)
    for step in range(20):
        starts = [TokenWindows([tokens], 8, 6, seed=5 + step, rank=r, world=4).next()[0][:, 0] for r in range(4)]
        allstarts = torch.cat(starts)
        assert len(set(allstarts.tolist())) == 24, "no window is trained on by two processes in a step"


@pytest.mark.parametrize('rank', [0, 1])
def test_under_torchrun_every_rank_joins_rank_0s_verdict_on_the_text_whatever_it_sees(tmp_path, monkeypatch, rank):
    """Rank 0 prepares Tiny Shakespeare and broadcasts whether it could. A rank that first looked for the files itself
    could find them written by rank 0 a moment before, skip the broadcast, and leave rank 0 waiting in it while it
    waits in DDP's first collective (a 2-process run hung so in the full suite). Here the folder is prepared
    already, as a late rank finds it: every rank still joins the verdict once, and rank 0 writes nothing again."""
    import configure
    from orthogpt import tasks
    (tmp_path / 'input.txt').write_text(TEXT, encoding='utf-8')
    chars.prepare(None, str(tmp_path))
    joined = []
    monkeypatch.setattr(tasks, 'verdict', lambda message, ddp: joined.append((message, ddp)))
    monkeypatch.setattr(chars, 'prepare', lambda *a: pytest.fail('prepared again'))
    cfg = configure.load(['--block_size=8', '--batch_size=2', f'--data_dir={tmp_path}'])
    tasks.make_task(cfg, 'cpu', rank=rank, world=2)
    assert joined == [(None, True)]
