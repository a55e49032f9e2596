"""An OrthoGPT language model for transformers' AutoModelForCausalLM (trust_remote_code=True).

model.py beside this file is OrthoGPT's own model code, copied verbatim when the model was exported (and rules.py the
module of a rule defined outside it, if any); this file
only fits its GPT to transformers' conventions: input_ids in, logits out, `labels` shifted inside for the loss,
and generate() with the GPT's own decoding state (model.DecodeState) as the cache between steps. In OrthoGPT's
repository it lies in orthogpt/remote_code/, which orthogpt/hf.py's export copies beside model.py: it runs there.
"""

import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

# rules.py registers a rule defined outside model.py as it is imported (it is empty for model.py's own rules); in the
# form `from .x import y`, which transformers follows to copy the file along
from .rules import __name__ as rules  # noqa: F401
from .configuration_orthogpt import OrthoGPTConfig
from .model import GPT, DecodeState, GPTConfig


class OrthoGPTCache(DecodeState):
    """The GPT's decoding state, which generate() carries from step to step. Every buffer it holds has the batch
    first, so beam search reorders it by rows, in place (its buffers keep their addresses)."""

    def reorder_cache(self, beam_idx):
        for t in self.tensors():
            t.copy_(t.index_select(0, beam_idx.to(t.device)))


class OrthoGPTForCausalLM(PreTrainedModel, GenerationMixin):
    """model.GPT, as transformers calls a causal language model."""
    config_class = OrthoGPTConfig
    base_model_prefix = 'gpt'  # model.safetensors names the GPT's tensors as OrthoGPT does; loading adds gpt.
    _tied_weights_keys = {'gpt.lm_head.weight': 'gpt.wte.weight'}  # where config.tie_word_embeddings

    def __init__(self, config):
        super().__init__(config)
        with torch.device('cpu'):  # not the meta device of from_pretrained: model.py computes values as it builds
            self.gpt = GPT(GPTConfig(**config.config))
        self.unsaved = [(m, name, getattr(m, name)) for m in self.gpt.modules()
                        for name in m._non_persistent_buffers_set if getattr(m, name) is not None]
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # the cache is the GPT's own, which forward starts

    def _init_weights(self, module):
        """from_pretrained reads every parameter, and leaves empty the buffers that are not saved (mHC's permutation
        matrices): they take back the values model.py built."""
        for m, name, value in self.unsaved:
            if m is module:
                getattr(m, name).copy_(value)

    def forward(self, input_ids, attention_mask=None, cache=None, labels=None, use_cache=False, logits_to_keep=0,
                **kwargs):
        """logits (B, T, vocab) for input_ids (B, T); with labels (B, T), usually input_ids themselves, the mean
        cross-entropy of each next token (the shift is made here; -100 marks a label to ignore). use_cache, which
        generate() passes, starts a cache; with one, input_ids continue the sequence it has seen. logits_to_keep: the
        last positions whose logits are computed (0: all; generate() asks for 1, which the head then reads alone). The
        GPT reads no padding mask: padding may only end a row, where no earlier position sees it. kwargs: what
        generate() and transformers' Trainer pass that this model has no use for (return_dict, num_items_in_batch)."""
        if attention_mask is not None and (attention_mask[:, 1:] > attention_mask[:, :-1]).any():
            raise ValueError("OrthoGPT models take no padding before a token (left padding): pad on the right, or "
                             "generate for one prompt, or prompts of one length, at a time")
        if use_cache and cache is None:
            cache = OrthoGPTCache(self.gpt.config.block_size, input_ids.device)
        logits = self.gpt(input_ids, cache=cache, last=logits_to_keep == 1)[0][:, -logits_to_keep:]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)

    def generate(self, *args, **kwargs):
        with parametrize.cached():  # orthogonal Q/K/V maps computed once, not at every token
            return super().generate(*args, **kwargs)
