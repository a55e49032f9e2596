"""EleutherAI's lm-evaluation-harness on an exported model, offline: the command of the model card, run as a user
runs it, on a tiny model of a rule transformers does not know and a tiny file of HellaSwag's format that the test
writes, read through tools/lm_eval_tasks/hellaswag_local.yaml; then its scores against tools/eval_hellaswag.py's on
the same examples. Skipped where lm-eval (with its hf extra: pip install 'lm-eval[hf]') is not installed."""

import glob
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig
from orthogpt import hf
from tools import eval_hellaswag

pytest.importorskip('lm_eval')
pytest.importorskip('accelerate', reason="lm-eval's hf model needs its hf extra: pip install 'lm-eval[hf]'")

# endings of one character beside endings of twenty: lm-eval's acc_norm and eval_hellaswag.py's weigh them apart
ROWS = [dict(ctx='A man kicks the ball and', label=0,
             endings=['it rolls away.', 'he smiles.', 'the crowd cheers loudly.', 'no.']),
        dict(ctx='She opens the door', label=1, endings=['a', 'and walks into the garden.', 'slowly.', 'to the sea']),
        dict(ctx='The dog runs', label=3, endings=['far away from home.', 'b', 'home', 'after the cat in the yard.']),
        dict(ctx='He reads a book', label=2, endings=['then sleeps.', 'in bed.', 'c', 'about the sea and the stars.']),
        dict(ctx='It rains and', label=0, endings=['we stay in.', 'd', 'the roads are wet and slow.', 'it stops.'])]


def test_the_model_cards_lm_eval_command_scores_the_model_offline_as_eval_hellaswag_does(tmp_path, root):
    itos = sorted(set(''.join(r['ctx'] + ' ' + ' '.join(r['endings']) for r in ROWS)))
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=len(itos), residual='mhc')).eval()
    hf.export(model, tmp_path / 'model', tokens=itos)
    (tmp_path / 'hellaswag_val.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in ROWS))
    card = (tmp_path / 'model' / 'README.md').read_text()
    command = next(line for line in card.splitlines() if line.startswith('lm_eval ')).split()
    command[command.index('--tasks') + 1] = 'hellaswag_local'  # the local file, not the hub's Rowan/hellaswag
    command += ['--include_path', os.path.join(root, 'tools', 'lm_eval_tasks'), '--output_path', 'out', '--log_samples']
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}  # no OrthoGPT: the folder carries its code
    env.update(HF_HUB_OFFLINE='1', HF_DATASETS_OFFLINE='1', HF_DATASETS_CACHE=str(tmp_path / 'datasets'),
               OMP_NUM_THREADS='1')
    done = subprocess.run([sys.executable, '-m', *command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    [results] = glob.glob(str(tmp_path / 'out' / '*' / 'results_*.json'))
    [samples] = glob.glob(str(tmp_path / 'out' / '*' / 'samples_hellaswag_local_*.jsonl'))
    with open(results) as f:
        scores = json.load(f)['results']['hellaswag_local']
    with open(samples) as f:
        logged = sorted((json.loads(line) for line in f), key=lambda s: s['doc_id'])
    lls = torch.tensor([[float(r[0]) for r in s['filtered_resps']] for s in logged])  # (examples, endings)

    encode = lambda s: [itos.index(c) for c in s]  # noqa: E731
    totals = torch.zeros(len(ROWS), 4)  # each ending's cross-entropy after its context, by the GPT itself
    for i, r in enumerate(ROWS):
        for j, ending in enumerate(r['endings']):
            ctx, end = encode(r['ctx']), encode(' ' + ending)
            with torch.no_grad():
                logits, _ = model(torch.tensor([ctx + end[:-1]]))
            totals[i, j] = F.cross_entropy(logits[0, -len(end):], torch.tensor(end), reduction='sum')
    torch.testing.assert_close(lls, -totals, rtol=0, atol=1e-4)  # the same log-likelihoods through transformers

    labels = torch.tensor([r['label'] for r in ROWS])
    chars = torch.tensor([[len(e) for e in r['endings']] for r in ROWS])
    preds = torch.tensor(eval_hellaswag.score(model, ROWS, encode, 'cpu'))  # (pred, pred_norm) per example
    # acc is the same; acc_norm divides the total by the ending's characters in lm-eval (the space before it not
    # counted), by its tokens in eval_hellaswag.py: here the characters and the space
    assert preds[:, 0].tolist() == totals.argmin(1).tolist()
    assert scores['acc,none'] == pytest.approx((preds[:, 0] == labels).float().mean().item())
    assert scores['acc_norm,none'] == pytest.approx((totals / chars).argmin(1).eq(labels).float().mean().item())
    assert preds[:, 1].tolist() == (totals / (chars + 1)).argmin(1).tolist()
