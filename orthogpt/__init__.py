"""What OrthoGPT's scripts (train.py, sample.py) and tools (tools/) share, one job per module.
Imports flow one way: model.py <- configure/ <- this package <- scripts and tools.

    errors       UserError (configure's, below the package), and the entry points' turning of it into `error: ...`
    files        the one atomic, fsync'd file write, and what a failed write says
    lock         one writer per folder: a lock the operating system frees when its holder dies
    progress     the one progress bar
    device       device and dtype choice, autocast
    parallel     this process among torchrun's: DDP or FSDP, gradient synchronisation, the lock on rank 0, what
                 every process agrees on, a lost process or machine as one line
    regional     a model compiled a block at a time: one graph that every block reuses, for training and decoding
    optim        AdamW and Muon, their parameter groups, the learning-rate schedule, one step, non-finite steps
    run          a run's state in one object (config, model, optimizer, counters) and its setup and checkpoint
    signals      Ctrl-C and SIGTERM as a request to stop at the next step; SIGTERM when the launcher dies
    rng          every random generator's state, for exact resumption
    checkpoint   checkpoint files: atomic, checksummed (and their sharded folders), versioned; the newest that verifies
    sharded      FSDP's checkpoints: torch.distributed.checkpoint folders
    resume       what a resumed run may change
    chars        character-level text (Tiny Shakespeare): preparation
    bpe          GPT-2's byte-pair encoding through tiktoken, or one line that says how to get its files
    shards       GPT-2 token shards in llm.c's format
    hub          the Hugging Face hub, reachable or not: offline, its libraries read their caches at once
    windows      token files found and read as random windows
    images       image datasets on the device, and their augmentation
    tasks        what the loop trains on: a GPT on token windows, or a ViT on images
    estimate     how long a CPU run will take, from timed steps
    flops        FLOPs per token of a training step, every rule's extra work counted
    scaling      loss against compute: the fit L(C) = E + A C^-alpha and a rule's compute multiplier
    sweep        the experiment engine of tools/compare.py and tools/miniseries.py: a comparison planned, run, read back
    planning     a comparison's runs: configs x settings x seeds, each a train.py argv in the folder named for it
    launcher     a plan's runs as train.py processes, a few at a time, watched, stopped by a signal with a checkpoint
    compile_choice  whether a comparison's runs compile: each model timed eager and compiled, the break-even
    slurm        a plan's runs as Slurm jobs of tools/slurm/train.sbatch: submitted once, watched through squeue
    stats        a comparison's numbers: mean ± std, paired differences ± standard error, the speedup protocol
    results      a comparison's results.md
    series       a scaling series read back through its plan, and its fits and compute multipliers
    logs         a run's log.jsonl (and Weights & Biases): written, read, damaged lines dropped
    plots        validation curves of runs in one figure
    diagnostics  measurements of the residual stream: gradient norms, update statistics, gains across depth
    ablations    one mechanism of a trained model switched off in place, at evaluation (tools/ablate.py)
    maps         the orthogonal Q/K/V maps computed once, in one batched call, for many forwards
    decoding     text generation: the window, the one-token step (eager or compiled once), a sampler with no host sync
    hf           the Hugging Face format: pretrained weights into a run, a run out to a folder that transformers loads
                 (remote_code/: the files an export copies beside model.py)
    hc_kernels   fused Triton kernels of the wide streams' two passes, registered here as model's hc_kernels='triton'
"""

try:  # registers hc_kernels='triton' (and 'auto' on CUDA) with model.py
    from orthogpt import hc_kernels  # noqa: F401
except ImportError:  # no triton here (it ships for Linux): the rules' own PyTorch
    pass
