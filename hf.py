"""The Hugging Face format: GPT-2's weights in, any run's weights out.

    model = GPT.from_pretrained('gpt2')            # or 'gpt2-medium', 'gpt2-large', 'gpt2-xl', a folder
    python train.py config/finetune_shakespeare.py # init_from='gpt2': fine-tune from OpenAI's weights
    python export.py --out_dir=RUN --to=DIR        # DIR/config.json and DIR/model.safetensors

A folder holds config.json and model.safetensors, in one of two layouts:
- GPT-2's (model_type 'gpt2'), which transformers' GPT2LMHeadModel loads with no custom code. An
  additive GPT with GPT-2's architecture (GPT2_ARCH: LayerNorm and Linear biases, GELU's tanh
  approximation, a tied head, dense Q/K/V) is exported so; OpenAI's checkpoints are read so. GPT-2
  stores each Linear weight as a Conv1D's, (in, out), transposed from ours.
- OrthoGPT's own (model_type 'orthogpt') for every other variant: our GPTConfig and state dict as
  they are, which GPT.from_pretrained reads back exactly.
The vocabulary is the checkpoint's (GPT-2: 50257, not padded), so there is no padding to sample.
"""

import json
import os
import re
from dataclasses import asdict, fields

from model import GPT, SWITCHABLE, GPTConfig

GPT2 = {name: f'openai-community/{name}' for name in ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')}
GPT2_ARCH = dict(norm='layernorm', bias=True, activation='gelu_tanh', tie_weights=True, qkv='dense')
ACTIVATIONS = {'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh', 'gelu': 'gelu', 'relu': 'relu'}
CONV1D = re.compile(r'blocks\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight')
FILES = ('config.json', 'model.safetensors')


class PretrainedError(ValueError):
    pass


def is_pretrained(init_from):
    """Whether the config value init_from names weights to start from (not 'scratch' or 'resume')."""
    return init_from not in ('scratch', 'resume')


def locate(name_or_dir):
    """The local folder of a checkpoint: the folder itself, or the hub's copy of a GPT-2 model."""
    if os.path.isdir(name_or_dir):
        folder = name_or_dir
    elif name_or_dir in GPT2:
        from huggingface_hub import hf_hub_download
        try:
            folder = os.path.dirname([hf_hub_download(GPT2[name_or_dir], f) for f in FILES][0])
        except Exception as e:
            raise PretrainedError(f"could not fetch {name_or_dir} from the Hugging Face hub ({type(e).__name__}: "
                                  f"{str(e)[:200]}); offline, put {GPT2[name_or_dir]}'s config.json and "
                                  f"model.safetensors in a folder and pass the folder") from None
    else:
        raise PretrainedError(f"init_from={name_or_dir!r} is neither 'scratch', 'resume', a GPT-2 name "
                              f"({', '.join(GPT2)}) nor a folder")
    missing = [f for f in FILES if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise PretrainedError(f"{folder} holds no {' and no '.join(missing)}: a Hugging Face folder holds "
                              f"config.json and model.safetensors (export.py writes them)")
    return folder


def read(name_or_dir):
    """(config keys, state dict in our names and orientation) of a GPT-2 or OrthoGPT folder."""
    from safetensors.torch import load_file
    folder = locate(name_or_dir)
    with open(os.path.join(folder, 'config.json')) as f:
        hf_cfg = json.load(f)
    tensors = load_file(os.path.join(folder, 'model.safetensors'))
    if hf_cfg.get('model_type') == 'orthogpt':
        keys = {k: tuple(v) if isinstance(v, list) else v for k, v in hf_cfg['config'].items()}
    elif hf_cfg.get('model_type') == 'gpt2':
        keys, tensors = gpt2_keys(hf_cfg, folder), gpt2_state(tensors)
    else:
        raise PretrainedError(f"{folder}: model_type {hf_cfg.get('model_type')!r}; this reads GPT-2 ('gpt2') "
                              f"and OrthoGPT's own exports ('orthogpt')")
    if keys['tie_weights']:
        tensors['lm_head.weight'] = tensors['wte.weight']
    return keys, tensors


def gpt2_keys(hf_cfg, folder):
    """Our config keys for a GPT-2 config.json; what our GPT cannot compute is refused."""
    d = hf_cfg['n_embd']
    unsupported = [k for k, ok in (
        ('activation_function', hf_cfg.get('activation_function', 'gelu_new') in ACTIVATIONS),
        ('layer_norm_epsilon', hf_cfg.get('layer_norm_epsilon', 1e-5) == 1e-5),
        ('n_inner', hf_cfg.get('n_inner') in (None, 4 * d)),
        ('scale_attn_weights', hf_cfg.get('scale_attn_weights', True)),
        ('scale_attn_by_inverse_layer_idx', not hf_cfg.get('scale_attn_by_inverse_layer_idx')),
        ('reorder_and_upcast_attn', not hf_cfg.get('reorder_and_upcast_attn'))) if not ok]
    if unsupported:
        raise PretrainedError(f"{folder}: GPT-2 settings this GPT does not compute: "
                              + ', '.join(f"{k}={hf_cfg.get(k)!r}" for k in unsupported))
    return dict(GPT2_ARCH, n_layer=hf_cfg['n_layer'], n_head=hf_cfg['n_head'], n_embd=d,
                vocab_size=hf_cfg['vocab_size'], block_size=hf_cfg['n_positions'], residual='additive',
                activation=ACTIVATIONS[hf_cfg.get('activation_function', 'gelu_new')],
                tie_weights=hf_cfg.get('tie_word_embeddings', True))


def gpt2_state(tensors):
    """GPT-2's tensors in our names: h.N -> blocks.N, Conv1D weights transposed, the causal-mask
    buffers dropped."""
    state = {}
    for name, t in tensors.items():
        name = re.sub(r'^h\.', 'blocks.', name.removeprefix('transformer.'))
        if re.fullmatch(r'blocks\.\d+\.attn\.(masked_)?bias', name):
            continue
        state[name] = t.t().contiguous() if CONV1D.fullmatch(name) else t
    return state


FREE = SWITCHABLE | {'block_size'}  # keys a run may set otherwise, keeping the weights (block_size: fewer positions)


def adopt(cfg, keys, given):
    """cfg with the checkpoint's model keys, except those in `given` (set by a config file or an
    override): one of these is kept if it leaves the weights as they are (FREE; block_size up to
    the checkpoint's positions), and refused if it does not (another shape, norm or Q/K/V map)."""
    names = {f.name for f in fields(GPTConfig)}
    unknown = sorted(set(keys) - names)
    if unknown:
        raise PretrainedError(f"the checkpoint's config has keys this version does not know: {', '.join(unknown)}")
    mine = {k: getattr(cfg, k) for k in keys if k in given}
    clash = [f"{k}={v!r} (the checkpoint's: {keys[k]!r})" for k, v in mine.items()
             if v != keys[k] and (k not in FREE or k == 'block_size' and v > keys[k])]
    if clash:
        raise PretrainedError("the config sets what the pretrained weights fix: " + ', '.join(clash)
                              + f"; leave these keys out (block_size: at most {keys['block_size']}), the checkpoint "
                                f"sets them")
    try:
        return type(cfg)(**{**asdict(cfg), **keys, **mine})
    except ValueError as e:
        raise PretrainedError(f"with the checkpoint's model keys, {e}") from None


def fit(model, state):
    """Load state into model (the positions cropped to its block_size), or say why it cannot."""
    cfg, own = model.config, model.state_dict()
    state = dict(state, **{'wpe.weight': state['wpe.weight'][:cfg.block_size]})
    if state['wte.weight'].shape[0] != cfg.vocab_size:
        raise PretrainedError(f"the checkpoint has a vocabulary of {state['wte.weight'].shape[0]} tokens, the "
                              f"model {cfg.vocab_size}: train on data in the checkpoint's tokens (GPT-2: "
                              f"python data/prepare_text.py ..., then --dataset=NAME)")
    differ = sorted(set(own) ^ set(state)) + [k for k in own if k in state and own[k].shape != state[k].shape]
    if differ:
        raise PretrainedError(f"the weights do not fit the model of residual={cfg.residual!r}, qkv={cfg.qkv!r}: "
                              f"{', '.join(differ[:4])}{', ...' if len(differ) > 4 else ''} differ; rules that "
                              f"keep the parameters (additive, orthogonal) can start from them, others build "
                              f"another architecture")
    model.load_state_dict(state)
    return model


def load_model(name_or_dir, **overrides):
    """GPT.from_pretrained: the checkpoint's GPT, with overrides of the keys that keep its weights."""
    keys, state = read(name_or_dir)
    return fit(GPT(adopt(GPTConfig(**overrides), keys, set(overrides))), state)


def export(model, folder):
    """Write model to folder as config.json and model.safetensors: GPT-2's layout where the model
    has GPT-2's architecture and the additive rule, else OrthoGPT's own."""
    from safetensors.torch import save_file
    cfg = model.config
    state = {k: t.detach().cpu().contiguous() for k, t in model.state_dict().items()}
    if cfg.tie_weights:
        del state['lm_head.weight']  # the same tensor as wte.weight; safetensors stores it once
    if cfg.residual == 'additive' and all(getattr(cfg, k) == v for k, v in GPT2_ARCH.items()):
        hf_cfg = dict(model_type='gpt2', architectures=['GPT2LMHeadModel'], vocab_size=cfg.vocab_size,
                      n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head,
                      n_inner=None, activation_function='gelu_new', layer_norm_epsilon=1e-5,
                      resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
                      tie_word_embeddings=True)
        state = {'transformer.' + re.sub(r'^blocks\.', 'h.', k): t.t().contiguous() if CONV1D.fullmatch(k) else t
                 for k, t in state.items()}
    else:
        hf_cfg = dict(model_type='orthogpt', config=asdict(cfg))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(hf_cfg, f, indent=1)
    save_file(state, os.path.join(folder, 'model.safetensors'))
    return hf_cfg['model_type']

