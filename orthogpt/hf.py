"""The Hugging Face format: pretrained weights into a training run, a run's model out to a folder.

    model = hf.from_pretrained('gpt2')             # 'gpt2', ..., 'gpt2-xl', or a folder
    python train.py config/finetune_shakespeare.py # init_from='gpt2': fine-tune from OpenAI's weights
    python tools/export.py --out_dir=RUN --to=DIR  # DIR/config.json and DIR/model.safetensors

A folder holds config.json and model.safetensors, in one of two layouts:
- GPT-2's (model_type 'gpt2'), which transformers' GPT2LMHeadModel loads with no custom code. A GPT
  with GPT-2's architecture (GPT2_ARCH: LayerNorm and Linear biases, GELU's tanh approximation, a
  tied head, dense Q/K/V) whose every update is additive is exported so; OpenAI's checkpoints are
  read so. GPT-2 stores each Linear weight as a Conv1D's, (in, out), transposed from ours.
- OrthoGPT's own (model_type 'orthogpt') for every other variant: our GPTConfig and state dict as
  they are, which from_pretrained reads back exactly.
The vocabulary is the checkpoint's (GPT-2: 50257, not padded), so there is no padding to sample.
"""

import json
import os
import re
from dataclasses import asdict, fields, replace

from model import GPT, AdditiveUpdate, GPTConfig
from orthogpt import bpe, hub
from orthogpt.errors import UserError
from orthogpt.files import write_bytes, write_text
from orthogpt.resume import SWITCHABLE

FREE = SWITCHABLE | {'block_size'}  # keys a run may set otherwise, keeping the weights (block_size: fewer positions)

GPT2_HUB = {name: f'openai-community/{name}' for name in ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')}
GPT2_ARCH = dict(norm='layernorm', bias=True, activation='gelu_tanh', tie_weights=True, qkv='dense')
GPT2_ACTIVATIONS = {'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh', 'gelu': 'gelu', 'relu': 'relu'}
GPT2_CONV1D = re.compile(r'blocks\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight')  # stored (in, out)


def from_pretrained(name_or_dir, **overrides):
    """A GPT with the weights of OpenAI's GPT-2 ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl',
    from the Hugging Face hub) or of a Hugging Face folder: GPT-2's, or one that OrthoGPT's
    export wrote. overrides: config keys that keep the weights (dropout, a rule that builds the
    same parameters, a shorter block_size, ...); the others fail to load."""
    keys, state = read_pretrained(name_or_dir)
    return fit(GPT(GPTConfig(**{**keys, **overrides})), state)


def pretrained_folder(name_or_dir):
    """The local folder of a checkpoint: the folder itself, or the hub's copy of a GPT-2 model."""
    if os.path.isdir(name_or_dir):
        return name_or_dir
    if name_or_dir not in GPT2_HUB:
        raise ValueError(f"{name_or_dir!r} is neither a GPT-2 name ({', '.join(GPT2_HUB)}) nor a folder")
    from huggingface_hub import hf_hub_download
    repo, offline = GPT2_HUB[name_or_dir], os.environ.get('HF_HUB_OFFLINE', '0').lower() not in ('', '0', 'false', 'no')
    try:  # offline: the hub's cache alone, at once, rather than retries of a request that cannot succeed
        return os.path.dirname([hf_hub_download(repo, f, local_files_only=offline)
                                for f in ('config.json', 'model.safetensors')][0])
    except Exception as e:
        why = ("the hub is out of reach (HF_HUB_OFFLINE, or huggingface.co does not resolve) and it is not in "
               "the hub's cache" if offline else f"{type(e).__name__}: {str(e)[:200]}")
        raise OSError(f"could not fetch {name_or_dir} from the Hugging Face hub ({why}); put {repo}'s config.json "
                      f"and model.safetensors in a folder and pass the folder") from e


def read_pretrained(name_or_dir):
    """(GPTConfig keys, state dict in our names and orientation) of a Hugging Face folder in GPT-2's
    layout (model_type 'gpt2', as OpenAI's checkpoints) or OrthoGPT's ('orthogpt': our GPTConfig
    and state dict as they are), or of a GPT-2 name on the hub."""
    from safetensors.torch import load_file
    folder = pretrained_folder(name_or_dir)
    missing = [f for f in ('config.json', 'model.safetensors') if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise ValueError(f"{folder} holds no {' and no '.join(missing)}: a Hugging Face folder holds config.json "
                         f"and model.safetensors")
    with open(os.path.join(folder, 'config.json')) as f:
        hf = json.load(f)
    tensors = load_file(os.path.join(folder, 'model.safetensors'))
    if hf.get('model_type') == 'orthogpt':  # JSON's lists are the config's tuples
        keys = {k: tuple(v) if isinstance(v, list) else v for k, v in hf['config'].items()}
        keys['options'] = {k: tuple(v) if isinstance(v, list) else v for k, v in keys.get('options', {}).items()}
    elif hf.get('model_type') == 'gpt2':
        keys, tensors = gpt2_keys(hf, folder), gpt2_state(tensors)
    else:
        raise ValueError(f"{folder}: model_type {hf.get('model_type')!r}; GPT-2's ('gpt2') and OrthoGPT's "
                         f"('orthogpt') are read")
    if keys['tie_weights']:
        tensors['lm_head.weight'] = tensors['wte.weight']
    return keys, tensors


def gpt2_keys(hf, folder):
    """GPTConfig keys for a GPT-2 config.json; what this GPT cannot compute is refused."""
    d = hf['n_embd']
    unsupported = [k for k, ok in (
        ('activation_function', hf.get('activation_function', 'gelu_new') in GPT2_ACTIVATIONS),
        ('layer_norm_epsilon', hf.get('layer_norm_epsilon', 1e-5) == 1e-5),
        ('n_inner', hf.get('n_inner') in (None, 4 * d)),
        ('scale_attn_weights', hf.get('scale_attn_weights', True)),
        ('scale_attn_by_inverse_layer_idx', not hf.get('scale_attn_by_inverse_layer_idx')),
        ('reorder_and_upcast_attn', not hf.get('reorder_and_upcast_attn'))) if not ok]
    if unsupported:
        raise ValueError(f"{folder}: GPT-2 settings this GPT does not compute: "
                         + ', '.join(f"{k}={hf.get(k)!r}" for k in unsupported))
    return dict(GPT2_ARCH, n_layer=hf['n_layer'], n_head=hf['n_head'], n_embd=d, vocab_size=hf['vocab_size'],
                block_size=hf['n_positions'], activation=GPT2_ACTIVATIONS[hf.get('activation_function', 'gelu_new')],
                tie_weights=hf.get('tie_word_embeddings', True))


def gpt2_state(tensors):
    """GPT-2's tensors in our names: h.N -> blocks.N, Conv1D weights transposed, the causal-mask
    buffers dropped."""
    state = {}
    for name, t in tensors.items():
        name = re.sub(r'^h\.', 'blocks.', name.removeprefix('transformer.'))
        if re.fullmatch(r'blocks\.\d+\.attn\.(masked_)?bias', name):
            continue
        state[name] = t.t().contiguous() if GPT2_CONV1D.fullmatch(name) else t
    return state


def is_pretrained(init_from):
    """Whether the config value init_from names weights to start from (not 'scratch' or 'resume')."""
    return init_from not in ('scratch', 'resume')


def read(name_or_dir):
    """(GPTConfig keys, state dict) of pretrained weights, or a UserError saying why not."""
    if not os.path.isdir(name_or_dir) and name_or_dir not in GPT2_HUB:
        raise UserError(f"init_from={name_or_dir!r} is neither 'scratch', 'resume', a GPT-2 name "
                        f"({', '.join(GPT2_HUB)}) nor a folder")
    if name_or_dir in GPT2_HUB and not os.path.isdir(name_or_dir):
        hub.offline()  # out of reach: the hub's cache alone, at once
    try:
        return read_pretrained(name_or_dir)
    except (OSError, ValueError) as e:
        raise UserError(f"init_from={name_or_dir!r}: {e}") from None


def adopt(cfg, keys, given):
    """cfg with the checkpoint's model keys, except those in `given` (set by a config file or an
    override): one of these is kept if it leaves the weights as they are (FREE; block_size up to
    the checkpoint's positions), and refused if it does not (another shape, norm or Q/K/V map)."""
    names = {f.name for f in fields(GPTConfig)}
    unknown = sorted(set(keys) - names)
    if unknown:
        raise UserError(f"the checkpoint's config has keys this version does not know: {', '.join(unknown)}")
    mine = {k: getattr(cfg, k) for k in keys if k in given}
    if mine.get('residual', keys.get('residual')) != keys.get('residual'):  # the saved options are another rule's
        keys = {k: v for k, v in keys.items() if k != 'options'}
    clash = [f"{k}={v!r} (the checkpoint's: {keys[k]!r})" for k, v in mine.items()
             if v != keys[k] and (k not in FREE or k == 'block_size' and v > keys[k])]
    if clash:
        raise UserError("the config sets what the pretrained weights fix: " + ', '.join(clash)
                        + f"; leave these keys out (block_size: at most {keys['block_size']}), the checkpoint "
                          f"sets them")
    try:
        return replace(cfg, model='gpt', **{**keys, **mine})
    except ValueError as e:
        raise UserError(f"with the checkpoint's model keys, {e}") from None


def fit(model, state):
    """Load state into model (the positions cropped to its block_size), or say why it cannot."""
    cfg, own = model.config, model.state_dict()
    state = dict(state, **{'wpe.weight': state['wpe.weight'][:cfg.block_size]})
    if state['wte.weight'].shape[0] != cfg.vocab_size:
        raise UserError(f"the checkpoint has a vocabulary of {state['wte.weight'].shape[0]} tokens, the "
                        f"model {cfg.vocab_size}: train on data in the checkpoint's tokens (GPT-2: "
                        f"python data/prepare_text.py ..., then --dataset=NAME)")
    differ = sorted(set(own) ^ set(state)) + [k for k in own if k in state and own[k].shape != state[k].shape]
    if differ:
        raise UserError(f"the weights do not fit the model of residual={cfg.residual!r}, qkv={cfg.qkv!r}: "
                        f"{', '.join(differ[:4])}{', ...' if len(differ) > 4 else ''} differ; rules that "
                        f"keep the parameters (additive, orthogonal) can start from them, others build "
                        f"another architecture")
    model.load_state_dict(state)
    return model


def gpt2_layout(model):
    """Whether transformers' GPT-2 computes this model: GPT-2's architecture, every update additive."""
    cfg = model.config
    return (all(getattr(cfg, k) == v for k, v in GPT2_ARCH.items())
            and all(type(m) is AdditiveUpdate for b in model.blocks for m in (b.update_attn, b.update_mlp)))


def export(model, folder, gpt2_tokens=False):
    """Write model to folder as config.json and model.safetensors: GPT-2's layout where
    gpt2_layout(model), else OrthoGPT's own; with gpt2_tokens (a model of GPT-2's vocabulary), the
    GPT-2 tokenizer's files from tiktoken's cache, where it holds them, so that transformers'
    AutoTokenizer loads the folder; and a README.md that says how to load it. Returns the layout's
    model_type."""
    from safetensors.torch import save
    cfg = model.config
    state = {k: t.detach().cpu().contiguous() for k, t in model.state_dict().items()}
    if cfg.tie_weights:
        del state['lm_head.weight']  # the same tensor as wte.weight; safetensors stores it once
    eot = 50256 if cfg.vocab_size > 50256 else None  # GPT-2's <|endoftext|>, where the vocabulary has it
    if gpt2_layout(model):
        hf_cfg = dict(model_type='gpt2', architectures=['GPT2LMHeadModel'], vocab_size=cfg.vocab_size,
                      n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head,
                      n_inner=None, activation_function='gelu_new', layer_norm_epsilon=1e-5,
                      resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
                      tie_word_embeddings=True, bos_token_id=eot, eos_token_id=eot)
        state = {'transformer.' + re.sub(r'^blocks\.', 'h.', k): t.t().contiguous() if GPT2_CONV1D.fullmatch(k) else t
                 for k, t in state.items()}
    else:
        hf_cfg = dict(model_type='orthogpt', config=asdict(cfg))
    write_text(os.path.join(folder, 'config.json'), json.dumps(hf_cfg, indent=1))
    write_bytes(os.path.join(folder, 'model.safetensors'), save(state))
    tokenizer = bpe.cached_files() if gpt2_tokens else {}
    for name, path in ((('vocab.json', tokenizer['encoder.json']), ('merges.txt', tokenizer['vocab.bpe']))
                       if tokenizer else ()):
        with open(path, 'rb') as f:
            write_bytes(os.path.join(folder, name), f.read())
    if tokenizer:
        write_text(os.path.join(folder, 'tokenizer_config.json'), json.dumps(dict(
            tokenizer_class='GPT2Tokenizer', model_max_length=cfg.block_size, bos_token='<|endoftext|>',
            eos_token='<|endoftext|>', unk_token='<|endoftext|>'), indent=1))
    write_text(os.path.join(folder, 'README.md'), readme(hf_cfg['model_type'], cfg, bool(tokenizer), gpt2_tokens))
    return hf_cfg['model_type']


def readme(layout, cfg, tokenizer, gpt2_tokens):
    """The exported folder's README.md: what it holds and how to load it."""
    name = f"residual={cfg.residual!r}, qkv={cfg.qkv!r}, norm={cfg.norm!r}, activation={cfg.activation!r}"
    lines = [f"# An OrthoGPT model ({cfg.n_layer} layers x {cfg.n_embd}, {cfg.vocab_size} tokens, {name})", ""]
    if layout == 'gpt2':
        lines += ["GPT-2's layout: transformers loads it with no custom code.", "", "```python",
                  "from transformers import GPT2LMHeadModel", "model = GPT2LMHeadModel.from_pretrained('.')"]
        lines += ["from transformers import AutoTokenizer", "tokenizer = AutoTokenizer.from_pretrained('.')"] if tokenizer else []
        lines += ["```"]
    else:
        lines += ["OrthoGPT's own layout (`model_type` 'orthogpt'): its residual update, Q/K/V map or norms are none "
                  "of transformers' GPT-2, so transformers cannot load it (it would ask for a newer version: it knows "
                  "no model type 'orthogpt'). OrthoGPT's `orthogpt.hf` reads it back exactly:", "", "```python",
                  "from orthogpt import hf   # in a clone of OrthoGPT", "model = hf.from_pretrained('.')", "```"]
    if gpt2_tokens and not tokenizer:
        lines += ["", "Its tokens are GPT-2's BPE (tiktoken's 'gpt2' encoding); the tokenizer's files were not in "
                      "tiktoken's cache when it was exported, so none are here."]
    elif not gpt2_tokens:
        lines += ["", "Its vocabulary is the training run's own (characters): the run's checkpoint holds it "
                      "(`meta`), and `python sample.py --out_dir=RUN` decodes with it."]
    return '\n'.join(lines) + '\n'
