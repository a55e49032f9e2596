# nanochat's block (A. Karpathy, nanochat, nanochat/gpt.py at commit 92d63d4, 2026-07-03) around any rule, at any
# size: stack it after the rule's config and before config/cpu.py or --depth:
#   python train.py config/shakespeare_rot.py config/modern.py config/cpu.py
# What it sets, each a key of its own (python train.py --help; docs/rules.md, "The modern block"):
#   - rotary positions (RoFormer, J. Su et al., arXiv:2104.09864) at nanochat's base of 100,000, no learned ones;
#   - a parameter-free RMSNorm of each head's q and k, after RoPE (nGPT: its own normalisation of q and k);
#   - ReLU^2 in the standard MLP (Primer, D. R. So et al., arXiv:2109.08668; a gated MLP keeps its SiLU);
#   - pre-norms without gains: parameter-free RMSNorm (none at all under a norm-keeping rule, as before);
#   - the logit soft-cap 15 tanh(z / 15) (Gemma 2, arXiv:2408.00118), in training, evaluation and decoding;
#   - value embeddings on every other layer, the last among them, gated per head;
#   - an untied head, no biases.
# Not set here, and so the config's own: the initialisation, the optimizer, dropout, and nanochat's x0/resid lambdas,
# which are a rule of this codebase's (x0_mix='nanochat') and compared as one. Not built: nanochat's norm after the
# token embedding, its smear and backout, its 1.2 scale of the normalised q and k, sliding windows and GQA.
# A ViT refuses it (its positions are a grid of patches, its tokens have no ids).
pos = 'rope'
rope_base = 100000.0
qk_norm = True
activation = 'relu2'
norm = 'rmsnorm'
norm_gain = False
logit_softcap = 15.0
value_embeds = True
tie_weights = False
bias = False
out_dir = out_dir + '-modern'  # noqa: F821  (set by the config before this one)
