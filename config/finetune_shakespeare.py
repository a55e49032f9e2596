# Fine-tune OpenAI's GPT-2 on Tiny Shakespeare in GPT-2 BPE tokens (nanoGPT's finetune_shakespeare):
#   python data/prepare_text.py --files data/shakespeare_char/input.txt --name shakespeare
#   python train.py config/finetune_shakespeare.py                        # additive, as pretrained
#   python train.py config/finetune_shakespeare.py --residual=orthogonal --out_dir=out-finetune-ortho
# The pretrained checkpoint sets the architecture (orthogpt/hf.py); init_from may also be gpt2-medium,
# gpt2-large, gpt2-xl or a Hugging Face folder. A GPU is the place for it: each step reads 32k tokens.
init_from = 'gpt2'
out_dir = 'out-finetune-shakespeare'
dataset = 'shakespeare'
eval_interval = 5
eval_iters = 40
log_interval = 1
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20
learning_rate = 3e-5
decay_lr = False
