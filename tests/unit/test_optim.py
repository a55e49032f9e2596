"""The optimizer step: the learning-rate schedule, gradient accumulation as one big batch, what
weight decay reaches, Muon's stacked weights, and a step of every rule of the GPU suite's grid."""

import math
import os
from contextlib import nullcontext

import pytest
import torch

import configure
from model import GPT, RESIDUALS, ResidualUpdate
from orthogpt import optim, parallel
from orthogpt.run import setup
from tools import suite


def test_lr_schedule():
    cfg = configure.load(['--learning_rate=1.0', '--min_lr_ratio=0.1', '--warmup_iters=10', '--max_iters=110'])
    assert optim.get_lr(0, cfg) == pytest.approx(1 / 11)
    assert optim.get_lr(9, cfg) == pytest.approx(10 / 11)
    assert optim.get_lr(10, cfg) == pytest.approx(1.0)
    assert optim.get_lr(60, cfg) == pytest.approx(0.55)  # halfway down the cosine
    assert optim.get_lr(110, cfg) == optim.get_lr(500, cfg) == pytest.approx(0.1)
    assert optim.get_lr(25, cfg, start=20) == pytest.approx(6 / 11)  # warmup restarts where the optimizer was reset
    assert optim.get_lr(7, configure.load(['--decay_lr=False', '--learning_rate=0.3'])) == 0.3



@pytest.mark.parametrize('qkv', ['dense', 'cayley', 'exp'])
def test_gradient_accumulation_equals_one_big_batch(qkv, monkeypatch):
    """Also with orthogonal Q/K/V, whose maps run once per optimizer step (all layers batched)."""
    maps = []
    for name in ('inv_ex', 'matrix_exp'):
        f = getattr(torch.linalg, name)
        monkeypatch.setattr(torch.linalg, name, lambda *a, f=f, **k: maps.append(1) or f(*a, **k))
    cfg = configure.load(['--n_layer=2', '--n_head=2', '--n_embd=16', '--block_size=8', '--vocab_size=11',
                          '--weight_decay=0.1', '--learning_rate=1e-2', f'--qkv={qkv}'])
    x, y = torch.randint(11, (8, 8)), torch.randint(11, (8, 8))
    models = []
    for micro_steps in (1, 2, 4):
        torch.manual_seed(0)
        m = GPT(configure.model_config(cfg)).double()
        opt = optim.make_optimizer(m, cfg, 'cpu')
        parts = iter(zip(x.chunk(micro_steps), y.chunk(micro_steps)))
        maps.clear()
        optim.train_step(m, opt, optim.StepScaler('cpu', 'float32'), lambda: next(parts), micro_steps, 1.0, nullcontext())
        assert len(maps) == (0 if qkv == "dense" else 1)  # every layer in one batched call
        models.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    assert torch.allclose(models[0], models[1], atol=1e-12) and torch.allclose(models[0], models[2], atol=1e-12)
    assert all(p.held is None for p in m.modules() if hasattr(p, 'held'))



def test_raw_orthogonal_weights_are_not_decayed():
    cfg = configure.load(['--n_layer=2', '--n_head=2', '--n_embd=16', '--vocab_size=11', '--qkv=cayley'])
    opt = optim.make_optimizer(GPT(configure.model_config(cfg)), cfg, 'cpu')
    decayed = {id(p) for p in opt.param_groups[0]['params']}
    raw = [p for g in opt.param_groups for p in g['params'] if p.shape == (48, 16)]
    assert len(raw) == 2 and not any(id(p) in decayed for p in raw)


def test_muon_orthogonalises_q_k_and_v_each_alone():
    """Q's update depends on Q's gradient alone: changing K's and V's gradient leaves it as it was,
    where the one (3d, d) matrix of plain Muon mixes them."""
    d = 8
    g = torch.randn(3 * d, d)
    other = g.clone()
    other[d:] = 5 * torch.randn(2 * d, d)  # K's and V's gradient changed, Q's kept

    def update(grad, split):
        w = torch.nn.Parameter(torch.zeros(3 * d, d))
        opt = optim.SplitMuon([{'params': [w], 'split': split}], lr=0.1, weight_decay=0.0)
        w.grad = grad.clone()
        opt.step()
        return w.detach()
    split, stacked = update(g, 3), update(other, 3)
    torch.testing.assert_close(split[:d], stacked[:d], rtol=0, atol=0)
    assert not torch.allclose(update(g, 1)[:d], update(other, 1)[:d], atol=1e-3)
    # each block is orthogonalised as a d x d matrix: its singular values are near 1 (Newton-Schulz's band)
    sv = torch.linalg.svdvals(split.view(3, d, d) / -0.1)
    assert sv.min() > 0.5 and sv.max() < 1.3


def test_the_model_marks_its_stacked_weights_and_muon_takes_them_split(gpt_config):
    for qkv in ('dense', 'cayley'):
        cfg = configure.load(['--n_layer=2', '--n_head=2', '--n_embd=16', '--vocab_size=11', '--optimizer=muon',
                              '--mlp=gated', f'--qkv={qkv}'])
        model = GPT(configure.model_config(cfg))
        opt = optim.make_optimizer(model, cfg, 'cpu')
        names = {p: n for n, p in model.named_parameters()}
        splits = {names[p]: g['split'] for g in opt.named['muon'].param_groups for p in g['params']}
        assert {n: s for n, s in splits.items() if n.startswith('blocks.0.')} == {
            f'blocks.0.attn.c_attn.{"parametrizations.weight.original" if qkv != "dense" else "weight"}': 3,
            'blocks.0.mlp.c_fc.weight': 2, 'blocks.0.attn.c_proj.weight': 1, 'blocks.0.mlp.c_proj.weight': 1}
        summary = '\n'.join(opt.summary(names))
        assert 'muon: 8 tensors' in summary and '(4 stacked weights orthogonalised block by block)' in summary


def test_muons_momentum_warms_up_and_both_rates_decay_to_the_same_fraction():
    cfg = configure.load(['--optimizer=muon', '--muon_momentum_warmup=300', '--learning_rate=2e-3', '--muon_lr=0.02',
                          '--min_lr_ratio=0.1', '--max_iters=1000', '--warmup_iters=0', '--n_layer=1', '--n_head=2',
                          '--n_embd=16', '--vocab_size=11'])
    assert [optim.get_momentum(i, cfg) for i in (0, 150, 300, 900)] == pytest.approx([0.85, 0.90, 0.95, 0.95])
    assert optim.get_momentum(350, cfg, start=200) == pytest.approx(0.90)  # from where the optimizer was reset
    opt = optim.make_optimizer(GPT(configure.model_config(cfg)), cfg, 'cpu')
    for it, fraction in ((0, 1.0), (1000, 0.1)):
        lr = optim.schedule(opt, it, cfg)
        assert lr == pytest.approx(2e-3 * fraction)
        assert all(g['lr'] == pytest.approx(0.02 * fraction) for g in opt.named['muon'].param_groups)
        assert {g['momentum'] for g in opt.named['muon'].param_groups} == {optim.get_momentum(it, cfg)}


def test_muon_takes_its_own_weight_decay_and_none_on_the_raw_weights_of_maps():
    cfg = configure.load(['--optimizer=muon', '--qkv=cayley', '--weight_decay=0.1', '--muon_weight_decay=0.3',
                          '--n_layer=1', '--n_head=2', '--n_embd=16', '--vocab_size=11'])
    model = GPT(configure.model_config(cfg))
    opt = optim.make_optimizer(model, cfg, 'cpu')
    decay = {p: g['weight_decay'] for o in opt for g in o.param_groups for p in g['params']}
    assert decay[model.blocks[0].mlp.c_fc.weight] == 0.3 and decay[model.wte.weight] == 0.1
    assert decay[model.blocks[0].attn.c_attn.parametrizations.weight.original] == 0.0


@pytest.mark.parametrize('argv', [['--residual=hc'], ['--residual=mhc', '--qkv=cayley', '--mlp=gated'], ['--residual=ngpt'],
                                  ['--dataset=fashion_mnist', '--optimizer=muon'], ['--residual=ddl', '--x0_mix=nanochat'],
                                  ['--residual=attnres', '--attnres_block=2'], ['--residual=denseformer']],
                         ids=lambda a: ' '.join(a))
def test_every_trainable_parameter_is_in_exactly_one_group(argv):
    """Decayed: matrices and embeddings; not: gains, biases, scaling vectors, the raw W behind a Q/K/V map and
    what a rule names in no_decay (its static weights), as the groups were drawn before they were built by name."""
    cfg = configure.load(['--n_layer=2', '--n_head=2', '--n_embd=16', '--weight_decay=0.1', *argv])
    model = configure.build_model(cfg)
    opt = optim.make_optimizer(model, cfg, 'cpu')
    grouped = [p for g in opt.param_groups for p in g['params']]
    assert len(grouped) == len({id(p) for p in grouped}) == len(list(model.parameters()))
    decay = {p: g['weight_decay'] > 0 for g in opt.param_groups for p in g['params']}
    rules = [m for m in model.modules() if isinstance(m, RESIDUALS[cfg.residual])]
    static = {getattr(m, n) for m in rules for n in m.no_decay if getattr(m, n) is not None}
    for name, p in model.named_parameters():
        assert decay[p] == (p.dim() >= 2 and '.parametrizations.' not in name and p not in static), name


class Mixed(ResidualUpdate):
    """x + mix(u) * gate: a rule whose parameters lie in a submodule of its own too."""

    no_decay = ('mix.bias', 'scale.weight')

    def __init__(self, d):
        super().__init__()
        self.mix, self.scale, self.gate = torch.nn.Linear(d, d), torch.nn.Linear(d, d), torch.nn.Parameter(torch.ones(d))

    @classmethod
    def from_config(cls, cfg, layer, causal):
        return cls(cfg.n_embd)

    def forward(self, x, u, sub=None):
        return x + self.scale(self.mix(u)) * self.gate


@pytest.mark.parametrize('optimizer', ['adamw', 'muon'])
def test_a_rule_owns_its_submodules_parameters_and_nothing_the_model_holds_is_refused(optimizer, registered):
    """A rule's parameters, in its submodules too, are the rule's: matrices decay but those it names in no_decay, and
    AdamW keeps them under Muon too. A parameter of a kind of module no rule or kind claims is placed, not refused: a
    matrix decays, a vector does not."""
    registered('mixed', Mixed)
    cfg = configure.load(['--n_layer=1', '--n_head=2', '--n_embd=16', '--residual=mixed', '--weight_decay=0.1',
                          f'--optimizer={optimizer}'])
    model = configure.build_model(cfg)
    block = model.blocks[0]
    block.attn.temperature = torch.nn.Parameter(torch.ones(1))  # held by attention itself, a kind optim does not list
    block.attn.table = torch.nn.Parameter(torch.ones(2, 3))
    opt = optim.make_optimizer(model, cfg, 'cpu')
    decay = {p: g['weight_decay'] > 0 for g in opt.param_groups for p in g['params']}
    rule = block.update_attn
    assert decay[rule.mix.weight] and not decay[rule.mix.bias] and not decay[rule.scale.weight]
    assert not decay[rule.gate] and not decay[block.attn.temperature] and decay[block.attn.table]
    if optimizer == 'muon':
        muon = {p for g in opt.named['muon'].param_groups for p in g['params']}
        assert block.attn.c_proj.weight in muon and not {rule.mix.weight, rule.scale.weight} & muon


@pytest.mark.parametrize('mlp, split', [('standard', 1), ('gated', 2)])
def test_muon_splits_stacked_weights_by_name(mlp, split):
    cfg = configure.load(['--n_layer=1', '--n_head=2', '--n_embd=16', '--optimizer=muon', f'--mlp={mlp}'])
    model = configure.build_model(cfg)
    muon = optim.make_optimizer(model, cfg, 'cpu').named['muon']
    splits = {p: g['split'] for g in muon.param_groups for p in g['params']}
    assert splits[model.blocks[0].attn.c_attn.weight] == 3 and splits[model.blocks[0].mlp.c_fc.weight] == split
    assert splits[model.blocks[0].mlp.c_proj.weight] == 1


@pytest.mark.parametrize('rule', suite.RULES)
def test_every_rule_of_the_gpu_grid_trains_with_muon_and_the_gated_mlp(rule, root, char_data):
    """The GPU suite's Tiny Shakespeare grid (tools/suite.py), whose smoke run trains two of its rules: each config,
    at a tiny size and in the grid's corner furthest from the default (Muon on the gated MLP's stacked weights),
    takes the training loop's own steps and lowers its loss."""
    cfg = configure.load([os.path.join(root, 'config', f'shakespeare_{rule}.py'), '--mlp=gated', '--optimizer=muon',
                          '--mlp_ratio=None', '--n_layer=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
                          '--device=cpu', '--compile=False', f'--data_dir={char_data}'])
    run = setup(cfg, parallel.setup(cfg))
    assert 'muon' in run.optimizer.named
    losses = [run.step()[0].item() for _ in range(6)]
    assert all(map(math.isfinite, losses)) and losses[-1] < losses[0], losses
