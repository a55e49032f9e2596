"""Pretrained weights through train.py (fine-tuning with another rule, resuming, what is refused),
runs exported to transformers, and HellaSwag on files in the original format."""

import json
import os

import pytest
import torch

import train
from orthogpt import checkpoint, decoding, hf
from tools import eval_hellaswag, export

transformers = pytest.importorskip('transformers')


def logits_of(model, idx):
    with torch.no_grad():
        out = model(idx)
    return out.logits if hasattr(out, 'logits') else out[0]


FINETUNE = ['--device=cpu', '--compile=False', '--batch_size=8', '--eval_iters=4', '--log_interval=5',
            '--warmup_iters=5', '--learning_rate=3e-3', '--eval_interval=10']


def test_a_gpt2_shaped_run_exports_to_transformers_and_other_variants_to_orthogpt(run, tmp_path, capsys, one_thread):
    out = run('--max_iters=5', '--eval_interval=5', '--bias=True', '--norm=layernorm', '--activation=gelu_tanh',
              '--tie_weights=True', '--init=gpt2', out='gpt2ish')
    export.main([f'--out_dir={out}', f'--to={tmp_path / "hf"}'])
    assert "GPT-2's layout" in capsys.readouterr().out
    model, _, _ = checkpoint.load_language_model(out)
    ref = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / 'hf').eval()
    idx = torch.randint(model.config.vocab_size, (2, 32))
    torch.testing.assert_close(logits_of(ref, idx), logits_of(model, idx), rtol=0, atol=1e-5)
    out = run('--max_iters=5', '--eval_interval=5', config='shakespeare_rot.py', out='rot')
    export.main([f'--out_dir={out}', f'--to={tmp_path / "rot-hf"}'])
    assert "OrthoGPT's layout (residual='rotation'" in capsys.readouterr().out
    assert json.loads((tmp_path / 'rot-hf' / 'config.json').read_text())['model_type'] == 'orthogpt'
    model, ckpt, _ = checkpoint.load_language_model(out)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'rot-hf', trust_remote_code=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / 'rot-hf', trust_remote_code=True)
    idx = torch.tensor([tokenizer.encode('ROMEO:\nTo be or not the king.')])
    assert idx[0].tolist() == [ckpt['meta']['stoi'][c] for c in 'ROMEO:\nTo be or not the king.']
    torch.testing.assert_close(logits_of(theirs, idx), logits_of(model, idx), rtol=0, atol=1e-5)
    greedy = decoding.generate(model, idx[:, :8], 8, top_k=1)
    assert torch.equal(theirs.generate(idx[:, :8], max_new_tokens=8, do_sample=False), greedy)
    with pytest.raises(SystemExit, match=f"{tmp_path / 'rot-hf'} already holds config.json, model.safetensors"):
        export.main([f'--out_dir={out}', f'--to={tmp_path / "rot-hf"}'])
    run_config = (out / 'config.json').read_bytes()
    with pytest.raises(SystemExit, match=f"{out} already holds config.json: an export writes over nothing"):
        export.main([f'--out_dir={out}', f'--to={out}'])  # the run's own folder, whose config.json is the run's
    assert (out / 'config.json').read_bytes() == run_config and not (out / 'model.safetensors').exists()


def test_finetuning_gpt2_weights_with_orthogonal_updates_trains_and_resumes(tmp_path, char_data, logs, capsys, gpt2_folder):
    gpt2_folder(tmp_path / 'hf')
    out = tmp_path / 'ft'
    args = [f'--init_from={tmp_path / "hf"}', '--residual=orthogonal', f'--data_dir={char_data}', f'--out_dir={out}',
            *FINETUNE]
    train.main([*args, '--max_iters=20'])
    assert f"starting from the weights of {tmp_path / 'hf'}" in capsys.readouterr().out
    saved = checkpoint.load(out / 'ckpt.pt')['config']
    assert (saved['n_layer'], saved['n_embd'], saved['activation'], saved['residual']) == (2, 32, 'gelu_tanh', 'orthogonal')
    history = logs.evals(out)
    assert history[-1][1] < history[0][1]
    train.main([*args, '--max_iters=30', '--init_from=resume'])  # the checkpoint sets the architecture again
    train.main([*args, '--max_iters=40', '--init_from=resume'])  # and again: it remembers its weights' origin
    assert [i for i, _ in logs.evals(out)] == [0, 10, 20, 30, 40]


@pytest.mark.parametrize('args,expected', [
    (['--residual=rotation'], r"do not fit the model of residual='rotation'"),
    (['--qkv=cayley'], r"qkv='cayley' \(the checkpoint's: 'dense'\)"),
    (['--n_layer=3'], r"n_layer=3 \(the checkpoint's: 2\)"),
    (['--block_size=64'], r"block_size=64 \(the checkpoint's: 32\)"),
    (['--norm=rmsnorm'], r"norm='rmsnorm' \(the checkpoint's: 'layernorm'\)"),
    (['--pos=rope'], r"pos='rope' \(the checkpoint's: 'learned'\)"),  # GPT-2's weights keep its learned positions
    (['config/modern.py'], r"the config sets what the pretrained weights fix: .*pos='rope'"),
])
def test_what_cannot_carry_the_weights_is_refused(args, expected, tmp_path, char_data, gpt2_folder):
    gpt2_folder(tmp_path / 'hf')
    with pytest.raises(SystemExit, match=expected):
        train.main([f'--init_from={tmp_path / "hf"}', f'--data_dir={char_data}', f'--out_dir={tmp_path / "o"}',
                    *FINETUNE, '--max_iters=1', *args])


def test_other_vocabularies_and_missing_checkpoints_are_refused(tmp_path, char_data, gpt2_folder):
    gpt2_folder(tmp_path / 'hf', vocab_size=65)
    with pytest.raises(SystemExit, match='the checkpoint has a vocabulary of 65 tokens, the model 39'):
        train.main([f'--init_from={tmp_path / "hf"}', f'--data_dir={char_data}', f'--out_dir={tmp_path / "o"}',
                    *FINETUNE])
    with pytest.raises(SystemExit, match=r"init_from='gtp2' is neither 'scratch', 'resume', 'auto', a GPT-2 name"):
        train.main(['--init_from=gtp2', f'--data_dir={char_data}', *FINETUNE])
    (tmp_path / 'empty').mkdir()
    with pytest.raises(SystemExit, match='holds no config.json and no model.safetensors'):
        train.main([f'--init_from={tmp_path / "empty"}', f'--data_dir={char_data}', *FINETUNE])


@pytest.mark.skipif(not os.environ.get('TIKTOKEN_CACHE_DIR'), reason='GPT-2 BPE files: set TIKTOKEN_CACHE_DIR')
def test_hellaswag_on_the_jsonl_format_and_the_hub_path(tmp_path, monkeypatch, capsys, gpt2_folder):
    """A tiny GPT-2 in GPT-2's tokens on five examples of the original file's format, batched two at a
    time, against each ending scored alone; then the same through a monkeypatched datasets."""
    import tiktoken
    gpt2_folder(tmp_path / 'hf', vocab_size=50257, n_positions=64)
    rows = [{'ind': i, 'ctx': f"A man {verb} the ball and", 'label': i % 4, 'split': 'val',
             'endings': ['it rolls away.', 'he smiles.', 'the crowd cheers loudly.', 'nothing happens at all.']}
            for i, verb in enumerate(['kicks', 'throws', 'drops', 'catches', 'holds'])]
    (tmp_path / 'val.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    acc = eval_hellaswag.main([f'--init_from={tmp_path / "hf"}', f'--data={tmp_path / "val.jsonl"}', '--batch_size=2',
                               '--device=cpu'])
    model, enc = hf.from_pretrained(str(tmp_path / 'hf')).eval(), tiktoken.get_encoding('gpt2')
    right = [0, 0]
    for r in rows:  # each ending alone, no padding
        ctx, losses = enc.encode_ordinary(r['ctx']), []
        for ending in r['endings']:
            end = enc.encode_ordinary(' ' + ending)
            logits = logits_of(model, torch.tensor([ctx + end])[:, :-1])[0, -len(end):]
            losses.append(torch.nn.functional.cross_entropy(logits, torch.tensor(end), reduction='none'))
        right[0] += min(range(4), key=lambda k: losses[k].sum().item()) == r['label']
        right[1] += min(range(4), key=lambda k: losses[k].mean().item()) == r['label']
    assert acc == (right[0] / 5, right[1] / 5)
    assert 'HellaSwag' in capsys.readouterr().out
    import datasets
    monkeypatch.setattr(datasets, 'load_dataset', lambda name, split: [dict(r, label=str(r['label'])) for r in rows]
                        if (name, split) == ('Rowan/hellaswag', 'validation') else None)
    assert eval_hellaswag.main([f'--init_from={tmp_path / "hf"}', '--device=cpu']) == acc


@pytest.mark.skipif(not os.environ.get('TIKTOKEN_CACHE_DIR'), reason='GPT-2 BPE files: set TIKTOKEN_CACHE_DIR')
def test_the_gpt2_tiny_cpu_path_from_text_to_transformers_and_hellaswag(root, tmp_path, tiny_text):
    """The README's path, at tiny sizes: text to GPT-2 BPE shards, config/gpt2_tiny_cpu.py, export,
    transformers' GPT2LMHeadModel and AutoTokenizer on the folder, HellaSwag on a local file."""
    import tiktoken

    from data import prepare_text
    (tmp_path / 'text.txt').write_text(tiny_text)
    prepare_text.main(['--files', str(tmp_path / 'text.txt'), '--name', 'tiny', '--out_dir', str(tmp_path / 'bpe'),
                       '--shard_size', '2000', '--val_tokens', '500', '--num_proc', '1'])
    train.main([os.path.join(root, 'config', 'gpt2_tiny_cpu.py'), f'--data_dir={tmp_path / "bpe"}',
                f'--out_dir={tmp_path / "run"}', '--n_layer=1', '--n_embd=32', '--n_head=2', '--block_size=16',
                '--batch_size=4', '--max_iters=10', '--eval_interval=10', '--eval_iters=2'])
    export.main([f'--out_dir={tmp_path / "run"}', f'--to={tmp_path / "hf"}'])
    folder = tmp_path / 'hf'
    umask = os.umask(0)
    os.umask(umask)
    assert {f.name: f.stat().st_mode & 0o777 for f in folder.iterdir()} == {
        name: 0o666 & ~umask for name in ('config.json', 'model.safetensors', 'vocab.json', 'merges.txt',
                                           'tokenizer_config.json', 'README.md')}
    hf_cfg = json.loads((folder / 'config.json').read_text())
    assert (hf_cfg['bos_token_id'], hf_cfg['eos_token_id'], hf_cfg['vocab_size']) == (50256, 50256, 50304)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = "ROMEO:\nTo be or not, my lord."
    assert tokenizer.encode(text) == tiktoken.get_encoding('gpt2').encode_ordinary(text)
    ours, _, _ = checkpoint.load_language_model(tmp_path / 'run')
    theirs = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    idx = torch.tensor([tokenizer.encode(text)[:16]])
    torch.testing.assert_close(logits_of(theirs, idx), logits_of(ours, idx), rtol=0, atol=1e-5)
    assert f"AutoModelForCausalLM.from_pretrained({str(folder)!r})" in (folder / 'README.md').read_text()
    rows = [{'ctx': 'A man kicks the ball and', 'label': 0, 'endings': ['it rolls.', 'he sings.', 'it rains.', 'no.']}]
    (tmp_path / 'val.jsonl').write_text(json.dumps(rows[0]) + '\n')
    acc, acc_norm = eval_hellaswag.main([f'--init_from={folder}', f'--data={tmp_path / "val.jsonl"}', '--device=cpu'])
    assert acc in (0.0, 1.0) and acc_norm in (0.0, 1.0)


def test_an_orthogpt_export_has_a_model_card_and_hellaswag_refuses_its_own_vocabulary(run, tmp_path, gpt2_folder):
    out = run('--max_iters=5', '--eval_interval=5', config='shakespeare_rot.py', out='rot')
    export.main([f'--out_dir={out}', f'--to={tmp_path / "rot-hf"}'])
    readme, ckpt = (tmp_path / 'rot-hf' / 'README.md').read_text(), checkpoint.load(out / 'best.pt')
    assert "residual='rotation'" in readme and f"[OT] {hf.references()['OT']}" in readme  # the rule, its paper
    assert f"best val loss: {ckpt['best_val_loss']:.4f}" in readme
    assert json.dumps(ckpt['config'], indent=1) in readme  # the run's config
    assert "from_pretrained(" in readme and 'trust_remote_code=True' in readme and 'lm_eval --model hf' in readme
    assert {'tokenizer.json', 'tokenizer_config.json'} <= set(os.listdir(tmp_path / 'rot-hf'))  # the run's characters
    assert 'vocab.json' not in os.listdir(tmp_path / 'rot-hf')  # no GPT-2 tokenizer
    for source in ([f'--out_dir={out}'], [f'--init_from={tmp_path / "rot-hf"}']):
        with pytest.raises(SystemExit, match="holds a model of a 39-token vocabulary of its own; HellaSwag is scored in "
                                             "GPT-2's tokens"):
            eval_hellaswag.main([*source, '--data=unused.jsonl', '--device=cpu'])
