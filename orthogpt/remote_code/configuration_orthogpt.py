"""The configuration of an OrthoGPT language model for transformers' AutoConfig (trust_remote_code=True).

`config` is the model's GPTConfig as model.py beside this file defines it, kept whole; the standard names that
transformers' tools read (vocab_size, max_position_embeddings, hidden_size, ...) follow from it. In OrthoGPT's
repository this file lies in orthogpt/remote_code/, which orthogpt/hf.py's export copies beside model.py.
"""

from transformers import PretrainedConfig

# transformers keys the model classes it registers by this config's class, and names the class's module after a hash
# of this file and of those it imports: importing model.py and rules.py gives every folder whose model code or rule
# differs classes of its own, so that two exports loaded in one process do not share the first one's model class
from .model import __name__ as model  # noqa: F401
from .rules import __name__ as rules  # noqa: F401


class OrthoGPTConfig(PretrainedConfig):
    model_type = 'orthogpt'

    def __init__(self, config=None, **kwargs):
        self.config = dict(config or {})
        c = self.config
        kwargs.update(vocab_size=c.get('vocab_size'), max_position_embeddings=c.get('block_size'),
                      hidden_size=c.get('n_embd'), num_hidden_layers=c.get('n_layer'),
                      num_attention_heads=c.get('n_head'), tie_word_embeddings=c.get('tie_weights', True))
        super().__init__(**kwargs)
