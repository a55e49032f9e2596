import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def tiny_text(n_lines=400):
    """A small deterministic corpus with enough structure for a tiny model to learn."""
    words = ['to', 'be', 'or', 'not', 'the', 'king', 'queen', 'my', 'lord', 'shall', 'we', 'go', 'now']
    g = torch.Generator().manual_seed(1)
    lines = []
    for i in range(n_lines):
        ids = torch.randint(len(words), (6,), generator=g).tolist()
        speaker = 'ROMEO' if i % 2 else 'JULIET'
        lines.append(f"{speaker}:\n{' '.join(words[j] for j in ids).capitalize()}.\n")
    return '\n'.join(lines)


@pytest.fixture
def char_data(tmp_path):
    """A data folder holding only input.txt: train.py prepares it on first use."""
    folder = tmp_path / 'data'
    folder.mkdir()
    (folder / 'input.txt').write_text(tiny_text(), encoding='utf-8')
    return folder
