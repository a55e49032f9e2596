"""FSDP's checkpoints: each process's shards of the model and optimizer state in one
ckpt-<iter>.dcp folder (torch.distributed.checkpoint), readable on any number of processes."""

import glob
import os
import shutil
import warnings

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from orthogpt.files import fsync_dir, write_error


def save(model, optimizer, out_dir, iter_num, master, group=None):
    """Every process's shards of the model and optimizer state, written together into
    out_dir/ckpt-<iter>.dcp; returns (the folder's name, written). They go to a temporary folder
    first, which rank 0 renames once all are written (dcp.save's last step is collective): a reader
    finds a whole folder or none. With `group` (a process group of the checkpoints' own) the shards
    are copied to memory here and written by a thread of torch.distributed.checkpoint's
    (dcp.async_save, coordinating on `group` while training goes on over the default group);
    written() waits for them, then renames. A write that fails on any process (a full disk, say)
    raises a UserError from written() on all of them, the temporary folder removed."""
    name = f'ckpt-{iter_num:07d}.dcp'
    folder, tmp = os.path.join(out_dir, name), os.path.join(out_dir, name + '.tmp')
    model_state, optim_state = get_state_dict(model, list(optimizer))
    state = {'model': model_state, 'optimizer': optim_state}
    failed = None
    if group is None:
        try:
            dcp.save(state, checkpoint_id=tmp)
        except CheckpointException as e:  # raised on every process, with each failed process's error
            failed = e
    else:
        pending = dcp.async_save(state, checkpoint_id=tmp, process_group=group)

    def written():
        error = failed
        if group is not None:
            try:
                getattr(pending, 'upload_completion', pending).result()
            except CheckpointException as e:
                error = e
        if error is not None:
            if master:
                shutil.rmtree(tmp, ignore_errors=True)
            raise write_error(folder, next(iter(error.failures.values()))[0], "the checkpoints saved before are kept "
                              "as they were, the partial folder removed") from None
        if master:
            if os.path.exists(folder):  # saved at this iteration before (an evaluation cut short, then resumed)
                shutil.rmtree(folder)
            os.replace(tmp, folder)
            fsync_dir(out_dir)
    return name, written


def load(model, optimizer, folder):
    """Load a ckpt-<iter>.dcp folder into model (sharded over any number of processes, or whole)
    and, unless None, its optimizer."""
    model_state, optim_state = get_state_dict(model, list(optimizer or []))
    state = {'model': model_state, **({'optimizer': optim_state} if optimizer else {})}
    with warnings.catch_warnings():  # that one process loads the shards of several is what is meant here
        warnings.filterwarnings('ignore', message='torch.distributed is disabled')
        dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, list(optimizer or []), model_state_dict=state['model'],
                   optim_state_dict=state.get('optimizer', {}))
    if optimizer:
        optimizer.keep_base_lr()


def prune(out_dir, keep):
    """Delete the ckpt-<iter>.dcp folders of out_dir not named in `keep` (with the .tmp of a save
    that was cut short)."""
    for folder in glob.glob(os.path.join(out_dir, 'ckpt-[0-9]*.dcp*')):
        if os.path.basename(folder) not in keep:
            shutil.rmtree(folder)
