# A 2-layer GPT on whatever tokenized corpus is prepared, small enough for a CPU:
#   python data/prepare_text.py --files 'corpus/*.txt' --name mycorpus
#   python train.py config/owt_smoke.py --dataset=mycorpus
#   torchrun --standalone --nproc_per_node=2 train.py config/owt_smoke.py --dataset=mycorpus --init_from=auto
out_dir = 'out-owt-smoke'
dataset = 'openwebtext'
device = 'cpu'
compile = False

n_layer = 2
n_head = 4
n_embd = 128
block_size = 128
vocab_size = 50304

batch_size = 8
gradient_accumulation_steps = 2  # divides by 1 or 2 processes
learning_rate = 1e-3
warmup_iters = 10
max_iters = 100
eval_interval = 50
eval_iters = 10
log_interval = 10
