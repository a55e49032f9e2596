"""The configuration of an OrthoGPT language model for transformers' AutoConfig (trust_remote_code=True).

`config` is the model's GPTConfig as model.py beside this file defines it, kept whole; the standard names that
transformers' tools read (vocab_size, max_position_embeddings, hidden_size, ...) follow from it. In OrthoGPT's
repository this file lies in orthogpt/remote_code/, which orthogpt/hf.py's export copies beside model.py.
"""

from transformers import PretrainedConfig


class OrthoGPTConfig(PretrainedConfig):
    model_type = 'orthogpt'

    def __init__(self, config=None, **kwargs):
        self.config = dict(config or {})
        c = self.config
        kwargs.update(vocab_size=c.get('vocab_size'), max_position_embeddings=c.get('block_size'),
                      hidden_size=c.get('n_embd'), num_hidden_layers=c.get('n_layer'),
                      num_attention_heads=c.get('n_head'), tie_word_embeddings=c.get('tie_weights', True))
        super().__init__(**kwargs)
