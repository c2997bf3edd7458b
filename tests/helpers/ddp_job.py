"""A small training job for the data-parallel tests: run it alone, or as each of N processes
with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    python ddp_job.py MODEL OUT.pt [GRAD_ACCUM]

MODEL: mlp, gpt, gpt-b1 (a global batch of one window), gpt-masked (targets mostly the ignore
index, global batch 3), convbn (a conv net with batch norm), convbn-ghost4 (the same with ghost
batch norm of 4 samples, the per-rank batch of two processes), or conv-device (a conv net
without batch norm on a DeviceLoader that translates, flips and cuts out, global batch 9).
Rank 0 writes the final weights, the evaluation and the logged training losses to OUT.pt.

Environment: JOB_LOADER=hasten gives the mlp a make_dataloader loader (rank shares loaded by
its batch sampler) instead of a plain DataLoader; JOB_LOADER=distsampler a DataLoader over a
DistributedSampler with the per-rank batch; JOB_ALGO=ema, swa, layer_freezing or infobatch adds that
algorithm (infobatch: 4 epochs, each rank records the samples of every epoch's plan);
JOB_TRAP=1 makes host synchronisation inside a training step an error. JOB_PARALLEL=fsdp
shards the model (FSDP2; JOB_RESHARD=0 keeps parameters gathered between forward and
backward; JOB_AC=1 recomputes each block's activations; JOB_CKPT=whole gathers checkpoints into one
file instead of sharded .dcp folders; JOB_KILL_IN_SAVE=B kills every rank inside the sharded
save at batch B); JOB_PRECISION sets the precision (default fp32); JOB_OPT=muon trains the gpt with Muon;
JOB_MICROBATCH (a size or auto) and JOB_MEMORY_LIMIT (bytes) set the Trainer's micro-batching;
JOB_COMPILE_OPT=1 compiles the optimizers' steps (trainer.compile_optimizer)."""
import json
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
from hasten import Trainer, make_runtime  # noqa: E402
from hasten.loggers.base import LoggerDestination  # noqa: E402


class Remember(LoggerDestination):
    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step):
        self.rows.append({"step": step, **metrics})


def main(model_name: str, out: str, grad_accum="1", sigterm_rank1_at="0", save: str = "") -> None:
    grad_accum, sigterm_rank1_at = int(grad_accum), int(sigterm_rank1_at)
    torch.set_num_threads(1)
    parallel = os.environ.get("JOB_PARALLEL", "auto")
    rt = make_runtime(device="cpu", seed=0, timeout_s=60, parallelism=parallel,
                      precision=os.environ.get("JOB_PRECISION", "fp32"))
    g = torch.Generator().manual_seed(1)
    loader_kind, algo_name = os.environ.get("JOB_LOADER", "plain"), os.environ.get("JOB_ALGO", "")
    duration = "4ep" if algo_name == "infobatch" else "12ba"
    if model_name == "mlp":
        x, y = torch.randn(96, 8, generator=g), torch.randint(0, 4, (96,), generator=g)
        ex, ey = torch.randn(33, 8, generator=g), torch.randint(0, 4, (33,), generator=g)   # 33: odd on purpose
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        from torchmetrics.classification import MulticlassAccuracy
        metrics = {"acc": MulticlassAccuracy(4, average="micro")}
        if loader_kind == "hasten":   # global batch 9: shares of 5 and 4 (3+2 and 2+2 with accumulation)
            from hasten.data import TensorPairs, make_dataloader
            train = make_dataloader(TensorPairs(x, y), 9, shuffle=True, seed=0, num_workers=0)
        elif loader_kind == "distsampler":
            from torch.utils.data.distributed import DistributedSampler
            sampler = DistributedSampler(TensorDataset(x, y), num_replicas=rt.world.size, rank=rt.world.rank, seed=0)
            train = DataLoader(TensorDataset(x, y), batch_size=5, sampler=sampler)
        else:
            train = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True)   # shards of 5, or 3 and 2
        evald = DataLoader(TensorDataset(ex, ey), batch_size=8)
        opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)   # noqa: E731
    elif model_name == "conv-device":
        from hasten.data import DeviceLoader
        imgs, labels = torch.randint(0, 256, (43, 8, 8, 3), dtype=torch.uint8, generator=g), torch.randint(0, 4, (43,), generator=g)
        model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 8 * 8, 4))
        metrics = {}
        train = DeviceLoader(imgs, labels, 9, translate=2, flip="random", cutout=3, seed=0)
        evald = DeviceLoader(imgs[:13], labels[:13], 4, shuffle=False)
        opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)   # noqa: E731
    elif model_name.startswith("convbn"):
        x, y = torch.randn(64, 3, 8, 8, generator=g), torch.randint(0, 4, (64,), generator=g)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                              nn.Linear(8 * 8 * 8, 4))
        metrics = {}
        train = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
        evald = None
        opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.05)   # noqa: E731
    else:
        from hasten.data import RandomWindows
        from hasten.data.text import EvalWindows
        from hasten.models.gpt import GPT, GPTConfig
        tokens = torch.randint(0, 11, (2000,), generator=g)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=11, block_size=16, dropout=0.0))
        metrics = {}
        train = RandomWindows(tokens[:1500], block_size=16, batch_size=6, seed=0)
        evald = EvalWindows(tokens[1500:], block_size=16, batch_size=5)
        if model_name == "gpt-b1":   # a global batch of one window: the second rank's share is empty
            train = RandomWindows(tokens[:1500], block_size=16, batch_size=1, seed=0)
        elif model_name == "gpt-masked":   # global batches of 3 windows, most targets the ignore index, unevenly
            wins = [(tokens[i:i + 16], tokens[i + 1:i + 17].clone()) for i in range(0, 1440, 40)]
            for j, (_, t) in enumerate(wins):
                t[(j % 3) + 1:] = -100
            train = [(torch.stack([w[0] for w in wins[i:i + 3]]), torch.stack([w[1] for w in wins[i:i + 3]]))
                     for i in range(0, len(wins), 3)]
            evald = train[:4]
        opt = lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3)   # noqa: E731
        if os.environ.get("JOB_OPT") == "muon":   # Muon (fp32 Newton-Schulz) for the blocks' matrices, AdamW for the rest
            from hasten.optim.muon import muon_optimizers
            fused = False if os.environ.get("JOB_COMPILE_OPT") == "1" else None   # compiled: the foreach AdamW
            opt = lambda m: muon_optimizers(m, muon_lr=0.02, adam_lr=3e-3, ns_dtype="fp32", fused=fused)   # noqa: E731
    logger = Remember()
    algos, kept = [], []
    if algo_name == "ema":
        from hasten.algorithms import EMA
        algos.append(EMA(half_life="0.25dur"))
    elif algo_name == "swa":
        from hasten.algorithms import SWA
        algos.append(SWA(start=0.5))
    elif algo_name == "layer_freezing":
        from hasten.algorithms import LayerFreezing
        algos.append(LayerFreezing(start=0.25, fraction=0.5))
    elif algo_name == "infobatch":
        from hasten import Callback
        from hasten.algorithms import InfoBatch
        info = InfoBatch(prune_ratio=0.5, delta=1.0)

        class Plans(Callback):   # the samples each epoch trains on, as this rank's pruner planned them
            def epoch_start(self, state, logger):
                p = info.pruner
                kept.append(list(range(p.num_samples)) if p.kept is None else p.kept.tolist())
        algos.append(info)
        extra_callbacks = [Plans()]
    if os.environ.get("JOB_TRAP") == "1":
        import sync_trap

        class Patch:   # sync_trap patches through a pytest monkeypatch; here for the whole process
            setattr = staticmethod(setattr)
        algos.append(sync_trap.install(Patch()))
    if model_name == "convbn-ghost4":
        from hasten.algorithms import GhostBatchNormAlgorithm
        algos = [GhostBatchNormAlgorithm(ghost_size=4)]
    if sigterm_rank1_at and rt.world.rank == 1:   # a signal that reaches one rank only
        from hasten import Algorithm

        class Term(Algorithm):
            def batch_end(self, state, logger):
                if state.timestamp.batch == sigterm_rank1_at:
                    os.kill(os.getpid(), signal.SIGTERM)
        algos.append(Term())
    kill_in_save = os.environ.get("JOB_KILL_IN_SAVE")   # every rank SIGKILLs itself inside this sharded save
    if kill_in_save:
        import torch.distributed.checkpoint as dcp
        dcp_save = dcp.save

        def save_then_die(state_dict, *, checkpoint_id=None, **kw):
            dcp_save(state_dict, checkpoint_id=checkpoint_id, **kw)   # the shards are written, the folder not named
            if f"ep0-ba{kill_in_save}." in str(checkpoint_id):
                os.kill(os.getpid(), signal.SIGKILL)
        dcp.save = save_then_die
    kill_at = int(os.environ.get("JOB_KILL_AT", 0))   # every rank SIGKILLs itself after this batch's checkpoint point
    if kill_at:
        from hasten import Algorithm

        class Kill(Algorithm):
            def checkpoint(self, state, logger):
                if state.timestamp.batch == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
        algos.append(Kill())
    trap = os.environ.get("JOB_TRAP") == "1"   # logging and evaluation read values: none inside the trapped steps
    tr = Trainer(model, train, optimizers=opt, max_duration=duration, eval_dataloader=evald,
                 eval_interval="1000ba" if trap else "6ba", log_interval="1000ba" if trap else "3ba", metrics=metrics, loggers=[logger], runtime=rt, grad_accum=grad_accum,
                 algorithms=algos, save_folder=save or None, save_interval=os.environ.get("JOB_SAVE_EVERY", "100ba"),
                 autoresume=bool(save) and os.environ.get("JOB_RESUME") == "1",
                 callbacks=extra_callbacks if algo_name == "infobatch" else (),
                 microbatch=(lambda m: None if not m else m if m == "auto" else int(m))(os.environ.get("JOB_MICROBATCH")),
                 memory_limit=int(os.environ["JOB_MEMORY_LIMIT"]) if os.environ.get("JOB_MEMORY_LIMIT") else None,
                 activation_checkpointing=os.environ.get("JOB_AC") == "1",
                 compile_optimizer=os.environ.get("JOB_COMPILE_OPT") == "1",
                 fsdp={"reshard_after_forward": os.environ.get("JOB_RESHARD", "1") == "1",
                       "checkpoint": os.environ.get("JOB_CKPT", "sharded")} if parallel == "fsdp" else None)
    tr.fit()
    trapped = [a.steps for a in algos if type(a).__name__ == "Trap"]
    with open(f"{out}.rank{rt.world.rank}.json", "w") as f:
        json.dump({"batch": tr.state.timestamp.batch, "stop_reason": tr.state.stop_reason,
                   "last_checkpoint": tr.state.last_checkpoint, "kept": kept, "sample": tr.state.timestamp.sample,
                   "trapped_steps": trapped[0] if trapped else None}, f)
    if rt.world.sharded:   # gathered whole on rank 0 (a collective)
        from hasten.distributed.fsdp import model_state
        weights = model_state(tr.state.model)
    else:
        weights = {k: v.clone() for k, v in tr.state.model.state_dict().items()}
    if rt.world.is_main:
        torch.save({"weights": weights,
                    "eval": tr.state.eval_metrics, "logged": logger.rows, "world": rt.world.size,
                    "samples": tr.state.timestamp.sample}, out)
    rt.close()


if __name__ == "__main__":
    main(*sys.argv[1:6])
    from hasten.runtime import leave_worker
    leave_worker(0)   # as hasten's own workers do: no interpreter finalisation under torchrun
