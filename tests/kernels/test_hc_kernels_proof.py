"""hc_kernels='auto' proves the fused kernels (orthogpt/hc_kernels.py: verdict, proof) once a process for each shape
class before it runs them, and runs the rule's PyTorch for a class they fail, with one warning, or do not take, at
debug level; 'triton' raises the reason instead. On a CPU under Triton's interpreter, with 'auto' made to run the
kernels as it does on CUDA (kernels.native), and each failure injected into the ops that the kernels' path calls."""

import logging
import re
import warnings

import pytest
import torch

from model import GPT, HyperConnection, ManifoldHyperConnection, Sublayer

kernels = pytest.importorskip('orthogpt.hc_kernels')

D = 72


@pytest.fixture
def as_on_cuda(monkeypatch):
    """'auto' runs the kernels here as on CUDA (interpreted), and this test's verdicts are its own."""
    monkeypatch.setattr(kernels, 'native', lambda device: True)
    monkeypatch.setattr(kernels, 'VERDICTS', {})


def counted(monkeypatch, name):
    """Wraps kernels.<name>: the list of the calls it gets."""
    calls, real = [], getattr(kernels, name)
    monkeypatch.setattr(kernels, name, lambda *args: calls.append(args) or real(*args))
    return calls


def sublayer(rule, implementation, H, u):
    """(h, the next stream, the gradients of H and of every parameter) of one sublayer on implementation."""
    rule.kernels = implementation
    H = H.detach().requires_grad_()
    sub = Sublayer()
    h = rule.prepare(H, sub)
    out = rule(H, u, sub)
    return [h, out, *torch.autograd.grad(out.sum() + h.square().sum(), [H, *rule.parameters()])]


def test_auto_proves_each_shape_class_once_and_then_runs_the_kernels(as_on_cuda, monkeypatch):
    """Two rules of one class, and a width of its power-of-two bucket, share one proof; another n is another class."""
    proofs, writes = counted(monkeypatch, 'proof'), counted(monkeypatch, 'hc_write')
    H, u = torch.randn(2, 5, 4, D), torch.randn(2, 5, D)
    for rule in (ManifoldHyperConnection(D, 4, 0, True, 3), ManifoldHyperConnection(D, 4, 1, True, 3)):
        fused, plain = sublayer(rule, 'auto', H, u), sublayer(rule, 'torch', H, u)
        assert all(torch.allclose(f, p, rtol=1e-4, atol=1e-5) for f, p in zip(fused, plain))
    sublayer(ManifoldHyperConnection(100, 4, 0, True, 3), 'auto', torch.randn(3, 4, 100), torch.randn(3, 100))
    assert len(proofs) == 1 and len(writes) == 1 + 3  # the proof's own write, then one a sublayer
    sublayer(ManifoldHyperConnection(D, 3, 0, True, 3), 'auto', H[..., :3, :], u)
    assert [spec[2] for spec, *_ in proofs] == [4, 3]  # n
    assert list(kernels.VERDICTS.values()) == [None, None]


def raising(real):  # a launch that fails, as where the driver cannot load the kernels
    def launch(*args):
        raise RuntimeError('CUDA error: no kernel image is available for execution on the device')
    return launch


def scaled(real):  # a forward 1% off
    return lambda *args: real(*args) * 1.01


def scaled_backward(real):  # a backward whose dH is 1% off
    def backward(*args):
        dH, *rest = real(*args)
        return dH * 1.01, *rest
    return backward


FAULTS = {'raises': ('hc_write', raising, r"RuntimeError: CUDA error: no kernel image is available"),
          'wrong-forward': ('hc_write', scaled, r"the next stream lies \S+ of its largest entry from the rule's "
                                                r"PyTorch's, more than 1\.0e-04"),
          'wrong-backward': ('hc_write_backward', scaled_backward, r"dH lies \S+ of its largest entry")}


@pytest.mark.parametrize('fault', FAULTS)
def test_a_failing_kernel_warns_once_and_auto_runs_the_rules_pytorch_while_triton_raises(fault, as_on_cuda,
                                                                                         monkeypatch):
    name, make, why = FAULTS[fault]
    monkeypatch.setattr(kernels, name, make(getattr(kernels, name)))
    rule = ManifoldHyperConnection(D, 4, 0, True, 3)
    H, u = torch.randn(2, 5, 4, D), torch.randn(2, 5, D)
    shape = (r"residual='mhc' \(hc_rate=4, 24 rms products; ManifoldHyperConnection\(d, 4, 1, True, 3, 'sinkhorn'\)\) "
             r"at n_embd=72 on cpu in float32")
    with pytest.warns(RuntimeWarning, match=rf"^hc_kernels='auto' runs the rule's PyTorch for {shape} from now on: "
                                            rf"the kernels failed their proof \({why}"):
        fallback = sublayer(rule, 'auto', H, u)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # once: the class's verdict stands
        again = sublayer(rule, 'auto', H, u)
    plain = sublayer(rule, 'torch', H, u)
    assert all(torch.equal(a, p) and torch.equal(b, p) for a, b, p in zip(fallback, again, plain))
    monkeypatch.setattr(kernels, 'VERDICTS', {})
    with pytest.raises(ValueError, match=rf"^hc_kernels='triton' cannot run {shape}: the kernels failed their proof "
                                         rf"\({why}.*\); use hc_kernels='auto' \(the rule's PyTorch where the kernels "
                                         rf"do not run\) or 'torch'$"):
        sublayer(rule, 'triton', H, u)


UNFIT = {'mhc-lite-5': ('mhc', dict(mhc_res='permutation', hc_rate=5), "hc_rate=5, 130 rms products; "
                         "ManifoldHyperConnection(d, 5, 1, True, 20, 'permutation')",
                         "the read's kernels hold 64 columns of products at most, and this rule has 130"),
         'mhc-lite-6': ('mhc', dict(mhc_res='permutation', hc_rate=6), "hc_rate=6, 732 rms products; "
                        "ManifoldHyperConnection(d, 6, 1, True, 20, 'permutation')",
                        "the read's kernels hold 64 columns of products at most, and this rule has 732"),
         'hc-9': ('hc', dict(hc_rate=9), "hc_rate=9, 11 layernorm products; HyperConnection(d, 9, 1, True)",
                  "the kernels take 8 copies at most, not hc_rate=9")}


@pytest.mark.parametrize('case', UNFIT)
def test_shapes_the_kernels_do_not_fit_run_on_pytorch_under_auto_and_triton_refuses_them(case, as_on_cuda,
                                                                                         monkeypatch, caplog,
                                                                                         gpt_config):
    """mHC-lite at 5 and 6 copies (n! + 2n columns of products), and HC at 9 copies: no proof, the model trains on
    the rule's PyTorch under 'auto' (forward and backward, its loss and gradients those of 'torch'), with the reason
    in the log at debug level; 'triton' names the shape and the fix."""
    residual, options, described, reason = UNFIT[case]
    monkeypatch.setattr(kernels, 'proof', lambda *args: pytest.fail('a shape the kernels do not take was proved'))
    idx = torch.randint(11, (2, 16))
    results = []
    for implementation in ('auto', 'torch'):
        torch.manual_seed(0)
        net = GPT(gpt_config(residual=residual, hc_kernels=implementation, **options))
        with caplog.at_level(logging.DEBUG, logger='orthogpt.hc_kernels'):
            _, loss = net(idx, torch.roll(idx, -1, 1))
        loss.backward()
        results.append([loss, *(p.grad for p in net.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*results))
    fix = "use hc_kernels='auto' (the rule's PyTorch where the kernels do not run) or 'torch'"
    shape = f"residual='{residual}' ({described}) at n_embd=16 on cpu in float32"
    assert [r.getMessage() for r in caplog.records if r.name == 'orthogpt.hc_kernels'] == [
        f"hc_kernels='auto' runs the rule's PyTorch for {shape}: {reason}; {fix}"]  # once: x is float32 throughout
    net = GPT(gpt_config(residual=residual, hc_kernels='triton', **options))
    with pytest.raises(ValueError, match=re.escape(f"hc_kernels='triton' cannot run {shape}: {reason}; {fix}")):
        net(idx)


def graph_ops(compiled_fn, *args):
    """The operators of the graphs that torch.compile (fullgraph) traces for compiled_fn(*args), and its result."""
    graphs = []
    fn = torch.compile(compiled_fn, fullgraph=True, backend=lambda gm, inputs: graphs.append(gm) or gm.forward)
    result = fn(*args)
    return {str(node.target) for gm in graphs for node in gm.graph.nodes}, result


def test_under_torch_compile_the_proof_runs_as_the_graph_is_traced_and_its_verdict_holds_in_it(as_on_cuda,
                                                                                               monkeypatch,
                                                                                               gpt_config):
    """The proof runs eagerly while dynamo traces (its verdict is a constant of the graph), once: the graph holds the
    kernels' ops where it passes and the rule's PyTorch where a kernel fails, with one warning."""
    torch._dynamo.reset()
    proofs = counted(monkeypatch, 'proof')
    idx = torch.randint(11, (2, 16))
    torch.manual_seed(0)
    net = GPT(gpt_config(residual='mhc', hc_kernels='auto'))
    ops, _ = graph_ops(net, idx)
    assert 'orthogpt.hc_write.default' in ops and len(proofs) == 1  # x in float32: one class
    torch._dynamo.reset()
    monkeypatch.setattr(kernels, 'VERDICTS', {})
    monkeypatch.setattr(kernels, 'hc_read', raising(None))
    with pytest.warns(RuntimeWarning, match="the kernels failed their proof"):
        ops, (logits, _) = graph_ops(net, idx)
    assert not any(op.startswith('orthogpt.') for op in ops) and len(proofs) == 2
    net.apply(lambda m: setattr(m, 'kernels', 'torch') if isinstance(m, HyperConnection) else None)
    assert torch.equal(logits, net(idx)[0])
    torch._dynamo.reset()


class Kept(ManifoldHyperConnection):  # mHC's maths as it is
    pass


class HalfWrite(HyperConnection):  # another write map: the kernels take maps() from the rule
    def maps(self, z, sinkhorn_knopp=None):
        read, write, mixing = super().maps(z, sinkhorn_knopp)
        return read, write / 2, mixing


class Doubled(ManifoldHyperConnection):  # other products than the operands it hands the kernels
    def project(self, H):
        return 2 * super().project(H)


class Scaled(HyperConnection):  # a constructor of its own, twin() inherited: no twin can be built
    def __init__(self, d, n, layer, dynamic, scale):
        super().__init__(d, n, layer, dynamic)
        self.scale = scale


def test_a_subclass_keeps_the_kernels_where_it_keeps_their_contract_and_fails_their_proof_where_not(as_on_cuda,
                                                                                                 monkeypatch):
    """The kernels read a rule's operands and maps, nothing else of it, and prove each class on a twin of its own: a
    subclass with mHC's maths, or HC's with a write map of its own, runs on them; one whose products are not those of
    its operands, or whose twin cannot be built, fails the proof, with the reason, and runs its own code."""
    writes = counted(monkeypatch, 'hc_write')
    H, u = torch.randn(2, 5, 4, D), torch.randn(2, 5, D)
    for rule in (Kept(D, 4, 0, True, 3), HalfWrite(D, 4, 1, True)):
        with torch.no_grad():
            for p in rule.parameters():
                p.add_(0.3 * torch.randn_like(p))
        before = len(writes)
        fused, plain = sublayer(rule, 'auto', H, u), sublayer(rule, 'torch', H, u)
        assert all(torch.allclose(f, p, rtol=1e-4, atol=1e-5) for f, p in zip(fused, plain))
        assert len(writes) == before + 2  # the proof's, then the sublayer's
    rule = Doubled(D, 4, 0, True, 3)
    with pytest.warns(RuntimeWarning, match=r"runs the rule's PyTorch for a Doubled \(hc_rate=4, 24 rms products; "
                                            r"Doubled\(d, 4, 1, True, 3, 'sinkhorn'\)\) at n_embd=72 on cpu "
                                            r"in float32 from now on: the kernels failed their proof \(h lies"):
        fallback = sublayer(rule, 'auto', H, u)
    assert all(torch.equal(a, b) for a, b in zip(fallback, sublayer(rule, 'torch', H, u)))
    with pytest.warns(RuntimeWarning, match=r"the kernels failed their proof \(Scaled\(d, \*twin\(\)\) cannot be built "
                                            r"\(TypeError: .*\): override twin\(\)\)"):
        sublayer(Scaled(D, 4, 0, True, 2.0), 'auto', H, u)
    assert [why is None for why in kernels.VERDICTS.values()] == [True, True, False, False]


def test_the_proof_leaves_the_runs_random_numbers_as_they_were_and_runs_under_inference_mode(as_on_cuda):
    """It draws from a generator of its own, and runs its backward where the caller computes no gradients."""
    rule = ManifoldHyperConnection(D, 4, 0, True, 3, kernels='auto')
    torch.manual_seed(0)
    with torch.inference_mode():
        assert rule.implementation(torch.randn(3, 4, D)) is not None
    assert list(kernels.VERDICTS.values()) == [None]
    after = torch.randn(5)
    torch.manual_seed(0)
    torch.randn(3, 4, D)
    assert torch.equal(torch.randn(5), after)


def test_the_proof_adds_nothing_to_a_flop_count_around_it(as_on_cuda, gpt_config):
    """train.py counts its first step's FLOPs under a FlopCounterMode, whose module hooks see every module called:
    the proof runs outside the mode and calls no module, so the first step counts what the second does."""
    from torch.utils.flop_counter import FlopCounterMode
    net = GPT(gpt_config(residual='mhc', hc_kernels='auto'))
    idx = torch.randint(11, (2, 16))
    counts = []
    for _ in range(2):  # the first proves the kernels, the second finds their verdict
        with FlopCounterMode(display=False) as counter:
            net(idx, idx)[1].backward()
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] > 0 and list(kernels.VERDICTS.values()) == [None]
