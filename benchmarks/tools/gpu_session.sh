#!/usr/bin/env bash
# The measurements owed to a lent GPU, in one script, run from the repository root on the GPU
# machine (docs/results/gpu.md lists what is owed, in order). Every part writes its result into
# the results record as at home (benchmarks/results/<subject>/<date>-<machine>-<name>/ and its
# report under docs/results/); after each part, what the call added there is packed into
# $OUT/results.tar.gz (default OUT=gpu-out; the parts bench, lm and cards, which are hasten
# bench's own runs, into $OUT/bench.tar.gz), so a call its time limit stops still brings back
# what finished. At home: unpack it at the repository root, then
# `python -m benchmarks.tools.results archive FOLDER` for each new folder.
#
# Data: the CIFAR-10 zip (about 60 MiB) does not fit beside the working tree in one 64 MiB
# transfer. At home `bash benchmarks/tools/gpu_session.sh pack` writes it as one solid tar.xz of
# about 18 MiB into .gpudata/ (benchmarks/tools/gpu_data.py), with the torchao wheel for the GPU
# machine's torch; carry .gpudata. `setup`, the first part there, rebuilds the zip (same
# members, order and bytes) and installs the carried wheels.
#
# Parts (each comparison runs its own peer seeds in its own folder; no peer run is copied):
#   muon      cifar10-fast-gpu against airbench94_muon as published (fp16 weights, max-autotune,
#             Newton-Schulz compiled, cudnn.benchmark, fused SGD), SEEDS (default 3) each
#   hive      cifar10-fast-gpu against the Hive's newest record (5cd49b1) compiled as published
#   gpuco     muon's pair with trainer.compile_optimizer=true on hasten's side
#   gpusb     muon's pair with cifar10-fast's selective backprop on hasten's side
#   profile   one steady-state step of each side under torch.profiler (PROFILE_MODES, default
#             "compile"; "graphs": hasten's side with CUDA graphs)
#   probe     patch whitening's fit in a fresh process, device cold or prepared
#   float8    a GPT in bf16 against float8 (tensorwise, rowwise); float8long: 1000 steps at 12 x 2048
#   bench     cifar10-fast, 5 seeds, segments ended by a device synchronisation
#   ddp, fsdp DDP at world size 1 against no wrapper; FSDP2 with a sharded checkpoint, resume, export
#   lm        nanoGPT's GPU Tiny Shakespeare configuration, 3 seeds
#   cards-a, cards-b   method cards on the cifar10-narrow 10-epoch proxy
# Caps: C_CAP (a comparison, default 300 s), PROFILE_CAP, FLOAT8_CAP. CALL (e.g. -7) names this
# call's result folders apart from earlier ones: a folder that exists is continued, not rerun.
#   bash benchmarks/tools/gpu_session.sh pack                          # at home
#   CALL=-7 C_CAP=280 bash benchmarks/tools/gpu_session.sh setup muon  # there
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
hasten() { python3 -m hasten.cli "$@"; }
W=$(mktemp -d)
touch "$W/start"
DATA=data.path=.data/cifar10-jpeg.zip
CALL=${CALL:-}
SEEDS=${SEEDS:-3}
if [ "${1:-}" != pack ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
fi
git rev-parse --short HEAD 2>/dev/null || cat .gpudata/COMMIT 2>/dev/null
TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -oiE 'h100|h200|a100|l40s|l4' | head -1 | tr A-Z a-z)
TAG=${TAG:-gpu}

vs_peer() {   # NAME RECIPE KIND: RECIPE against the peer KIND compiled as published, its own peer seeds
  timeout ${C_CAP:-300} python3 -m benchmarks.comparisons.cifar10_cpu_vs_peer --device cuda --peer "$3" \
    --data .data/cifar10-jpeg.zip --seeds $SEEDS --peer-seeds $SEEDS --recipe "$2" --name "$1"
}

for part in "$@"; do
  echo "== part $part at $(date -u +%H:%M:%S)"
  case $part in
  pack)   # at home: what the GPU machine needs beside the working tree, into .gpudata/
    mkdir -p .gpudata
    git rev-parse --short HEAD > .gpudata/COMMIT
    [ -f .gpudata/cifar.tar.xz ] || python3 -m benchmarks.tools.gpu_data pack .data/cifar10-jpeg.zip .gpudata/cifar.tar.xz
    ls .gpudata/torchao-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .gpudata torchao==0.17.0 \
      || echo "no torchao wheel fetched: float8 cannot run there"
    ls -la .gpudata
    continue
    ;;
  setup)  # there: the zip rebuilt from the carried tar.xz, the carried wheels installed
    [ -f .data/cifar10-jpeg.zip ] || python3 -m benchmarks.tools.gpu_data unpack .gpudata/cifar.tar.xz .data/cifar10-jpeg.zip
    ls -la .data
    if ls .gpudata/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpudata/*.whl \
        && export PYTHONPATH=$PYTHONPATH:/tmp/site
    fi
    python3 -c 'import torchao; print("torchao", torchao.__version__)' 2>&1 | tail -1
    ;;
  muon)   vs_peer cifar10-fast-gpu-vs-muon-published-$TAG$CALL cifar10-fast-gpu muon ;;
  hive)   vs_peer cifar10-fast-gpu-vs-hive-published-$TAG$CALL cifar10-fast-gpu hive ;;
  gpuco)  vs_peer cifar10-fast-gpu-compiled-optimizer-vs-muon-$TAG$CALL cifar10-fast-gpu+trainer.compile_optimizer=true muon ;;
  gpusb)  vs_peer cifar10-fast-gpu-sb-vs-muon-$TAG$CALL \
            cifar10-fast-gpu+algorithms.selective_backprop.keep=0.5+algorithms.selective_backprop.start=0.4dur muon ;;
  profile)
    for mode in ${PROFILE_MODES:-compile}; do
      flag=(--compile); [ $mode = graphs ] && flag=(--compile --compile-mode reduce-overhead)
      timeout ${PROFILE_CAP:-150} python3 -m benchmarks.comparisons.gpu_step_profile --data .data/cifar10-jpeg.zip \
        --device cuda "${flag[@]}" --name gpu-step-profile-$mode-$TAG$CALL | head -8
    done
    ;;
  probe)  timeout 90 python3 -m benchmarks.probes.whiten_fit_probe --device cuda --rounds 2 --name whiten-fit-probe-$TAG$CALL ;;
  float8) timeout ${FLOAT8_CAP:-170} python3 -m benchmarks.comparisons.float8_gpt --device cuda --sizes 24x1024,12x768 \
            --steps 60 --warmup 10 --name float8-gpt-$TAG$CALL ;;
  float8long) timeout ${FLOAT8_CAP:-420} python3 -m benchmarks.comparisons.float8_gpt --device cuda --sizes 12x2048 \
            --variants bf16,tensorwise --steps 1000 --warmup 10 --name float8-gpt-long-$TAG$CALL ;;
  bench)  hasten bench cifar10-fast $DATA --seeds 5 --target 'val/acc>=0.908' --out "$W/bench" --name cifar10-fast-cuda-synced-$TAG$CALL ;;
  ddp)    # the same run without a wrapper and under torchrun as DDP at world size 1, alternately
    for s in 0 1 2; do
      for mode in none ddp; do
        extra=(); [ $mode = ddp ] && extra=(--nproc 1 trainer.parallelism=ddp)   # auto would pick none at size 1
        echo "== ddp-check mode=$mode seed=$s"
        hasten train cifar10-fast $DATA trainer.seed=$s trainer.run_dir=$W/ddp-$mode-$s --no-progress "${extra[@]}" 2>&1 \
          | grep -E "done in|final|rank|parallel"
      done
    done
    ;;
  fsdp)   # FSDP2 at world size 1 on CUDA (NCCL), bf16 policy, sharded checkpoint, resume, whole export
    G="shakespeare-char-baseline trainer.parallelism=fsdp trainer.precision=bf16-mixed trainer.eval_interval=100ba"
    hasten train $G trainer.max_duration=200ba trainer.run_dir=$W/fsdp --no-progress --nproc 1 2>&1 | tail -4
    hasten train --resume "$W/fsdp" trainer.max_duration=400ba --force --no-progress --nproc 1 2>&1 | tail -4
    python3 - "$W/fsdp" <<'PY'
import glob, sys
import torch
from hasten.checkpoint.sharded import export_whole
d = sorted(glob.glob(sys.argv[1] + "/checkpoints/*.dcp"))[-1]
export_whole(d, sys.argv[1] + "/whole.pt")
p = torch.load(sys.argv[1] + "/whole.pt", weights_only=True)
print("export", d.rsplit("/", 1)[-1], "->", len(p["model"]), "tensors, loads with weights_only=True")
PY
    ;;
  lm)
    C=model.n_layer=6+model.n_head=6+model.n_embd=384+model.dropout=0.2+data.block_size=256+data.batch_size=64+trainer.precision=bf16-mixed+trainer.compile=true+trainer.eval_interval=250ba
    hasten bench shakespeare-char-baseline+$C+trainer.max_duration=5000ba --seeds 3 --cap 120 \
      --target 'val/loss<=1.47' --out "$W/bench" --name shakespeare-gpu-synced-$TAG$CALL
    ;;
  cards-a|cards-b)   # method cards on the cifar10-narrow 10-epoch proxy, 3 seeds, against the proxy itself
    N=cifar10-narrow
    if [ $part = cards-a ]; then
      M=($N+algorithms.cutmix.alpha=1.0 $N+algorithms.gradient_clipping.threshold=1.0 $N+algorithms.lookahead.k=5
         $N+algorithms.sam.rho=0.05 $N+algorithms.selective_backprop.keep=0.5 $N+algorithms.swa.start=0.75)
    else
      M=($N+algorithms.infobatch.prune_ratio=0.5 $N+algorithms.layer_freezing.start=0.5
         $N+algorithms.ghost_batchnorm.ghost_size=32)
    fi
    hasten bench $N "${M[@]}" trainer.max_duration=10ep trainer.eval_interval=5ep schedule.warmup=1ep $DATA \
      --target 'val/acc>=@first-worst' --seeds 3 --out "$W/bench" --name cards-vision-proxy-$TAG-${part#cards-}$CALL
    ;;
  *) echo "unknown part: $part (the parts are listed at the top of benchmarks/tools/gpu_session.sh)"; exit 2 ;;
  esac
  # what this call added to the results record, after every part
  find benchmarks/results docs/results -newer "$W/start" -type f -print0 2>/dev/null \
    | tar -czf "$OUT/results.tar.gz" --null -T - 2>/dev/null
  [ -d "$W/bench" ] && tar -czf "$OUT/bench.tar.gz" -C "$W" bench   # hasten bench's own folders (bench, lm, cards)
done
ls -la "$OUT"
