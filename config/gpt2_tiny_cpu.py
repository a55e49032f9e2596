# A GPT-2-shaped model small enough for a CPU, whose export transformers loads as it is
# (GPT2LMHeadModel, and AutoTokenizer where tiktoken's cache holds GPT-2's tokenizer files): the
# whole path from text to a Hugging Face folder and HellaSwag, with no hub.
#   python data/prepare_text.py --files data/shakespeare_char/input.txt --name shakespeare   # GPT-2 BPE shards
#   python train.py config/gpt2_tiny_cpu.py
#   python tools/export.py --out_dir=out-gpt2-tiny-cpu --to=out-gpt2-tiny-cpu-hf
#   python tools/eval_hellaswag.py --init_from=out-gpt2-tiny-cpu-hf --data=hellaswag_val.jsonl
# GPT-2's architecture (orthogpt.hf.GPT2_ARCH: LayerNorm and Linear biases, GELU's tanh form, a tied head,
# dense Q/K/V), additive updates and GPT-2's initialisation, at 4 layers x 128 over GPT-2's
# 50257 tokens (padded to 50304): the tied embedding is most of its 7.2M parameters.
out_dir = 'out-gpt2-tiny-cpu'
dataset = 'shakespeare'
device = 'cpu'
compile = False

n_layer, n_head, n_embd = 4, 4, 128
block_size = 64
vocab_size = 50304
residual = 'additive'
qkv = 'dense'
norm = 'layernorm'
bias = True
activation = 'gelu_tanh'
tie_weights = True
init = 'gpt2'
dropout = 0.0

batch_size = 8
max_iters = 300
learning_rate = 1e-3
warmup_iters = 30
weight_decay = 0.1
eval_interval = 100
eval_iters = 10
log_interval = 10
