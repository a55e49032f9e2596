"""GPT-2 weights in, Hugging Face folders out, and HellaSwag scoring: offline, on tiny models that
the tests write themselves (transformers is a test dependency; the hub is monkeypatched)."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import checkpoint
import eval_hellaswag
import export
import hf
from model import GPT, GPTConfig

transformers = pytest.importorskip('transformers')


def tiny_gpt2(folder, vocab_size=39, n_positions=32, seed=0):
    """A random GPT-2 in the Hugging Face layout, every parameter (biases, LayerNorm gains) drawn."""
    torch.manual_seed(seed)
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab_size, n_positions=n_positions, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0)).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ref.save_pretrained(folder)
    return ref


def logits_of(model, idx):
    with torch.no_grad():
        out = model(idx)
    return out.logits if hasattr(out, 'logits') else out[0]


def test_a_gpt2_folder_loads_with_the_reference_logits(tmp_path):
    ref = tiny_gpt2(tmp_path / 'hf')
    idx = torch.randint(39, (3, 32))
    ours = GPT.from_pretrained(str(tmp_path / 'hf'))
    assert (ours.config.n_layer, ours.config.n_embd, ours.config.vocab_size, ours.config.block_size) == (2, 32, 39, 32)
    assert (ours.config.norm, ours.config.bias, ours.config.activation, ours.config.tie_weights) == (
        'layernorm', True, 'gelu_tanh', True)
    torch.testing.assert_close(logits_of(ours.eval(), idx), logits_of(ref, idx), rtol=0, atol=1e-5)
    # OpenAI's own files: no 'transformer.' prefix, the causal masks stored as buffers
    tensors = {k.removeprefix('transformer.'): v for k, v in load_file(tmp_path / 'hf' / 'model.safetensors').items()}
    tensors.update({f'h.{i}.attn.bias': torch.tril(torch.ones(1, 1, 32, 32)) for i in range(2)})
    save_file(tensors, tmp_path / 'hf' / 'model.safetensors')
    torch.testing.assert_close(logits_of(GPT.from_pretrained(str(tmp_path / 'hf')).eval(), idx), logits_of(ref, idx),
                               rtol=0, atol=1e-5)


def test_gpt2_names_come_from_the_hub(tmp_path, monkeypatch):
    tiny_gpt2(tmp_path / 'hf')
    asked = []

    def download(repo_id, filename, **kwargs):
        asked.append((repo_id, filename))
        return str(tmp_path / 'hf' / filename)
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, 'hf_hub_download', download)
    assert GPT.from_pretrained('gpt2-medium').config.n_layer == 2
    assert asked == [('openai-community/gpt2-medium', 'config.json'), ('openai-community/gpt2-medium', 'model.safetensors')]

    def offline(repo_id, filename, **kwargs):
        raise OSError('no network')
    monkeypatch.setattr(huggingface_hub, 'hf_hub_download', offline)
    with pytest.raises(hf.PretrainedError, match='could not fetch gpt2 from the Hugging Face hub .* pass the folder'):
        GPT.from_pretrained('gpt2')


VARIANTS = [dict(residual='additive', **hf.GPT2_ARCH), dict(residual='additive'), dict(residual='orthogonal', ortho_mode='global'),
            dict(residual='rotation', init='sigma', tie_weights=False), dict(qkv='cayley', norm='rmsnorm'),
            dict(qkv='exp', activation='relu')]


@pytest.mark.parametrize('variant', VARIANTS, ids=lambda v: '-'.join(f"{k}={v}" for k, v in v.items())[:60])
def test_export_then_import_is_exact_for_every_variant(variant, tmp_path):
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11, **variant)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # biases and gains off their initial values
    layout = hf.export(model, tmp_path / 'hf')
    assert layout == ('gpt2' if variant.get('bias') else 'orthogpt')
    again = GPT.from_pretrained(str(tmp_path / 'hf')).eval()
    assert again.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    idx = torch.randint(11, (2, 16))
    assert torch.equal(logits_of(model, idx), logits_of(again, idx))


def test_a_gpt2_shaped_run_exports_to_transformers_and_other_variants_to_orthogpt(run, tmp_path, capsys):
    out = run('--max_iters=5', '--eval_interval=5', '--bias=True', '--norm=layernorm', '--activation=gelu_tanh',
              '--tie_weights=True', '--init=gpt2', out='gpt2ish')
    export.main([f'--out_dir={out}', f'--to={tmp_path / "hf"}'])
    assert "GPT-2's layout" in capsys.readouterr().out
    model, _, _ = checkpoint.load_language_model(out)
    ref = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / 'hf').eval()
    idx = torch.randint(model.config.vocab_size, (2, 32))
    torch.testing.assert_close(logits_of(ref, idx), logits_of(model, idx), rtol=0, atol=1e-5)
    out = run('--max_iters=5', '--eval_interval=5', config='shakespeare_rot.py', out='rot')
    export.main([f'--out_dir={out}', f'--to={tmp_path / "rot"}'])
    assert "OrthoGPT's layout (residual='rotation'" in capsys.readouterr().out
    assert json.loads((tmp_path / 'rot' / 'config.json').read_text())['model_type'] == 'orthogpt'
    with pytest.raises(SystemExit, match='already holds an exported model'):
        export.main([f'--out_dir={out}', f'--to={tmp_path / "rot"}'])


FINETUNE = ['--device=cpu', '--compile=False', '--batch_size=8', '--eval_iters=4', '--log_interval=5',
            '--warmup_iters=5', '--learning_rate=3e-3', '--eval_interval=10']


def test_finetuning_gpt2_weights_with_orthogonal_updates_trains_and_resumes(tmp_path, char_data, logs, capsys):
    import train
    tiny_gpt2(tmp_path / 'hf')
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
])
def test_what_cannot_carry_the_weights_is_refused(args, expected, tmp_path, char_data):
    import train
    tiny_gpt2(tmp_path / 'hf')
    with pytest.raises(SystemExit, match=expected):
        train.main([f'--init_from={tmp_path / "hf"}', f'--data_dir={char_data}', f'--out_dir={tmp_path / "o"}',
                    *FINETUNE, '--max_iters=1', *args])


def test_other_vocabularies_and_missing_checkpoints_are_refused(tmp_path, char_data):
    import train
    tiny_gpt2(tmp_path / 'hf', vocab_size=65)
    with pytest.raises(SystemExit, match='the checkpoint has a vocabulary of 65 tokens, the model 39'):
        train.main([f'--init_from={tmp_path / "hf"}', f'--data_dir={char_data}', f'--out_dir={tmp_path / "o"}',
                    *FINETUNE])
    with pytest.raises(SystemExit, match=r"init_from='gtp2' is neither 'scratch', 'resume', a GPT-2 name"):
        train.main(['--init_from=gtp2', f'--data_dir={char_data}', *FINETUNE])
    (tmp_path / 'empty').mkdir()
    with pytest.raises(SystemExit, match='holds no config.json and no model.safetensors'):
        train.main([f'--init_from={tmp_path / "empty"}', f'--data_dir={char_data}', *FINETUNE])


class Unigram(torch.nn.Module):
    """A 'language model' whose next-token probabilities are fixed: 0.5, 0.25, 0.125, 0.125 for
    ' ', 'x', 'y', 'z' whatever came before, so each token's loss is known by hand."""
    config = GPTConfig(block_size=64)

    def forward(self, idx):
        log_p = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125]))
        return log_p.expand(*idx.shape, 4), None


def test_hellaswag_scoring_by_hand():
    encode = {' ': 0, 'x': 1, 'y': 2, 'z': 3}.__getitem__
    encode_text = lambda s: [encode(c) for c in s]  # noqa: E731
    # losses per token: ' ' ln 2, 'x' 2 ln 2, 'y' and 'z' 3 ln 2; an ending is ' ' + its letters
    examples = [
        # totals (in ln 2): ' x' 3, ' xx' 5, ' y' 4, ' zzz' 10; means 1.5, 1.67, 2, 2.5: both pick 0
        {'ctx': 'xy', 'endings': ['x', 'xx', 'y', 'zzz'], 'label': 0},
        # totals: ' zz' 7, ' y' 4, ' xxxx' 9, ' zy' 7; means 2.33, 2, 1.8, 2.33: acc picks 1, acc_norm 2
        {'ctx': 'z', 'endings': ['zz', 'y', 'xxxx', 'zy'], 'label': 2},
    ]
    assert eval_hellaswag.score(Unigram(), examples, encode_text, 'cpu') == [(0, 0), (1, 2)]


@pytest.mark.skipif(not os.environ.get('TIKTOKEN_CACHE_DIR'), reason='GPT-2 BPE files: set TIKTOKEN_CACHE_DIR')
def test_hellaswag_on_the_jsonl_format_and_the_hub_path(tmp_path, monkeypatch, capsys):
    """A tiny GPT-2 in GPT-2's tokens on five examples of the original file's format, batched two at a
    time, against each ending scored alone; then the same through a monkeypatched datasets."""
    import tiktoken
    tiny_gpt2(tmp_path / 'hf', vocab_size=50257, n_positions=64)
    rows = [{'ind': i, 'ctx': f"A man {verb} the ball and", 'label': i % 4, 'split': 'val',
             'endings': ['it rolls away.', 'he smiles.', 'the crowd cheers loudly.', 'nothing happens at all.']}
            for i, verb in enumerate(['kicks', 'throws', 'drops', 'catches', 'holds'])]
    (tmp_path / 'val.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    acc = eval_hellaswag.main([f'--init_from={tmp_path / "hf"}', f'--data={tmp_path / "val.jsonl"}', '--batch_size=2',
                               '--device=cpu'])
    model, enc = GPT.from_pretrained(str(tmp_path / 'hf')).eval(), tiktoken.get_encoding('gpt2')
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
