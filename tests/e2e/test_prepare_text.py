"""GPT-2 BPE shards from text datasets: preparation, round trip, resume, header checks, DDP."""

import json
import os

import numpy as np
import pytest
import torch

from data import prepare_text
from orthogpt import checkpoint, shards
from orthogpt.errors import UserError

pytestmark = pytest.mark.skipif(not os.environ.get('TIKTOKEN_CACHE_DIR'),
                                reason='GPT-2 BPE files: set TIKTOKEN_CACHE_DIR (.ci/run does)')

DOCS = [f"Document {i}: " + ' '.join(f"word{(i * 7 + j) % 97}" for j in range(40 + i % 13)) + '.' for i in range(60)]


def tokenizer():
    import tiktoken
    return tiktoken.get_encoding('gpt2')


def all_tokens(folder):
    """The val shard, then the train shards, concatenated."""
    names = sorted(f for f in os.listdir(folder) if f.startswith('val_')) + sorted(
        f for f in os.listdir(folder) if f.startswith('train_'))
    return np.concatenate([np.asarray(shards.read(os.path.join(folder, n))) for n in names])


def expected_text(docs):
    return ''.join('<|endoftext|>' + d for d in docs)


def write_files(tmp_path, kind):
    import datasets
    folder = tmp_path / 'corpus'
    folder.mkdir()
    if kind == 'parquet':
        datasets.Dataset.from_dict({'text': DOCS}).to_parquet(str(folder / 'part.parquet'))
    elif kind == 'jsonl':
        (folder / 'part.jsonl').write_text(''.join(json.dumps({'text': d}) + '\n' for d in DOCS))
    else:
        for i, d in enumerate(DOCS):
            (folder / f'doc{i:03d}.txt').write_text(d)
    return str(folder / ('*.' + kind))


@pytest.mark.parametrize('kind', ['parquet', 'jsonl', 'txt'])
def test_local_files_round_trip(tmp_path, kind):
    out = tmp_path / 'out'
    prepare_text.main(['--files', write_files(tmp_path, kind), '--name', 'corpus', '--out_dir', str(out),
                       '--shard_size', '700', '--val_tokens', '500', '--num_proc', '2'])
    assert [len(shards.read(str(out / f))) for f in sorted(os.listdir(out)) if f.startswith('val_')] == [500]
    train = sorted(f for f in os.listdir(out) if f.startswith('train_'))
    assert len(train) > 2 and all(len(shards.read(str(out / f))) == 700 for f in train[:-1])
    assert tokenizer().decode(all_tokens(out).tolist()) == expected_text(DOCS)
    info = json.loads((out / 'info.json').read_text())
    assert info['tokens'] == len(all_tokens(out)) and info['documents'] == len(DOCS)


def test_hub_dataset_path_and_presets(tmp_path, monkeypatch):
    """The load_dataset path, on a Dataset built here with a hub dataset's column names."""
    import datasets
    calls = []

    def fake_load_dataset(**kwargs):
        calls.append(kwargs)
        return datasets.Dataset.from_dict({'content': DOCS, 'id': list(range(len(DOCS)))})
    monkeypatch.setattr(datasets, 'load_dataset', fake_load_dataset)
    out = tmp_path / 'owt'
    prepare_text.main(['--dataset', 'openwebtext', '--text_column', 'content', '--out_dir', str(out),
                       '--val_tokens', '300', '--num_proc', '1', '--no_streaming'])
    assert calls == [dict(path='Skylion007/openwebtext', name=None, split='train', streaming=False,
                          revision='refs/convert/parquet')]
    assert tokenizer().decode(all_tokens(out).tolist()) == expected_text(DOCS)
    prepare_text.main(['--dataset', 'fineweb-edu', '--out_dir', str(tmp_path / 'fw'), '--text_column', 'content',
                       '--val_tokens', '300'])
    assert calls[-1] == dict(path='HuggingFaceFW/fineweb-edu', name='sample-10BT', split='train', streaming=True)


def test_interrupted_preparation_resumes_without_duplicates(tmp_path, monkeypatch):
    files = write_files(tmp_path, 'jsonl')
    args = ['--files', files, '--name', 'c', '--shard_size', '400', '--val_tokens', '300', '--num_proc', '2']
    prepare_text.main(args + ['--out_dir', str(tmp_path / 'clean')])
    real_write, written = shards.write, []

    def crash_on_third(path, tokens):
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(path)
        real_write(path, tokens)
    monkeypatch.setattr(shards, 'write', crash_on_third)
    with pytest.raises(SystemExit) as stopped:
        prepare_text.main(args + ['--out_dir', str(tmp_path / 'resumed')])
    assert stopped.value.code == 130
    monkeypatch.setattr(shards, 'write', real_write)
    before = {f: os.path.getmtime(tmp_path / 'resumed' / f) for f in os.listdir(tmp_path / 'resumed')
              if f.endswith('.bin')}
    assert sorted(before) == ['train_000000.bin', 'val_000000.bin']
    prepare_text.main(args + ['--out_dir', str(tmp_path / 'resumed')])
    assert all(os.path.getmtime(tmp_path / 'resumed' / f) == t for f, t in before.items()), "finished shards kept"
    assert np.array_equal(all_tokens(tmp_path / 'resumed'), all_tokens(tmp_path / 'clean'))
    with pytest.raises(SystemExit, match='with other settings'):
        prepare_text.main(['--files', files, '--name', 'c', '--shard_size', '999', '--out_dir', str(tmp_path / 'resumed')])


def test_a_corpus_smaller_than_the_val_shard_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match='all taken by the val shard'):
        prepare_text.main(['--files', write_files(tmp_path, 'jsonl'), '--name', 'c', '--val_tokens', '10000000',
                           '--out_dir', str(tmp_path / 'out'), '--num_proc', '1'])


def test_local_val_default_is_a_small_share(tmp_path):
    out = tmp_path / 'out'
    prepare_text.main(['--files', write_files(tmp_path, 'jsonl'), '--name', 'c', '--out_dir', str(out), '--num_proc', '1'])
    val, train = len(shards.read(str(out / 'val_000000.bin'))), len(shards.read(str(out / 'train_000000.bin')))
    assert 0.02 < val / (val + train) < 0.3


def test_shard_headers_are_checked(tmp_path):
    path = str(tmp_path / 'train_000000.bin')
    shards.write(path, np.arange(100))
    assert list(shards.read(path)[:3]) == [0, 1, 2]
    data = open(path, 'rb').read()
    open(path, 'wb').write(data[:-10])
    with pytest.raises(UserError, match='holds 95 tokens but its header says 100: truncated'):
        shards.read(path)
    open(path, 'wb').write(np.arange(1000, dtype=np.uint16).tobytes())
    with pytest.raises(UserError, match='is not a token shard'):
        shards.read(path)


@pytest.fixture
def bpe_data(tmp_path):
    folder = tmp_path / 'bpe'
    prepare_text.main(['--files', write_files(tmp_path, 'jsonl'), '--name', 'bpe', '--out_dir', str(folder),
                       '--shard_size', '1000', '--val_tokens', '600', '--num_proc', '1'])
    return folder


def test_train_refuses_a_truncated_shard(tmp_path, bpe_data):
    import train
    path = bpe_data / 'train_000001.bin'
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(SystemExit, match='train_000001.bin holds .* truncated'):
        train.main(['config/owt_smoke.py', f'--data_dir={bpe_data}', f'--out_dir={tmp_path / "o"}'])


@pytest.mark.parametrize('accumulation', [2, 4])
def test_two_process_ddp_on_shards(torchrun, tiny, tmp_path, bpe_data, accumulation):
    """torchrun with gloo: both processes end with the same weights and trained on different windows
    (one or two micro-steps each, with every layer's Cayley maps batched and, over two micro-steps,
    held: the gradients still reach DDP's hooks on the raw weights)."""
    out = tmp_path / 'ddp'
    done = torchrun(2, 'config/owt_smoke.py', *tiny, '--block_size=16', f'--data_dir={bpe_data}', f'--out_dir={out}',
                    '--max_iters=6', '--eval_interval=6', f'--gradient_accumulation_steps={accumulation}', '--qkv=cayley',
                    timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert '2 process(es) on cpu' in done.stdout and 'done: 6 iterations' in done.stdout
    a, b = checkpoint.load(out / 'ckpt.pt')['streams']
    assert torch.equal(a['weights'], b['weights'])  # DDP's replicas agree (each draws windows of its own: test_data)
