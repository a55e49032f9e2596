"""This process among torchrun's: its rank, device and dtype; the run's lock, held by rank 0; the
model wrapped for DDP or sharded by FSDP2; how a micro-step synchronises gradients; what every
process must agree on (a verdict of rank 0's, a check that each makes for itself); a lost process
or machine as one line; and the end of the process group."""

import os
import re
import socket
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parametrize

from orthogpt.maps import maps_held
from orthogpt.regional import compiled_blocks
from orthogpt.device import autocast, resolve_device, resolve_dtype
from orthogpt.errors import UserError, one_line
from orthogpt.signals import stop_with_parent

# torchrun's agents share one rendezvous store with their workers by default, and a restarted group can read the dead
# group's addresses from it (pytorch/pytorch#135712): its gloo or NCCL setup then fails or hangs
SHARED_STORE = 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE'


@dataclass
class Env:
    """Where this process runs: its rank among `world` processes, device, dtype and autocast."""
    rank: int
    local_rank: int
    world: int
    ddp: bool  # launched by torchrun: a process group, gradients synchronised
    fsdp: bool  # parameters sharded over it (parallel='fsdp')
    device: str
    dtype: str
    autocast: Any

    @property
    def master(self):
        return self.rank == 0

    @property
    def device_type(self):
        return self.device.split(':')[0]


def setup(cfg):
    """This process's Env: joins torchrun's process group, picks device and dtype."""
    device = resolve_device(cfg.device)
    rank, local_rank, world = 0, 0, 1
    ddp = 'RANK' in os.environ  # set by torchrun
    fsdp = cfg.parallel == 'fsdp'
    if fsdp and not ddp:
        raise UserError("parallel='fsdp' shards the model over torchrun's processes: launch with torchrun "
                        "(--nproc_per_node=1 for one process)")
    device_type = device.split(':')[0]
    dtype = resolve_dtype(cfg.dtype, device_type)
    if fsdp and cfg.dynamics:
        raise UserError("dynamics=True measures the stream with a forward of rank 0 alone, which FSDP's sharded "
                        "model cannot run: use parallel='ddp' for it")
    if fsdp and cfg.optimizer == 'muon':
        raise UserError("optimizer='muon' orthogonalises whole matrices, which parallel='fsdp' shards: use "
                        "parallel='ddp'")
    if fsdp and dtype == 'float16':
        raise UserError("parallel='fsdp' computes in bfloat16 or float32 here (float16 would need a sharded loss "
                        "scaler): use --dtype=bfloat16")
    if ddp:
        restartable_store()
        stop_with_parent()  # torchrun's agent: if it is killed, stop (and save) rather than train on as an orphan
        rank, local_rank, world = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'))
        if cfg.gradient_accumulation_steps % world:
            raise UserError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} is not divisible by the "
                            f"{world} processes; use a multiple of {world}")
        if device_type == 'cuda':
            device = f'cuda:{local_rank}'
            torch.cuda.set_device(device)
        dist.init_process_group('nccl' if device_type == 'cuda' else 'gloo', timeout=timedelta(seconds=cfg.dist_timeout))
    if device_type == 'cuda' and dtype == 'float32':  # else TF32 would only blur the orthogonal Q/K/V maps
        torch.set_float32_matmul_precision('high')
    if cfg.deterministic:
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    return Env(rank, local_rank, world, ddp, fsdp, device, dtype, autocast(device_type, dtype))


def restartable_store():
    """A UserError where torchrun may restart its workers (--max-restarts) into the rendezvous store it shares
    with them: a restart would read the dead workers' addresses and fail or hang (SHARED_STORE)."""
    if os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True' and int(os.environ.get('TORCHELASTIC_MAX_RESTARTS', 0)):
        raise UserError(f"torchrun --max-restarts restarts the workers into the rendezvous store they share with it, "
                        f"where the dead workers' addresses remain, and the restart fails or hangs "
                        f"(pytorch/pytorch#135712): give torchrun its own store per restart with {SHARED_STORE}=1 in its "
                        f"environment, `{SHARED_STORE}=1 torchrun ...` (docs/cluster.md)")


def master_holds(env, acquire):
    """What acquire() returns (the run's lock on out_dir) on rank 0, which writes for all; a context
    that holds nothing on the others. Under torchrun every process learns whether rank 0 got it,
    and all raise its UserError together if not; then every process checks that it sees rank 0's
    lock file, which a folder that is not shared between the machines lacks (shared_folder)."""
    held = nullcontext()

    def take():
        nonlocal held
        held = acquire()
        return held.path
    path = decided(env, take)
    try:
        if env.ddp:
            every_rank(env, lambda: shared_folder(path))
    except UserError:
        if env.master:
            held.release()
        raise
    return held


def decided(env, decide):
    """What decide() returns on rank 0, learnt by every process under torchrun; a UserError that it
    raises, raised by every process."""
    result, error = None, None
    if env.master:
        try:
            result = decide()
        except UserError as e:
            error = str(e)
    if env.ddp:
        box = [(result, error)]
        dist.broadcast_object_list(box, src=0)
        result, error = box[0]
        if error:
            dist.barrier()  # as in verdict: the broadcast's buffers freed before the process group is torn down
    if error:
        raise UserError(error)
    return result


SHARED_WAIT = 10  # seconds a process looks for rank 0's lock file: a network file system may show a new file late


def shared_folder(lock_path):
    """A UserError where this process does not see the lock file that rank 0 holds at lock_path:
    out_dir lies on a disk of rank 0's machine alone, and this machine's checkpoints would go astray."""
    deadline = time.monotonic() + SHARED_WAIT
    while not os.path.exists(lock_path):
        if time.monotonic() > deadline:
            folder = os.path.dirname(lock_path)
            raise UserError(f"{folder} is not the folder that rank 0 writes: its lock file {lock_path} is missing "
                            f"here. out_dir must lie on a file system that every machine of the run shares, at the "
                            f"same path (docs/cluster.md)")
        time.sleep(0.5)


def every_rank(env, check):
    """check() in every process; where it raises a UserError in any of them, every process raises
    one, naming the process and its machine where not all failed, rather than the others going on into
    a collective that the failed ones never reach. What check() returned, in this process."""
    error, result = None, None
    try:
        result = check()
    except UserError as e:
        error = str(e)
    if not env.ddp:
        if error:
            raise UserError(error)
        return result
    found = [None] * env.world
    dist.all_gather_object(found, error and (env.rank, socket.gethostname(), error))
    failed = [f for f in found if f]
    if failed:
        dist.barrier()  # as in verdict: the gather's buffers freed before the process group is torn down
        rank, host, text = failed[0]
        raise UserError(text if len(failed) == env.world else f"on {host} (rank {rank} of {env.world}): {text}")
    return result


def lost(error):
    """Whether an exception is a collective's failure: another process of the run gone (killed,
    its machine lost) or silent past the process group's timeout (gloo's RuntimeError, NCCL's DistError)."""
    return isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and 'gloo' in str(error).lower())


@contextmanager
def peers_lost(cfg):
    """A process's end when another process of the run is lost, as one line that says what is
    kept and how to continue, rather than the backend's traceback."""
    try:
        yield
    except RuntimeError as e:
        if 'RANK' not in os.environ or not lost(e):
            raise
        why = one_line(re.sub(r'^(\[[^\]]*\]\s*)+', '', str(e).strip()), limit=120)
        raise UserError(f"this process lost the run's other processes ({why}): one of them, or its machine, ended, "
                        f"or sent nothing for dist_timeout={cfg.dist_timeout:g} s. The checkpoints in "
                        f"{cfg.out_dir} are kept as they were; the same command with --init_from=auto continues "
                        f"from the newest") from None


def verdict(message, ddp):
    """Rank 0 decides, the others learn it: rank 0's message (the text of an error that is to end
    the run, or None), received by every process when ddp (under torchrun)."""
    if ddp:
        box = [message]
        dist.broadcast_object_list(box, src=0)
        message = box[0]
        if message:
            # gloo's worker thread frees the broadcast's tensors under the GIL: a process group torn
            # down before it has (the error that follows ends the run) can wait for it forever
            dist.barrier()
    return message


def teardown(env):
    """Leave the process group. After a clean end every process waits for the others first, so
    that none tears down while rank 0 still writes its last checkpoint."""
    if env.ddp:
        if sys.exc_info()[0] is None:
            dist.barrier()
        dist.destroy_process_group()


def parallelize(model, cfg, env):
    """The model to train, wrapped. FSDP2 shards every block and then the whole model over the process
    group (fully_shard), casting parameters to env's dtype for compute (the raw W of a Q/K/V map
    stays float32; autocast runs as without FSDP) and reducing gradients in float32; DDP keeps a
    replica per process. torch.compile (cfg.compile; default: on CUDA; a block at a time, regional.compiled_blocks, but under
    FSDP) comes between. fully_shard
    shards `model` itself: an optimizer built on it afterwards holds the shards. A rule that reads across depth
    (ResidualUpdate.depth) sends gradients into a block's inner tensors from later blocks, past the block's outputs
    where FSDP gathers its weights for backward: its blocks are sharded with the whole model, as one group."""
    if env.fsdp:
        # loaded here: its import (DTensor's with it) adds about a second to the start of every other process
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, env.dtype), reduce_dtype=torch.float32)
        whole = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        for block in model.blocks:
            if parametrize.is_parametrized(block.attn.c_attn):  # the Q/K/V map reads its raw W in float32
                fully_shard(block.attn.c_attn, mp_policy=whole)
            if not block.update_attn.depth:
                fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    if cfg.compile if cfg.compile is not None else env.device_type == 'cuda':
        # under FSDP, whole: a view of the sharded model's blocks, compiled, is untried
        model = compiled_blocks(model) if cfg.compile_scope == 'blocks' and not env.fsdp else torch.compile(model)
    if env.ddp and not env.fsdp:
        model = DDP(model, device_ids=[env.local_rank] if env.device_type == 'cuda' else None)
    return model


def unwrapped(model):
    """The model inside a DDP wrapper (compiled or not), or the model itself."""
    return model.module if isinstance(model, DDP) else model


def maps_of(model, env, grad=False):
    """model.maps_held, except under FSDP, where each layer's raw W is whole only inside its own
    forward, which computes its map there (yields {} then)."""
    return nullcontext({}) if env is not None and env.fsdp else maps_held(model, grad=grad)


def synchronising(model, env, last):
    """A micro-step's context: gradients reduced across processes on the last micro-step only."""
    if env is not None and env.fsdp:
        model.set_requires_gradient_sync(last)
    return model.no_sync() if env is not None and env.ddp and not env.fsdp and not last else nullcontext()


def fingerprint(model):
    """Each parameter's sum in float64, of this process's shard under FSDP: equal across DDP replicas."""
    return torch.stack([(p.to_local() if hasattr(p, 'to_local') else p).detach().double().sum()  # a DTensor's
                        for p in model.parameters()]).cpu()


def local_norms(norms):
    """Gradient norms of FSDP's shards (a DTensor of partial norms) reduced to whole ones."""
    return norms.full_tensor() if hasattr(norms, 'full_tensor') else norms  # a DTensor's
