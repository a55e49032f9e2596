# GPT-2 small as an Orthogonal Transformer: rotation updates on the sphere of radius sqrt(768), no
# norms in the blocks, one weightless RMSNorm after the embeddings, and the paper's
# initialisation (sigma_w, sigma_qk, ReLU MLP, unit-variance untied token embeddings).
# The paper trains only a 16 x 256 model; these scale choices are ours.
from config.gpt2_124m import *  # noqa: F401,F403

out_dir = 'out-gpt2-124m-rot'
residual = 'rotation'
init = 'sigma'
sigma_w = 0.5
sigma_qk = 1.0
activation = 'relu'
tie_weights = False
