"""The Hugging Face format: pretrained weights into a training run, a run's model out to a folder.

    model = hf.from_pretrained('gpt2')             # 'gpt2', ..., 'gpt2-xl', or a folder
    python train.py config/finetune_shakespeare.py # init_from='gpt2': fine-tune from OpenAI's weights
    python tools/export.py --out_dir=RUN --to=DIR  # a folder that transformers loads, whatever the rule

A folder holds config.json and model.safetensors, in one of two layouts:
- GPT-2's (model_type 'gpt2'), which transformers' GPT2LMHeadModel loads with no custom code. A GPT
  with GPT-2's architecture (GPT2_ARCH: LayerNorm and Linear biases, GELU's tanh approximation, a
  tied head, dense Q/K/V) whose every update is additive is exported so; OpenAI's checkpoints are
  read so. GPT-2 stores each Linear weight as a Conv1D's, (in, out), transposed from ours.
- OrthoGPT's own (model_type 'orthogpt') for every other variant: our GPTConfig (config.json's
  'config') and state dict as they are, which from_pretrained reads back exactly. Beside them,
  model.py itself, copied, and the two files of orthogpt/remote_code/ that fit its GPT to
  transformers, named in config.json's auto_map: AutoModelForCausalLM.from_pretrained(DIR,
  trust_remote_code=True) loads it with no clone of OrthoGPT. A rule defined outside model.py
  (rule_module) goes with it as rules.py, which modeling_orthogpt.py imports. (Folders of older
  versions lack them; from_pretrained reads those as well.)
The vocabulary is the checkpoint's (GPT-2: 50257, not padded), so there is no padding to sample.
Beside the model: the tokenizer AutoTokenizer loads (GPT-2's files, or a character vocabulary's
tokenizer.json) and a README.md, the model card.
"""

import inspect
import json
import os
import re
import sys
from dataclasses import asdict, fields, replace

from configure.loader import import_rule_module
from model import GPT, QKV_MAPS, RESIDUALS, AdditiveUpdate, GPTConfig
from orthogpt import bpe, hub
from orthogpt.errors import UserError
from orthogpt.files import write_bytes
from orthogpt.resume import SWITCHABLE

FREE = SWITCHABLE | {'block_size'}  # keys a run may set otherwise, keeping the weights (block_size: fewer positions)

GPT2_HUB = {name: f'openai-community/{name}' for name in ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')}
GPT2_ARCH = dict(norm='layernorm', norm_gain=True, bias=True, activation='gelu_tanh', tie_weights=True,
                 qkv='dense', pos='learned', qk_norm=False, value_embeds=False, logit_softcap=0.0)
GPT2_ACTIVATIONS = {'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh', 'gelu': 'gelu', 'relu': 'relu'}
GPT2_CONV1D = re.compile(r'blocks\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight')  # stored (in, out)

REMOTE_CODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'remote_code')  # copied beside model.py
REMOTE_FILES = ('configuration_orthogpt.py', 'modeling_orthogpt.py')
RULES_FILE = 'rules.py'  # beside them: the module of a rule defined outside model.py, which modeling_orthogpt imports
AUTO_MAP = {'AutoConfig': 'configuration_orthogpt.OrthoGPTConfig',
            'AutoModelForCausalLM': 'modeling_orthogpt.OrthoGPTForCausalLM'}


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
    and state dict as they are, as export writes them or as transformers' save_pretrained does,
    under gpt.), or of a GPT-2 name on the hub."""
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
        if hf.get('rule_module') and hf['config']['residual'] not in RESIDUALS:  # a rule of its own: its module
            import_rule_module(hf['rule_module'])
        keys = {k: tuple(v) if isinstance(v, list) else v for k, v in hf['config'].items()}
        keys['options'] = {k: tuple(v) if isinstance(v, list) else v for k, v in keys.get('options', {}).items()}
        tensors = {k.removeprefix('gpt.'): t for k, t in tensors.items()}  # transformers' save_pretrained: gpt.*
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
    """Whether the config value init_from names weights to start from (not 'scratch', 'resume' or 'auto')."""
    return init_from not in ('scratch', 'resume', 'auto')


def read(name_or_dir):
    """(GPTConfig keys, state dict) of pretrained weights, or a UserError saying why not."""
    if not os.path.isdir(name_or_dir) and name_or_dir not in GPT2_HUB:
        raise UserError(f"init_from={name_or_dir!r} is neither 'scratch', 'resume', 'auto', a GPT-2 name "
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
    if 'wpe.weight' in state:
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


def read_bytes(path):
    with open(path, 'rb') as f:
        return f.read()


def foreign_classes(model, carried=None):
    """The classes of model's modules that neither model.py, torch nor the module `carried` defines."""
    return sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()
                   if type(m).__module__ not in (GPT.__module__, carried) and not type(m).__module__.startswith('torch.')})


def rule_source(cfg):
    """(module name, rules.py's text) for the exported folder: the source of the module that defines the rule outside
    model.py, its imports of model made relative to the folder's copy; (None, a docstring) for a rule of model.py."""
    name = RESIDUALS[cfg.residual].__module__
    if name == GPT.__module__:
        return None, '"""No rule outside model.py: this model\'s rule is one of model.py\'s own."""\n'
    try:
        source = inspect.getsource(sys.modules[name])
    except (OSError, TypeError, KeyError):
        raise UserError(f"residual={cfg.residual!r} is defined in {name}, whose source cannot be read (a script run "
                        f"as __main__, or an interactive session): define it in a module of its own to export it") from None
    source = re.sub(r'^(\s*)from model import', r'\1from .model import', source, flags=re.M)
    return name, re.sub(r'^(\s*)import model\b', r'\1from . import model', source, flags=re.M)


def char_tokenizer(itos):
    """The tokenizer.json (the `tokenizers` library's format) of a character vocabulary, itos[i] the character of
    token i: every character one token, the tokens joined back as they are. A character outside it fails to encode."""
    every_character = {'type': 'Split', 'pattern': {'Regex': r'[\s\S]'}, 'behavior': 'Isolated', 'invert': False}
    return {'version': '1.0', 'truncation': None, 'padding': None, 'added_tokens': [], 'normalizer': None,
            'pre_tokenizer': every_character, 'post_processor': None, 'decoder': {'type': 'Fuse'},
            'model': {'type': 'WordLevel', 'vocab': {c: i for i, c in enumerate(itos)}, 'unk_token': '<unk>'}}


def tokenizer_files(tokens, cfg):
    """{file name: contents} of the tokenizer transformers' AutoTokenizer loads offline: GPT-2's from tiktoken's cache
    ({} where it lacks them), or a character vocabulary's tokenizer.json."""
    if tokens is None:
        return {}
    if tokens == 'gpt2':
        cached = bpe.cached_files()
        if not cached:
            return {}
        files = {name: read_bytes(cached[source]) for name, source in (('vocab.json', 'encoder.json'),
                                                                         ('merges.txt', 'vocab.bpe'))}
        settings = dict(tokenizer_class='GPT2Tokenizer', bos_token='<|endoftext|>', eos_token='<|endoftext|>',
                        unk_token='<|endoftext|>')
    else:
        files = {'tokenizer.json': json.dumps(char_tokenizer(tokens), indent=1, ensure_ascii=False).encode()}
        settings = dict(tokenizer_class='PreTrainedTokenizerFast', clean_up_tokenization_spaces=False)
    settings['model_max_length'] = cfg.block_size
    return {**files, 'tokenizer_config.json': json.dumps(settings, indent=1).encode()}


def export(model, folder, tokens=None, run=None):
    """Write model to folder for transformers, and return the layout's model_type: 'gpt2' where gpt2_layout(model)
    (GPT2LMHeadModel loads it, no custom code), else 'orthogpt': our GPTConfig in config.json, registered through
    its auto_map, the state dict as it is, model.py itself and the files of orthogpt/remote_code/ that fit its GPT to
    transformers (AutoModelForCausalLM with trust_remote_code=True), so that the folder needs no clone of OrthoGPT.
    tokens: 'gpt2' (GPT-2's BPE; its files from tiktoken's cache, where it holds them), a character vocabulary (the
    character of each token id) or None: the tokenizer AutoTokenizer loads. run: the training run's config,
    iter_num and best_val_loss, for the model card (README.md). A folder that holds any of the files is refused."""
    from safetensors.torch import save
    cfg = model.config
    layout = 'gpt2' if gpt2_layout(model) else 'orthogpt'
    module, rules = rule_source(cfg) if layout == 'orthogpt' else (None, None)
    foreign = foreign_classes(model, module)
    if layout == 'orthogpt' and foreign:
        raise UserError(f"residual={cfg.residual!r} builds {', '.join(foreign)}, which neither model.py nor the rule's "
                        f"module defines: the exported folder carries those two alone, so transformers could not build "
                        f"the model; define those classes in the rule's module to export it")
    state = {k: t.detach().cpu().contiguous() for k, t in model.state_dict().items()}
    if cfg.tie_weights:
        del state['lm_head.weight']  # the same tensor as wte.weight; safetensors stores it once
    eot = 50256 if cfg.vocab_size > 50256 else None  # GPT-2's <|endoftext|>, where the vocabulary has it
    if layout == 'gpt2':
        hf_cfg = dict(model_type='gpt2', architectures=['GPT2LMHeadModel'], vocab_size=cfg.vocab_size,
                      n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head,
                      n_inner=None, activation_function='gelu_new', layer_norm_epsilon=1e-5,
                      resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
                      tie_word_embeddings=True, bos_token_id=eot, eos_token_id=eot)
        state = {'transformer.' + re.sub(r'^blocks\.', 'h.', k): t.t().contiguous() if GPT2_CONV1D.fullmatch(k) else t
                 for k, t in state.items()}
        code = {}
    else:
        hf_cfg = dict(model_type='orthogpt', architectures=['OrthoGPTForCausalLM'], auto_map=AUTO_MAP,
                      config=asdict(replace(cfg, options=RESIDUALS[cfg.residual].exported(cfg.options))),
                      rule_module=module, bos_token_id=eot, eos_token_id=eot)
        code = {'model.py': read_bytes(inspect.getsourcefile(GPT)), RULES_FILE: rules.encode(),
                **{name: read_bytes(os.path.join(REMOTE_CODE, name)) for name in REMOTE_FILES}}
    tokenizer = tokenizer_files(tokens, cfg)
    files = {'config.json': json.dumps(hf_cfg, indent=1).encode(), 'model.safetensors': save(state), **code,
             **tokenizer, 'README.md': model_card(layout, model, folder, tokens, bool(tokenizer), run).encode()}
    present = [name for name in files if os.path.exists(os.path.join(folder, name))]
    if present:
        raise UserError(f"{folder} already holds {', '.join(present)}: an export writes over nothing; pick another "
                        f"folder (or delete those)")
    for name, data in files.items():
        write_bytes(os.path.join(folder, name), data)
    return layout


def references():
    """{short name: the paper} of the citations in model.py's docstring ('[Oh]    G. Oh, ...', continued on more
    indented lines)."""
    refs, key = {}, None
    for line in (inspect.getmodule(GPT).__doc__ or '').splitlines():
        cite = re.match(r'\s*\[([^\]]+)\]\s+(\S.*)', line)
        if cite:
            key, refs[cite[1]] = cite[1], cite[2]
        elif key and line.startswith('   ') and line.strip():
            refs[key] += ' ' + line.strip()
        else:
            key = None
    return refs


def model_card(layout, model, folder, tokens, tokenizer, run):
    """The exported folder's README.md: the model (its rule, and the papers model.py cites for it), how to load,
    sample and evaluate it, and the training run (its config and val loss)."""
    cfg, rule = model.config, RESIDUALS[model.config.residual]
    refs = references()
    cited = dict.fromkeys(k for part in (rule, QKV_MAPS[cfg.qkv]) if part is not None
                          for k in re.findall(r'\[([^\]]+)\]', part.__doc__ or '') if k in refs)
    vocabulary = 'GPT-2 BPE' if tokens == 'gpt2' else 'characters' if tokens else 'no tokenizer'
    custom = '' if layout == 'gpt2' else ', trust_remote_code=True'
    lines = ["---", "library_name: transformers", "tags: [orthogpt]", "---", "",
             f"# OrthoGPT: residual={cfg.residual!r}, {cfg.n_layer} layers x {cfg.n_embd}", "",
             f"A causal language model trained with OrthoGPT and exported by its tools/export.py. Its residual "
             f"update, `{cfg.residual}` ({rule.__name__} in model.py):", "",
             *('    ' + line if line else '' for line in inspect.cleandoc(rule.__doc__ or 'no docstring').splitlines()),
             "",
             f"- rule options: {', '.join(f'{k}={v!r}' for k, v in asdict(cfg.options).items()) or 'none'}",
             f"- Q/K/V {cfg.qkv!r}, norm {cfg.norm!r}, MLP {cfg.mlp!r} with {cfg.activation!r}, "
             f"{'tied' if cfg.tie_weights else 'untied'} head",
             f"- {cfg.vocab_size} tokens ({vocabulary}), {cfg.block_size} positions, {model.num_params():,} parameters",
             ""]
    if cited:
        lines += ["Papers (as model.py cites them):", ""] + [f"- [{k}] {refs[k]}" for k in cited] + [""]
    lines += ["## Loading", ""]
    if layout == 'gpt2':
        lines += ["GPT-2's layout: transformers' GPT2LMHeadModel computes it, with no custom code.", ""]
    else:
        lines += ["OrthoGPT's layout, with its own code: `model.py` is OrthoGPT's model code, copied as it was at "
                  "export, and `modeling_orthogpt.py` and `configuration_orthogpt.py` fit it to transformers, which "
                  "runs them only with `trust_remote_code=True`. `generate()` decodes with the model's own cache, "
                  f"within {cfg.block_size} positions (past them, OrthoGPT's sample.py slides the window), one prompt "
                  "or prompts of one length at a time (the model takes no left padding); `labels=` gives the loss.", ""]
    lines += ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
              f"model = AutoModelForCausalLM.from_pretrained({str(folder)!r}{custom})"]
    if tokenizer:
        lines += [f"tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}{custom})",
                  "ids = tokenizer('ROMEO:', return_tensors='pt').input_ids",
                  "print(tokenizer.decode(model.generate(ids, max_new_tokens=20, do_sample=False)[0]))"]
    lines += ["```", "", "In OrthoGPT, `orthogpt.hf.from_pretrained(FOLDER)` reads it back as its GPT.", ""]
    if tokens == 'gpt2' and not tokenizer:
        lines += ["Its tokens are GPT-2's BPE (tiktoken's 'gpt2' encoding); the tokenizer's files were not in "
                  "tiktoken's cache when it was exported, so none are here.", ""]
    elif not tokens:
        lines += ["No tokenizer was exported with it: the token ids are those of its training data.", ""]
    if tokenizer:
        args = f"pretrained={folder}{custom.replace(' ', '')}"
        if tokens != 'gpt2':  # lm-eval needs a prefix token, BOS or EOS, which characters lack: the newline
            args += f",prefix_token_id={tokens.index(chr(10)) if chr(10) in tokens else 0}"
        lines += ["## Evaluation with lm-evaluation-harness", "", "```sh",
                  f"lm_eval --model hf --model_args {args} --tasks hellaswag --device cpu --batch_size 8", "```", ""]
    if run:
        lines += ["## Training run", "",
                  f"These are the weights at iteration {run['iter_num']}; the run's best val loss: "
                  f"{run['best_val_loss']:.4f}. Its config:", "", "```json", json.dumps(run['config'], indent=1),
                  "```", ""]
    return '\n'.join(lines)
