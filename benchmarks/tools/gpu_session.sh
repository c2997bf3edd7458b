#!/usr/bin/env bash
# The GPU measurements of a lent GPU, in one script (benchmarks/results/gpu/README.md quotes
# them): run from the repository root on the GPU machine with the CIFAR-10 zip at
# .data/cifar10-jpeg.zip; results go to $OUT (default gpu-out/). Parts: `bench` (cifar10-fast,
# 5 seeds, segments ended by a device synchronisation), `ddp` (DDP at world size 1 against no
# wrapper, interleaved, 3 seeds), `fsdp` (FSDP2 on CUDA: NCCL, the bf16 policy, a sharded DCP
# checkpoint, a resume and the whole export), `lm` (nanoGPT's GPU Tiny Shakespeare config),
# `cards-a`, `cards-b` (method cards on the cifar10-narrow proxy), `peer` (compiled cifar10-fast
# against the compiled airbench94_muon peer, 3 seeds each), `eager` (uncompiled cifar10-fast
# against the same peer runs), `peer8` (8 epochs, no resizing, against them), `peer8c` and `peer9c`
# (compiled: the peer's procedure with all six test views; 9 epochs without resizing), `peer8g` (peer8c
# with CUDA graphs), `gpu` (the packaged cifar10-fast-gpu recipe against them; SEEDS=5 for 5 a side), `gpuco` (the same with
# trainer.compile_optimizer=true), `hive` (cifar10-fast-gpu against the compiled Hive peer, benchmarks/peers/hive_cifar10.py,
# its own peer runs), `graphs`
# (compiled with CUDA graphs: trainer.compile_mode=reduce-overhead), `muonloop` (compiled, Muon's
# kernels stepped one at a time: the comparison for optimizer.muon.foreach's default), `probe`
# (patch whitening's fit, device cold or prepared), `profile` (one step of each side under
# torch.profiler: host and device time, kernels; benchmarks/gpu_step_profile.py), `float8` (a GPT in bf16 against float8, benchmarks/float8_gpt.py), `float8long` (the same at
# 12 x 2048, bf16 against tensorwise, 1000 steps).
#   bash benchmarks/gpu_session.sh bench ddp fsdp
# The CIFAR zip (about 60 MiB) does not fit beside the working tree in a 64 MiB transfer: on the
# home machine `bash benchmarks/gpu_session.sh pack` writes it as one solid tar.xz of about
# 18 MiB into .gpudata/ (benchmarks/gpu_data.py) with the torchao wheel for the GPU machine's
# torch; carry .gpudata; `setup`, the first part there, rebuilds the zip (same members, order
# and bytes) and installs the carried wheels.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
hasten() { python3 -m hasten.cli "$@"; }
W=$(mktemp -d)
DATA=data.path=.data/cifar10-jpeg.zip
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
git rev-parse --short HEAD 2>/dev/null || cat .gpudata/COMMIT 2>/dev/null
TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -oiE 'h100|h200|a100|l40s|l4' | head -1 | tr A-Z a-z)
TAG=${TAG:-gpu}
# CALL names this call's result folders apart from committed ones (a folder that exists is
# continued, not rerun: `CALL=-2 bash ... peer` measures afresh). PROFILE_MODES picks the
# profile part's modes (default "compile eager"; "graphs": hasten's side with CUDA graphs).
CALL=${CALL:-}
# The comparison whose peer runs the others reuse; PEER_RUN names another (a part of that name then
# runs the peer afresh, then its own recipe, in the same call: PEER_RUN=cifar10-fast-gpu-vs-muon-h200-5 ... gpu gpuco).
PEER=${PEER_RUN:-cifar10-fast-compiled-vs-muon-$TAG$CALL}

vs_peer() {   # NAME RECIPE CAP [KIND]: RECIPE against the compiled peer KIND (default muon: its runs copied
              # from $PEER, not rerun; another kind runs its own peer seeds in NAME's folder)
  if [ "${4:-muon}" = muon ] && [ "$1" != "$PEER" ]; then
    mkdir -p benchmarks/results/bench/$1; cp benchmarks/results/bench/$PEER/peer.jsonl benchmarks/results/bench/$1/ 2>/dev/null
  fi
  timeout $3 python3 benchmarks/cifar10_cpu_vs_peer.py --device cuda --peer ${4:-muon} --data .data/cifar10-jpeg.zip \
    --seeds ${SEEDS:-3} --peer-seeds ${SEEDS:-3} --recipe "$2" --name $1
  mkdir -p "$W/results"; cp -r benchmarks/results/bench/$1 benchmarks/results/$1.* "$W/results/" 2>/dev/null
}

for part in "$@"; do
  echo "== part $part at $(date -u +%H:%M:%S)"
  case $part in
  pack)   # on the home machine: what the GPU machine needs beside the working tree, into .gpudata/
    mkdir -p .gpudata
    git rev-parse --short HEAD > .gpudata/COMMIT
    [ -f .gpudata/cifar.tar.xz ] || python3 benchmarks/gpu_data.py pack .data/cifar10-jpeg.zip .gpudata/cifar.tar.xz
    ls .gpudata/torchao-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .gpudata torchao==0.17.0 \
      || echo "no torchao wheel fetched: float8 cannot run there"
    ls -la .gpudata
    continue
    ;;
  setup)  # on the GPU machine: the zip rebuilt from the carried tar.xz, the carried wheels installed
    [ -f .data/cifar10-jpeg.zip ] || python3 benchmarks/gpu_data.py unpack .gpudata/cifar.tar.xz .data/cifar10-jpeg.zip
    ls -la .data
    if ls .gpudata/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpudata/*.whl \
        && export PYTHONPATH=$PYTHONPATH:/tmp/site
    fi
    python3 -c 'import torchao; print("torchao", torchao.__version__)' 2>&1 | tail -1
    ;;
  peer)   # compiled cifar10-fast against the compiled airbench94_muon peer, 3 seeds each
    vs_peer $PEER cifar10-fast+trainer.compile=true ${PEER_CAP:-300}
    ;;
  eager)  # uncompiled cifar10-fast against the same peer runs
    vs_peer cifar10-fast-eager-vs-muon-$TAG$CALL cifar10-fast ${EAGER_CAP:-90}
    ;;
  peer8)  # the GPU candidate: cifar10-fast for 8 epochs without progressive resizing, eager, against the same peer runs
    vs_peer cifar10-fast-8ep-vs-muon-$TAG$CALL cifar10-fast+trainer.max_duration=8ep+algorithms.progressive_resizing=null+algorithms.selective_backprop=null ${EAGER_CAP:-90}
    ;;
  peer8c) # the peer's own procedure in hasten, compiled: 8 epochs, 32 px throughout, all six views at test
    vs_peer cifar10-fast-8ep-fulltta-compiled-vs-muon-$TAG$CALL \
      cifar10-fast+trainer.max_duration=8ep+algorithms.progressive_resizing=null+algorithms.selective_backprop=null+algorithms.tta.fraction=1.0+trainer.compile=true ${C_CAP:-150}
    ;;
  peer8g) # the peer's own procedure in hasten, compiled with CUDA graphs (the step of peer8c without its host wait)
    vs_peer cifar10-fast-8ep-fulltta-graphs-vs-muon-$TAG$CALL \
      cifar10-fast+trainer.max_duration=8ep+algorithms.progressive_resizing=null+algorithms.selective_backprop=null+algorithms.tta.fraction=1.0+trainer.compile=true+trainer.compile_mode=reduce-overhead ${C_CAP:-150}
    ;;
  gpu)    # the packaged GPU speedrun recipe (cifar10-fast-gpu: the peer's procedure in hasten, CUDA graphs)
    vs_peer cifar10-fast-gpu-vs-muon-$TAG$CALL cifar10-fast-gpu ${C_CAP:-200}
    ;;
  gpusb)  # the GPU recipe with cifar10-fast's selective backprop (keep 0.5 from 40% of the run): does it pay on a GPU?
    vs_peer cifar10-fast-gpu-sb-vs-muon-$TAG$CALL \
      cifar10-fast-gpu+algorithms.selective_backprop.keep=0.5+algorithms.selective_backprop.start=0.4dur ${C_CAP:-200}
    ;;
  hive)   # the packaged GPU recipe against the Hive's 2025 record procedure (hasten's rendering), compiled, its own peer runs
    vs_peer cifar10-fast-gpu-vs-hive-$TAG$CALL cifar10-fast-gpu ${C_CAP:-300} hive
    ;;
  gpuco)  # the same with its optimizers' steps compiled (trainer.compile_optimizer: learning rates as tensors)
    vs_peer cifar10-fast-gpu-compiled-optimizer-vs-muon-$TAG$CALL cifar10-fast-gpu+trainer.compile_optimizer=true ${C_CAP:-200}
    ;;
  graphs) # compiled with CUDA graphs (trainer.compile_mode=reduce-overhead) against the same peer runs
    vs_peer cifar10-fast-graphs-vs-muon-$TAG$CALL cifar10-fast+trainer.compile=true+trainer.compile_mode=reduce-overhead ${C_CAP:-150}
    ;;
  muonloop) # compiled, Muon stepping its kernels one at a time (optimizer.muon.foreach=false; on CUDA the default batches them)
    vs_peer cifar10-fast-muonloop-vs-muon-$TAG$CALL cifar10-fast+trainer.compile=true+optimizer.muon.foreach=false ${C_CAP:-150}
    ;;
  peer9c) # compiled, 9 epochs at 32 px throughout (resizing saves nothing on a GPU), the recipe's TTA
    vs_peer cifar10-fast-9ep-noresize-compiled-vs-muon-$TAG$CALL \
      cifar10-fast+algorithms.progressive_resizing=null+algorithms.selective_backprop=null+trainer.compile=true ${C_CAP:-150}
    ;;
  profile) # one steady-state step of hasten's cifar10-fast against the peer's, compiled and eager (torch.profiler)
    for mode in ${PROFILE_MODES:-compile eager}; do
      flag=(); [ $mode = compile ] && flag=(--compile)
      [ $mode = graphs ] && flag=(--compile --compile-mode reduce-overhead)   # hasten's side with CUDA graphs
      timeout ${PROFILE_CAP:-150} python3 benchmarks/gpu_step_profile.py --data .data/cifar10-jpeg.zip --device cuda \
        "${flag[@]}" --name gpu_step_profile-$mode-$TAG$CALL | head -8
      mkdir -p "$W/results"; cp benchmarks/results/gpu_step_profile-$mode-$TAG$CALL.* "$W/results/" 2>/dev/null
    done
    ;;
  probe)  # patch whitening's fit in a fresh process, device cold or prepared (hasten.runtime.prepare_device)
    (cd benchmarks && timeout 90 python3 whiten_fit_probe.py --device cuda --rounds 2 --name whiten_fit_probe-$TAG$CALL)
    mkdir -p "$W/results"; cp benchmarks/results/whiten_fit_probe-$TAG$CALL.* "$W/results/" 2>/dev/null
    ;;
  float8) # a GPT in bf16 against float8 (tensorwise, rowwise): throughput, memory, the loss over the same steps
    timeout ${FLOAT8_CAP:-170} python3 benchmarks/float8_gpt.py --device cuda --sizes 24x1024,12x768 --steps 60 \
      --warmup 10 --name float8-gpt-$TAG
    mkdir -p "$W/results"; cp benchmarks/results/float8-gpt-$TAG.* "$W/results/" 2>/dev/null
    ;;
  float8long) # float8 where it paid (12 x 2048, tensorwise) against bf16 over 1000 steps: the losses compared late in a run
    timeout ${FLOAT8_CAP:-420} python3 benchmarks/float8_gpt.py --device cuda --sizes 12x2048 --variants bf16,tensorwise \
      --steps 1000 --warmup 10 --name float8-gpt-long-$TAG$CALL
    mkdir -p "$W/results"; cp benchmarks/results/float8-gpt-long-$TAG$CALL.* "$W/results/" 2>/dev/null
    ;;
  bench)
    hasten bench cifar10-fast $DATA --seeds 5 --target 'val/acc>=0.908' --out "$W/b" --name cifar10-fast-cuda-synced
    ;;
  ddp)   # the same run without a wrapper and under torchrun as DDP at world size 1, alternately
    for s in 0 1 2; do
      for mode in none ddp; do
        [ -n "${DDP_UNTIL:-}" ] && [ "$(date +%s)" -ge "$DDP_UNTIL" ] && break 2   # a deadline (seconds since 1970)
        extra=(); [ $mode = ddp ] && extra=(--nproc 1 trainer.parallelism=ddp)   # auto would pick none at size 1
        echo "== ddp-check mode=$mode seed=$s"
        hasten train cifar10-fast $DATA trainer.seed=$s trainer.run_dir=$W/ddp-$mode-$s --no-progress "${extra[@]}" 2>&1 \
          | grep -E "done in|final|rank|parallel"
      done
    done
    ;;
  fsdp)  # FSDP2 at world size 1 on CUDA (NCCL), bf16 policy, sharded checkpoint, resume, whole export
    G="shakespeare-char-baseline trainer.parallelism=fsdp trainer.precision=bf16-mixed trainer.eval_interval=100ba"
    hasten train $G trainer.max_duration=200ba trainer.run_dir=$W/fsdp --no-progress --nproc 1 2>&1 | tail -4
    ls "$W/fsdp/checkpoints"
    hasten train --resume "$W/fsdp" trainer.max_duration=400ba --force --no-progress --nproc 1 2>&1 | tail -4
    ls "$W/fsdp/checkpoints"
    python3 - "$W/fsdp" <<'EOF'
import sys, glob, torch
from hasten.checkpoint_sharded import export_whole
d = sorted(glob.glob(sys.argv[1] + "/checkpoints/*.dcp"))[-1]
export_whole(d, sys.argv[1] + "/whole.pt")
p = torch.load(sys.argv[1] + "/whole.pt", weights_only=True)
print("export", d.rsplit("/", 1)[-1], "->", len(p["model"]), "tensors, loads with weights_only=True")
EOF
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
      --target 'val/acc>=@first-worst' --seeds 3 --out "$W/b" --name cards-vision-proxy-h100-${part#cards-} \
      --title "Method cards on the cifar10-narrow 10-epoch proxy (H100), part ${part#cards-}"
    ;;
  lm)
    C=model.n_layer=6+model.n_head=6+model.n_embd=384+model.dropout=0.2+data.block_size=256+data.batch_size=64+trainer.precision=bf16-mixed+trainer.compile=true+trainer.eval_interval=250ba
    hasten bench shakespeare-char-baseline+$C+trainer.max_duration=5000ba --seeds 3 --cap 120 \
      --target 'val/loss<=1.47' --out "$W/b" --name shakespeare-gpu-synced
    ;;
  esac
  # after every part, so a call stopped by its time limit still brings back what finished
  tar -czf "$OUT/gpu.tar.gz" -C "$W" --exclude='*.pt' --exclude='*.dcp' --exclude='tensorboard' . 2>/dev/null
done
ls -la "$OUT"
