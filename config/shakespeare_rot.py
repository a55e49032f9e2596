# The Orthogonal Transformer: each update rotates x on the sphere of radius sqrt(n_embd);
# no norms in the blocks, one weightless RMSNorm after the embeddings.
from config.shakespeare_char import *  # noqa: F401,F403  (the paper's setting)

out_dir = 'out-shakespeare-rot'
residual = 'rotation'
