"""GPT-2 weights in, Hugging Face folders out, and HellaSwag scoring: offline, on tiny models that
the tests write themselves (transformers is a test dependency; the hub is monkeypatched)."""


import pytest
import torch
from safetensors.torch import load_file, save_file

from model import GPT, GPTConfig
from orthogpt import hf
from orthogpt.errors import UserError
from tools import eval_hellaswag


def logits_of(model, idx):
    with torch.no_grad():
        out = model(idx)
    return out.logits if hasattr(out, 'logits') else out[0]


def test_a_gpt2_folder_loads_with_the_reference_logits(tmp_path, gpt2_folder):
    ref = gpt2_folder(tmp_path / 'hf')
    idx = torch.randint(39, (3, 32))
    ours = hf.from_pretrained(str(tmp_path / 'hf'))
    assert (ours.config.n_layer, ours.config.n_embd, ours.config.vocab_size, ours.config.block_size) == (2, 32, 39, 32)
    assert (ours.config.norm, ours.config.bias, ours.config.activation, ours.config.tie_weights) == (
        'layernorm', True, 'gelu_tanh', True)
    torch.testing.assert_close(logits_of(ours.eval(), idx), logits_of(ref, idx), rtol=0, atol=1e-5)
    # OpenAI's own files: no 'transformer.' prefix, the causal masks stored as buffers
    tensors = {k.removeprefix('transformer.'): v for k, v in load_file(tmp_path / 'hf' / 'model.safetensors').items()}
    tensors.update({f'h.{i}.attn.bias': torch.tril(torch.ones(1, 1, 32, 32)) for i in range(2)})
    save_file(tensors, tmp_path / 'hf' / 'model.safetensors')
    torch.testing.assert_close(logits_of(hf.from_pretrained(str(tmp_path / 'hf')).eval(), idx), logits_of(ref, idx),
                               rtol=0, atol=1e-5)


def test_gpt2_names_come_from_the_hub(tmp_path, monkeypatch, gpt2_folder):
    gpt2_folder(tmp_path / 'hf')
    asked = []

    def download(repo_id, filename, **kwargs):
        asked.append((repo_id, filename))
        return str(tmp_path / 'hf' / filename)
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, 'hf_hub_download', download)
    assert hf.from_pretrained('gpt2-medium').config.n_layer == 2
    assert asked == [('openai-community/gpt2-medium', 'config.json'), ('openai-community/gpt2-medium', 'model.safetensors')]

    def offline(repo_id, filename, **kwargs):
        raise OSError('no network')
    monkeypatch.setattr(huggingface_hub, 'hf_hub_download', offline)
    with pytest.raises(OSError, match='could not fetch gpt2 from the Hugging Face hub .* pass the folder'):
        hf.from_pretrained('gpt2')
    with pytest.raises(UserError, match="init_from='gpt2': could not fetch gpt2"):  # what train.py says
        hf.read('gpt2')


VARIANTS = [dict(residual='additive', **hf.GPT2_ARCH), dict(residual='additive'),
            dict(residual='orthogonal', options=dict(ortho_mode='global')),
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
    again = hf.from_pretrained(str(tmp_path / 'hf')).eval()
    assert again.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    idx = torch.randint(11, (2, 16))
    assert torch.equal(logits_of(model, idx), logits_of(again, idx))


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
