"""Where a compiled decoding step's time goes on a CPU: decoding.compiled's step of the 16 x 256 model of
config/shakespeare_add.py (random weights), one token at position 128 of a DecodeState, batch 1, top_k 200, timed
alone (3 x 200 steps), then 50 steps under torch.profiler with inductor's kernels named
(torch._inductor.config.cpp.enable_kernel_profile), their self time summed by kind (docs/performance.md).

    python docs/logs/generation_cpu/profile_step.py additive
"""
import sys
import time

import torch
import torch._inductor.config
from torch.profiler import profile

sys.path.insert(0, '.')
from model import GPT, DecodeState, GPTConfig  # noqa: E402
from orthogpt import decoding  # noqa: E402

torch._inductor.config.cpp.enable_kernel_profile = True
torch.manual_seed(0)
cfg = GPTConfig(n_layer=16, n_head=4, n_embd=256, block_size=256, vocab_size=65, residual=sys.argv[1], norm='rmsnorm',
                activation='relu', init='sigma', tie_weights=False)
model = GPT(cfg).eval()
idx, noise = torch.zeros(1, 1, dtype=torch.long), torch.empty(1, 65).exponential_()
one = decoding.compiled(idx.device)
with torch.inference_mode():
    state = DecodeState(cfg.block_size)
    decoding.step(model, idx, noise, state, 0.8, 200)
    decoding.static(state)
    one(model, idx, noise, state, 0.8, 200)  # compiles, all guards run

    def steps(k):
        for _ in range(k):
            state.pos.fill_(128)
            one(model, idx, noise, state, 0.8, 200)

    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):  # as decoding.generate runs the steps after its first
        for _ in range(3):
            t0 = time.perf_counter()
            steps(200)
            print(f"a step alone: {(time.perf_counter() - t0) / 200 * 1e6:.0f} us")
        with profile() as prof:
            steps(50)
kinds = {'attention: SDPA\'s CPU kernel': lambda name: name.startswith('aten::_scaled_dot_product'),
         'inductor\'s fused kernels (the linears, norms, writes, sampler)': lambda name: name.startswith('graph_'),
         'dynamo: cache lookup, pregraph bytecode, wrappers': lambda name: name.startswith(
             ('TorchDynamo', 'Pregraph', 'AOTDispatcher', 'Torch-Compiled')),
         'the compiled graph\'s own Python and other aten calls': lambda name: True}
total, sums = 0.0, dict.fromkeys(kinds, 0.0)
for event in prof.key_averages():
    total += event.self_cpu_time_total
    sums[next(kind for kind, match in kinds.items() if match(event.key))] += event.self_cpu_time_total
print(f"\nprofiled: {total / 50:.0f} us a step (the profiler's own cost included)\n\n| kind | us a step | share |\n|---|---|---|")
for kind, us in sums.items():
    print(f"| {kind} | {us / 50:.0f} | {us / total:.0%} |")
print('\n' + prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=12, max_name_column_width=60))
