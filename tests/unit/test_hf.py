"""GPT-2 weights in, Hugging Face folders out (every rule loaded back by transformers' AutoModelForCausalLM), and
HellaSwag scoring: offline, on tiny models that the tests write themselves (transformers is a test dependency; the
hub is monkeypatched)."""

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from model import GPT, RESIDUALS, GPTConfig, ResidualUpdate
from orthogpt import decoding, hf
from orthogpt.errors import UserError
from tools import eval_hellaswag


def logits_of(model, idx):
    with torch.no_grad():
        out = model(idx)
    return out.logits if hasattr(out, 'logits') else out[0]


def tiny_gpt(**keys):
    """A GPT of 2 layers x 16 over 11 tokens and 16 positions, in eval mode, every parameter (biases and gains too)
    moved off its initial value."""
    model = GPT(GPTConfig(**{'n_layer': 2, 'n_head': 2, 'n_embd': 16, 'block_size': 16, 'vocab_size': 11, **keys}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.fixture
def transformers():
    return pytest.importorskip('transformers')


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
            dict(qkv='exp', activation='relu'), dict(residual='additive', **dict(hf.GPT2_ARCH, pos='rope')),
            dict(residual='additive', **dict(hf.GPT2_ARCH, logit_softcap=30.0))]


def variant_id(variant):
    return '-'.join(f"{k}={v}" for k, v in variant.items())[:60]


@pytest.mark.parametrize('variant', VARIANTS, ids=variant_id)
def test_export_then_import_is_exact_for_every_variant(variant, tmp_path):
    model = tiny_gpt(**variant)
    layout = hf.export(model, tmp_path / 'hf')
    assert layout == ('gpt2' if variant == VARIANTS[0] else 'orthogpt')  # a departure from GPT-2's block is ours
    idx = torch.randint(11, (2, 16))
    again = hf.from_pretrained(str(tmp_path / 'hf')).eval()
    assert again.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert torch.equal(logits_of(model, idx), logits_of(again, idx))
    if layout == 'orthogpt':  # as an older version wrote it: config.json with the GPTConfig alone, no code
        hf_cfg = json.loads((tmp_path / 'hf' / 'config.json').read_text())
        (tmp_path / 'hf' / 'config.json').write_text(json.dumps({k: hf_cfg[k] for k in ('model_type', 'config')}))
        for name in ('model.py', *hf.REMOTE_FILES):
            os.remove(tmp_path / 'hf' / name)
        assert torch.equal(logits_of(hf.from_pretrained(str(tmp_path / 'hf')).eval(), idx), logits_of(model, idx))


def test_a_run_on_the_kernels_exports_a_folder_that_model_py_alone_builds(tmp_path):
    """hc_kernels='triton' needs orthogpt, which an exported folder does not carry: it is written as 'auto' (the
    kernels where orthogpt is imported), and the folder's model.py alone builds the config."""
    pytest.importorskip('triton')
    model = tiny_gpt(residual='mhc', options=dict(hc_kernels='triton'))
    hf.export(model, tmp_path / 'hf')
    assert json.loads((tmp_path / 'hf' / 'config.json').read_text())['config']['options']['hc_kernels'] == 'auto'
    build = "import json, model; model.GPTConfig(**json.load(open('config.json'))['config'])"
    done = subprocess.run([sys.executable, '-c', build], cwd=tmp_path / 'hf', capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert hf.from_pretrained(str(tmp_path / 'hf')).config.options.hc_kernels == 'auto'


# every registered rule with its defaults; then the orthogonal Q/K/V maps and RMSNorm, the global orthogonal mode
# (whose decoding cache holds the rule's running sums) and mHC's permutations (buffers that are not saved)
RULES = [dict(residual=name) for name in RESIDUALS] + [
    dict(qkv='cayley', norm='rmsnorm'), dict(qkv='exp', activation='relu'),
    dict(residual='orthogonal', options=dict(ortho_mode='global')),
    dict(residual='mhc', options=dict(mhc_res='permutation', hc_rate=3)),
    dict(residual='attnres', options=dict(attnres_block=2)), dict(residual='ddl', x0_mix='nanochat')]
# config/modern.py's block around every rule: RoPE, QK norm, ReLU^2, gainless norms, the soft-cap, value embeddings
MODERN = dict(pos='rope', rope_base=1e5, qk_norm=True, activation='relu2', norm='rmsnorm', norm_gain=False,
              logit_softcap=15.0, value_embeds=True, tie_weights=False)
RULES += [dict(residual=name, **MODERN) for name in RESIDUALS]


@pytest.mark.parametrize('variant', RULES, ids=variant_id)
def test_transformers_loads_every_rule_with_its_logits_loss_and_greedy_tokens(variant, tmp_path, transformers,
                                                                              one_thread):
    model = tiny_gpt(**variant)
    assert hf.export(model, tmp_path / 'hf') == 'orthogpt'
    with open(inspect.getsourcefile(GPT), 'rb') as f:  # the project's own model code, not a copy kept by hand
        assert (tmp_path / 'hf' / 'model.py').read_bytes() == f.read()
    config = transformers.AutoConfig.from_pretrained(tmp_path / 'hf', trust_remote_code=True)
    assert (config.model_type, config.config['residual'], config.max_position_embeddings) == (
        'orthogpt', model.config.residual, 16)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf', trust_remote_code=True)
    idx = torch.randint(11, (2, 16))
    torch.testing.assert_close(logits_of(theirs, idx), logits_of(model, idx), rtol=0, atol=1e-5)
    with torch.no_grad():  # labels: the input ids themselves, shifted inside as transformers' models do
        torch.testing.assert_close(theirs(idx, labels=idx).loss, model(idx[:, :-1], idx[:, 1:])[1], rtol=0, atol=1e-5)
    prompt, n = idx[:, :3], 13  # up to block_size
    greedy = decoding.generate(model, prompt, n, top_k=1)
    for use_cache in (True, False):
        assert torch.equal(theirs.generate(prompt, max_new_tokens=n, do_sample=False, use_cache=use_cache), greedy)
    beams = [theirs.generate(prompt, max_new_tokens=n, num_beams=3, use_cache=c) for c in (True, False)]
    assert torch.equal(*beams)  # beam search reorders the cache
    theirs.save_pretrained(tmp_path / 'saved')  # as a user does after fine-tuning it in transformers
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'saved', trust_remote_code=True)
    torch.testing.assert_close(logits_of(again, idx), logits_of(model, idx), rtol=0, atol=1e-5)
    ours = hf.from_pretrained(str(tmp_path / 'saved')).eval()  # and OrthoGPT reads what transformers saved
    torch.testing.assert_close(logits_of(ours, idx), logits_of(model, idx), rtol=0, atol=1e-5)


def test_padding_may_end_a_row_but_not_come_before_a_token(tmp_path, transformers, one_thread):
    hf.export(tiny_gpt(residual='rotation'), tmp_path / 'hf')
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf', trust_remote_code=True)
    idx, mask = torch.randint(11, (2, 8)), torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0  # right padding: no earlier position of the causal model sees it
    assert torch.equal(theirs(idx, attention_mask=mask).logits, logits_of(theirs, idx))
    with pytest.raises(ValueError, match='take no padding before a token'):
        theirs.generate(idx, attention_mask=mask.flip(1), max_new_tokens=2)


def test_without_trust_remote_code_transformers_says_to_pass_it(tmp_path, transformers):
    hf.export(tiny_gpt(residual='mhc'), tmp_path / 'hf')
    for load in (transformers.AutoConfig.from_pretrained, transformers.AutoModelForCausalLM.from_pretrained):
        for trust in ({}, {'trust_remote_code': False}):
            with pytest.raises(ValueError, match=r'contains custom code which must be executed(.|\n)*Please pass the '
                                                 r'argument `trust_remote_code=True`'):
                load(tmp_path / 'hf', **trust)


class Halfway(ResidualUpdate):
    """x_next = x + helper(u): a rule a user defines outside model.py, holding a module of a third module's class."""

    def __init__(self):
        super().__init__()
        self.helper = type('Helper', (torch.nn.Identity,), {'__module__': 'elsewhere'})()

    def forward(self, x, u, sub=None):
        return x + self.helper(u) / 2


def test_a_class_neither_model_py_nor_the_rules_module_defines_is_refused_with_what_it_needs(tmp_path, registered):
    """The folder carries model.py and the rule's module (tests/e2e/test_rule_module.py), and nothing else."""
    registered('halfway', Halfway)
    with pytest.raises(UserError, match=r"residual='halfway' builds elsewhere.Helper, which neither model.py nor the "
                                        r"rule's module defines.*define those classes in the rule's module"):
        hf.export(tiny_gpt(residual='halfway'), tmp_path / 'hf')
    assert not (tmp_path / 'hf').exists()


def test_an_export_writes_over_nothing(tmp_path):
    folder = tmp_path / 'hf'
    folder.mkdir()
    (folder / 'README.md').write_text('my notes')
    (folder / 'model.py').write_text('# my model')
    with pytest.raises(UserError, match=f"{folder} already holds model.py, README.md: an export writes over nothing"):
        hf.export(tiny_gpt(residual='ngpt'), folder)
    assert sorted(os.listdir(folder)) == ['README.md', 'model.py'] and (folder / 'model.py').read_text() == '# my model'
    clone = tmp_path / 'hub-clone'  # a hub repository's clone: files of its own beside
    clone.mkdir()
    (clone / '.gitattributes').write_text('*.safetensors filter=lfs diff=lfs merge=lfs -text\n')
    hf.export(tiny_gpt(residual='ngpt'), clone)
    with pytest.raises(UserError, match='already holds config.json, model.safetensors, model.py'):
        hf.export(tiny_gpt(residual='ngpt'), clone)


def test_a_character_vocabulary_goes_beside_the_model_for_autotokenizer(tmp_path, transformers, tiny_text):
    itos = sorted(set(tiny_text))
    hf.export(tiny_gpt(residual='hc', vocab_size=len(itos)), tmp_path / 'hf', tokens=itos)
    # trust_remote_code: AutoTokenizer reads the model's config too, and would ask whether to run its code
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / 'hf', trust_remote_code=True)
    text = 'ROMEO:\nTo be or not.'
    assert tokenizer.encode(text) == [itos.index(c) for c in text] and tokenizer.decode(tokenizer.encode(text)) == text
    with pytest.raises(Exception, match='UNK'):  # a character outside the vocabulary
        tokenizer.encode('@')


def test_the_model_card_names_the_rule_its_papers_the_run_and_how_to_load_and_evaluate_it(tmp_path):
    run = dict(config={'residual': 'orthogonal', 'max_iters': 5}, iter_num=5, best_val_loss=2.345678)
    hf.export(tiny_gpt(residual='orthogonal', qkv='cayley'), tmp_path / 'hf', tokens=list('\nabcdefghij'), run=run)
    card, refs = (tmp_path / 'hf' / 'README.md').read_text(), hf.references()
    assert "residual='orthogonal'" in card and inspect.getdoc(RESIDUALS['orthogonal']).splitlines()[0] in card
    assert 'arXiv' in refs['Oh'] and f"[Oh] {refs['Oh']}" in card and f"[OViT] {refs['OViT']}" in card
    assert "best val loss: 2.3457" in card and '"max_iters": 5' in card
    assert f"AutoModelForCausalLM.from_pretrained({str(tmp_path / 'hf')!r}, trust_remote_code=True)" in card
    assert (f"lm_eval --model hf --model_args pretrained={tmp_path / 'hf'},trust_remote_code=True,prefix_token_id=0"
            in card)  # characters have no BOS or EOS for lm-eval's prefix: the newline's id


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
