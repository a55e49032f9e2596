"""Every random generator a run draws from, saved and restored: what makes a resume exact."""

import random

import numpy as np
import torch


def rng_state(device_type):
    """This process's torch, CUDA, numpy and Python RNG states as checkpoint-safe data."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {'torch': torch.get_rng_state(), 'python': random.getstate(),
             'numpy': [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]}
    if device_type == 'cuda':
        state['cuda'] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state):
    torch.set_rng_state(state['torch'])
    random.setstate(state['python'])
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state['cuda'])


def seed_all(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
