#!/usr/bin/env bash
# Which advice helps a CPU run on a busy machine: the CPU recipe (rotation, 40 iterations) with
# 2 threads (torch's default on 2 cores), with 1 thread, and as 2 DDP processes of 1 thread each,
# with no hog of ours (other people's jobs ran: the VM was not idle) and beside 1 and 2 CPU hogs
# (each a one-thread torch matmul loop), in 2
# interleaved rounds. Prints one line per run: round, hogs, variant, wall s, median ms/iter, whether
# train.py printed its busy-machine note, the load average at the run's end. Run from the repository's
# root, its venv active: bash docs/logs/busy_cpu/measure.sh > results.txt (docs/performance.md,
# "Advice for CPU users").
cd "$(git rev-parse --show-toplevel)" && mkdir -p /tmp/busy
ARGS=(config/shakespeare_rot.py config/cpu.py --max_iters=40 --eval_interval=1000 --eval_iters=5 --log_interval=5)
hogs=()
start_hogs() { for ((i = 0; i < $1; i++)); do
  python -c "import torch; torch.set_num_threads(1); a = torch.randn(256, 256)
while True: a @ a" & hogs+=($!); done; sleep 3; }
stop_hogs() { for p in "${hogs[@]}"; do kill "$p"; wait "$p" 2>/dev/null; done; hogs=(); }
trap stop_hogs EXIT
run() {  # variant
  out=/tmp/busy/out-$1; rm -rf "$out"
  case $1 in
    t2) cmd=(python train.py "${ARGS[@]}" --out_dir=$out) ;;
    t1) cmd=(env OMP_NUM_THREADS=1 python train.py "${ARGS[@]}" --out_dir=$out) ;;
    ddp) cmd=(torchrun --standalone --nproc_per_node=2 train.py "${ARGS[@]}" --batch_size=6 --gradient_accumulation_steps=2 --out_dir=$out) ;;
  esac
  t0=$(date +%s.%N); "${cmd[@]}" > /tmp/busy/log-$1.txt 2>&1; t1=$(date +%s.%N)
  ms=$(grep -o 'median [0-9.]* ms/iter' /tmp/busy/log-$1.txt | grep -o '[0-9.]*')
  note=$(grep -c 'machine is busy' /tmp/busy/log-$1.txt)
  echo "round=$2 hogs=$3 variant=$1 wall=$(echo "$t1 - $t0" | bc) median_ms=$ms busy_note=$note load=$(cut -d' ' -f1 /proc/loadavg)"
}
for round in 1 2; do
  for h in 0 1 2; do
    start_hogs $h
    for v in t2 t1 ddp; do run $v $round $h; done
    stop_hogs
  done
done
