# Character-level Tiny Shakespeare in the setting of "The Orthogonal Transformer" (preprint, no
# arXiv id), section "Experiments": 16 layers, d=256,
# 4 heads, Adam betas (0.9, 0.99), no weight decay, the sigma_w / sigma_qk initialisation with a
# ReLU MLP and unit-variance token embeddings, pre-RMSNorm baseline.
# shakespeare_{add,ortho,rot,cayley}.py import this and change the residual rule.
#
# Not given by the paper, so taken from nanoGPT's shakespeare_char config: block_size 256,
# batch_size 64, 5000 iterations, 100 warmup iterations, cosine decay to lr/10, grad clip 1.0,
# learned position embeddings (initialised N(0, 0.02)), untied output head (N(0, 0.02)).
# The paper sweeps sigma_w without giving the values; 0.5 is the best of {0.25, 0.5, 1.0} for the
# additive model on the CPU recipe (docs/results.md). Dropout 0: the paper mentions none (nanoGPT uses 0.2
# on its smaller 6x384 model).
# Our choice: lr 1e-3, not the paper's 4e-3 (--learning_rate=4e-3 gives the paper's value); docs/results.md,
# "Tiny Shakespeare at the paper's scale, on a GPU", has both.

out_dir = 'out-shakespeare'
dataset = 'shakespeare_char'
eval_interval = 250
eval_iters = 200
log_interval = 10

n_layer = 16
n_head = 4
n_embd = 256
block_size = 256
batch_size = 64
dropout = 0.0
bias = False
norm = 'rmsnorm'
activation = 'relu'
init = 'sigma'
sigma_w = 0.5
sigma_qk = 1.0
tie_weights = False

learning_rate = 1e-3
beta1 = 0.9
beta2 = 0.99
weight_decay = 0.0
max_iters = 5000
warmup_iters = 100
