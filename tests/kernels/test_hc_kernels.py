"""The fused Triton kernels of the wide streams (orthogpt/hc_kernels.py, hc_kernels='triton') against the rules in
model.py, their definition: values and the gradient of every input and parameter, for HC (dynamic and static) and
mHC with each H_res constraint, n = 2, 3, 4 copies of a width that is not a power of two, on a CPU under Triton's
interpreter (conftest.py sets TRITON_INTERPRET=1), or compiled on a CUDA GPU with TRITON_INTERPRET=0 (the GPU suite's
kernel_check stage, before it times them). Float32 kernels must be as accurate as the float32 rule: within
1e-5 of the float64 rule, relative to each tensor's largest entry, or within 4x the float32 rule's own error where
float32 itself cannot do better (a gate's gradient, a sum over every token)."""

import re
import typing

import pytest
import torch

import model
from model import HyperConnection, ManifoldHyperConnection, Sublayer

kernels = pytest.importorskip('orthogpt.hc_kernels')

D = 72  # two chunks of 64 features, the second partly masked
MIXINGS = typing.get_args(ManifoldHyperConnection.Options.__dataclass_fields__['mhc_res'].type)


def make(variant, n, device='cpu'):
    """The rule of variant at n copies of width D on device, every parameter drawn away from its initial value (on
    the CPU, so that each device gets the same values)."""
    rule = {'hc': lambda: HyperConnection(D, n, 1, True), 'hc-static': lambda: HyperConnection(D, n, 1, False),
            'mhc-static': lambda: ManifoldHyperConnection(D, n, 1, False, 3),
            **{f'mhc-{res}': (lambda res=res: ManifoldHyperConnection(D, n, 1, True, 3, res)) for res in MIXINGS}
            }[variant]()
    with torch.no_grad():
        for p in rule.parameters():
            p.add_(0.3 * torch.randn_like(p))
        if getattr(rule, 'a_res', None) is not None:
            rule.a_res.fill_(1.0)  # a mixing that varies from token to token
    return rule.to(device)


def sublayer(rule, H, branch, implementation):
    """(h, the next stream, and the gradients of H, the branch's weight and every parameter of rule) of one
    sublayer whose branch is tanh(h W), under a loss that weighs every output differently."""
    rule.kernels = implementation
    H = H.detach().requires_grad_()
    sub = Sublayer()
    h = rule.prepare(H, sub)
    out = rule(H, torch.tanh(h @ branch), sub)
    loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)).sum() + (h * h).sum() / 3
    return [h, out, *torch.autograd.grad(loss, [H, branch, *rule.parameters()])]


def error(a, b):
    return ((a.double() - b).abs().max() / b.abs().max()).item()


VARIANTS = ['hc', 'hc-static', 'mhc-static', *(f'mhc-{res}' for res in MIXINGS)]


@pytest.mark.parametrize('n', [2, 3, 4])
@pytest.mark.parametrize('variant', VARIANTS)
def test_the_kernels_compute_the_rule_and_its_gradients(variant, n, kernel_device):
    torch.manual_seed(n)
    rule = make(variant, n, kernel_device)
    H, branch = torch.randn(3, 7, n, D), torch.randn(D, D) / D ** 0.5  # 21 tokens: two programs
    H, branch = H.to(kernel_device), branch.to(kernel_device).requires_grad_()
    fused, plain = sublayer(rule, H, branch, 'triton'), sublayer(rule, H, branch, 'torch')
    exact = sublayer(rule.double(), H.double(), branch.double().detach().requires_grad_(), 'torch')
    names = ['h', 'next stream', 'dH', 'd branch', *(name for name, _ in rule.named_parameters())]
    for name, f, p, e in zip(names, fused, plain, exact):
        assert f.dtype == p.dtype == torch.float32 and f.shape == p.shape, name
        assert error(f, e) <= max(1e-5, 4 * error(p, e)), (name, error(f, e), error(p, e))


def test_sinkhorn_per_token_in_registers_and_its_backward_through_every_round(kernel_device):
    """20 rounds, as the paper's: the kernel's matrices and gradient against model.sinkhorn in float64."""
    torch.manual_seed(0)
    for n in (2, 3, 4):
        logits = (3 * torch.randn(21, n, n, dtype=torch.float64)).to(kernel_device).requires_grad_()
        M = model.sinkhorn(logits, 20)
        dM = torch.randn_like(M)
        grad, = torch.autograd.grad((M * dM).sum(), logits)
        fused = kernels.hc_sinkhorn(logits.detach().float(), 20)
        assert error(fused, M) < 1e-6
        assert error(kernels.hc_sinkhorn_backward(dM.float(), logits.detach().float(), 20), grad) < 1e-6


def test_a_weights_gradient_sums_the_tokens_in_parts(kernel_device):
    torch.manual_seed(0)
    X, Y = (torch.randn(4200, k, dtype=torch.float64).to(kernel_device) for k in (40, 24))  # two parts
    assert error(kernels.hc_xty(X.bfloat16(), Y.float()), X.bfloat16().double().T @ Y.float().double()) < 1e-6


@pytest.mark.parametrize('variant', ['hc', 'mhc-sinkhorn'])
def test_under_bfloat16_autocast_the_kernels_store_the_copies_as_the_rule_does(variant, kernel_device):
    """The stream in bfloat16 ([mHC] Sec. 4.3.1), computed in float32 from the same bfloat16 copies, rounded once:
    the kernels' and the rule's read and next stream agree to within one bfloat16 step (Triton's interpreter rounds
    float32 to bfloat16 towards zero, where a GPU and torch round to nearest)."""
    torch.manual_seed(0)
    rule = make(variant, 4, kernel_device)
    H, u = (torch.randn(3, 7, *shape).bfloat16().to(kernel_device) for shape in ((4, D), (D,)))
    outs = []
    with torch.no_grad(), torch.autocast(kernel_device, dtype=torch.bfloat16):
        for implementation in ('triton', 'torch'):
            rule.kernels = implementation
            sub = Sublayer()
            outs.append((rule.prepare(H, sub), rule(H, u, sub)))
    for fused, plain in zip(*outs):
        assert fused.dtype == plain.dtype == torch.bfloat16
        assert ((fused.float() - plain.float()).abs() <= plain.float().abs() * 2 ** -7).all()


@pytest.mark.parametrize('variant', ['hc', 'hc-static', 'mhc-sinkhorn'])
def test_weights_stored_in_bfloat16_as_fsdp_stores_them_are_read_in_float32(variant, kernel_device):
    """FSDP's param_dtype=bfloat16 hands the rule bfloat16 weights: the kernels read them in float32 and agree with the
    rule on the same weights to within its bfloat16 rounding; each weight gets a gradient of its own dtype."""
    torch.manual_seed(0)
    rule = make(variant, 4, kernel_device).bfloat16()
    H, u = (torch.randn(3, 7, *shape).bfloat16().to(kernel_device) for shape in ((4, D), (D,)))
    outs = []
    for implementation in ('triton', 'torch'):
        rule.kernels = implementation
        sub = Sublayer()
        h = rule.prepare(H, sub)
        out = rule(H, u, sub)
        grads = torch.autograd.grad(out.float().sum() + h.float().sum(), list(rule.parameters()))
        assert all(g.dtype == torch.bfloat16 and g.isfinite().all() for g in grads)
        outs.append((h, out))
    for fused, plain in zip(*outs):
        assert error(fused, plain.double()) < 2 ** -6


def test_where_the_kernels_do_not_run_they_say_why(monkeypatch, gpt_config):
    """Each refusal names the shape and its fix. Each is decided once a process for its shape class
    (kernels.VERDICTS), which the test empties before each environment it fakes."""
    rule = make('mhc-sinkhorn', 4)
    rule.kernels = 'triton'
    monkeypatch.setattr(kernels, 'VERDICTS', {})
    with pytest.raises(ValueError, match=re.escape(
            "hc_kernels='triton' cannot run residual='mhc' (hc_rate=4, 24 rms products; ManifoldHyperConnection(d, "
            "4, 1, True, 3, 'sinkhorn')) at n_embd=72 on cpu in "
            "float64: the kernels compute streams of float32, bfloat16 or float16, not torch.float64; use "
            "hc_kernels='torch'")):
        rule.prepare(torch.randn(2, 4, D, dtype=torch.float64), Sublayer())
    monkeypatch.setattr(kernels, 'interpreting', lambda: True)
    for triton_version, numpy_version in (('3.6.0', '2.4.6'), ('3.5.1', '2.5.0')):  # torch 2.11's Triton, today's numpy
        monkeypatch.setattr(kernels, 'VERDICTS', {})
        monkeypatch.setattr(kernels.triton, '__version__', triton_version)
        monkeypatch.setattr(kernels.np, '__version__', numpy_version)
        with pytest.raises(ValueError, match=rf"Triton {triton_version}'s interpreter cannot run the kernels beside "
                                             rf"numpy {numpy_version} .*: pip install 'triton>=3.7' or 'numpy<2.4'"):
            rule.prepare(torch.randn(2, 4, D), Sublayer())
    monkeypatch.undo()
    monkeypatch.setattr(kernels, 'VERDICTS', {})
    monkeypatch.setattr(kernels, 'interpreting', lambda: False)
    with pytest.raises(ValueError, match=re.escape("the kernels run on CUDA GPUs, not cpu (on a CPU under Triton's "
                                                   "interpreter, TRITON_INTERPRET=1, slowly: for tests); use "
                                                   "hc_kernels='auto' or 'torch'")):
        rule.prepare(torch.randn(2, 4, D), Sublayer())
    rule.kernels = 'auto'  # on a CPU: the rule's own code
    assert rule.implementation(torch.randn(2, 4, D)) is None
    monkeypatch.setattr(model, 'KERNELS', {})
    with pytest.raises(ValueError, match="hc_kernels='triton' needs the fused kernels, which orthogpt registers where "
                                         "triton imports"):
        gpt_config(residual='mhc', hc_kernels='triton')
