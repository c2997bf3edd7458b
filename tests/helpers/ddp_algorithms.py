"""Every packaged algorithm for a few steps under data parallelism (run as each of N
processes with torchrun's environment, or alone; JOB_PARALLEL=fsdp shards the model). Rank 0
writes {name: "ok" | "refused: ..." | "error: ..."}.

    python ddp_algorithms.py OUT.json
"""
import json
import sys

import torch

from hasten import Trainer, make_runtime
from hasten.algorithms import REGISTRY
from hasten.models import MODELS
from hasten.models.gpt import GPT, GPTConfig

LM = {"chunked_cross_entropy": {"chunk_size": 32}, "low_precision_layernorm": {}, "float8_training": {"min_elements": 0},
      "seq_len_warmup": {"start": 4, "step": 4, "duration": "0.5dur"}, "batch_size_warmup": {"duration": "0.5dur"}}
VISION = {"activation_swap": {"old": "relu", "new": "gelu"}, "blurpool": {"min_channels": 4}, "channels_last": {},
          "cutmix": {}, "cutout": {"size": 4}, "delay": {"seconds": 0.0}, "dirac_init": {}, "ema": {"half_life": "0.5dur"},
          "frozen_bn_scale": {}, "ghost_batchnorm": {"ghost_size": 2}, "gradient_clipping": {},
          "gradual_pruning": {"sparsity": 0.5, "start": "1ba", "end": "3ba", "interval": "1ba"},
          "infobatch": {}, "label_smoothing": {}, "layer_freezing": {}, "lookahead": {"k": 2}, "mixup": {},
          "patch_whitening": {"num_images": 16}, "patch_whitening+train_bias_for": {"num_images": 16, "train_bias_for": "2ba"},
          "pool_reorder": {}, "progressive_resizing": {}, "proxy_selection": {"proxy": {"name": "resnet9", "width": 4}},
          "sam": {}, "selective_backprop": {}, "selective_backprop+average_stats": {"average_stats": 2},
          "selective_backprop+score_every": {"score_every": 2},
          "stochastic_depth": {"drop_rate": 0.2}, "swa": {"start": 0.5, "bn_batches": 2}, "tta": {"final_only": False}}


FORWARDS = [0]


def vision_run(name, params, rt):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 3, 16, 16, generator=g), torch.randint(0, 10, (48,), generator=g)
    steps = "4ba"
    if name == "infobatch":
        from hasten.data import TensorPairs, make_dataloader
        data = make_dataloader(TensorPairs(x, y), 8, shuffle=True, seed=0, num_workers=0)   # InfoBatch adds indices
    elif name == "selective_backprop+score_every":
        # 50 samples, 6 whole batches of 8 an epoch: 2 left out of each epoch, so in the second some
        # batches hold a sample no rank has a loss for, on one rank and not the other
        from hasten.data import TensorPairs, make_dataloader
        x, y = torch.randn(50, 3, 16, 16, generator=g), torch.randint(0, 10, (50,), generator=g)
        data, steps = make_dataloader(TensorPairs(x, y), 8, shuffle=True, seed=0, num_workers=0, drop_last=True), "12ba"
    else:
        data = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 48, 8)]
    algo = REGISTRY[name.split("+")[0]](**params)
    model = (MODELS["speedrun"](widths=(8, 16, 16)) if name.startswith("patch_whitening")
             else MODELS["resnet9"](width=8))
    if name == "selective_backprop+score_every":   # training passes, scoring passes included
        model.register_forward_hook(lambda *a: FORWARDS.__setitem__(0, FORWARDS[0] + 1))
    return Trainer(model, data, max_duration=steps, eval_dataloader=data[:2] if isinstance(data, list) else None,
                   eval_interval="2ba", algorithms=[algo], runtime=rt,
                   optimizers=lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))


def lm_run(name, params, rt):
    from hasten.data import RandomWindows
    tokens = torch.randint(0, 11, (600,), generator=torch.Generator().manual_seed(0))
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=11, block_size=16, dropout=0.0))
    return Trainer(model, RandomWindows(tokens, 16, 8, seed=0), max_duration="4ba",
                   algorithms=[REGISTRY[name](**params)], runtime=rt)


def main(out):
    torch.set_num_threads(1)
    import os
    rt = make_runtime(device="cpu", seed=0, timeout_s=60, parallelism=os.environ.get("JOB_PARALLEL", "auto"))
    results = {}
    for name, params in {**VISION, **LM}.items():
        try:
            tr = (lm_run if name in LM else vision_run)(name, params, rt)
            tr.fit()
        except Exception as e:   # refusals and failures are reported, so one run shows them all
            refused = isinstance(e, ValueError) and ("data-parallel" in str(e) or "sharded model" in str(e))
            results[name] = ("refused: " if refused else f"error: {type(e).__name__}: ") + str(e)
            continue
        w = torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().flatten()
                       for p in tr.state.model.parameters()])
        results[name] = "ok" if torch.isfinite(w).all() else "non-finite weights"
        if hasattr(tr.state.forward_model, "find_unused_parameters"):   # DDP's wrapper after the run
            results[f"{name}:find_unused"] = tr.state.forward_model.find_unused_parameters
        if rt.world.size > 1:   # the ranks hold the same weights after each run
            import torch.distributed as dist
            ws = [torch.zeros_like(w) for _ in range(rt.world.size)]
            dist.all_gather(ws, w)
            if not all(torch.equal(ws[0], v) for v in ws[1:]):
                results[name] = "ranks disagree"
            if name == "selective_backprop+average_stats":   # averaged over the ranks: the same statistics on each
                stats = torch.cat([b.float().flatten() for n, b in tr.state.model.named_buffers() if "running_" in n])
                every = [torch.zeros_like(stats) for _ in range(rt.world.size)]
                dist.all_gather(every, stats)
                if not all(torch.equal(every[0], v) for v in every[1:]):
                    results[name] = "ranks' batch norm statistics disagree"
            if name == "selective_backprop+score_every":   # every rank holds every rank's latest losses
                algo = tr.state.algorithms[0]
                records = torch.cat([algo._scores, algo._seen.float(), torch.tensor([float(FORWARDS[0])])])
                every = [torch.zeros_like(records) for _ in range(rt.world.size)]
                dist.all_gather(every, records)
                if not all(torch.equal(every[0], v) for v in every[1:]):
                    results[name] = "ranks' recorded losses (or their passes) disagree"
                elif int(algo._seen[:50].sum()) < 48 or not FORWARDS[0] < 24:   # epoch 0 saw 48 of 50 on the two ranks
                    results[name] = f"not shared: {int(algo._seen[:50].sum())} samples recorded, {FORWARDS[0]} forwards"
    if rt.world.is_main:
        with open(out, "w") as f:
            json.dump(results, f)
    rt.close()


if __name__ == "__main__":
    import faulthandler
    faulthandler.dump_traceback_later(240, exit=True)   # a rank that hangs shows where, before the test's deadline
    main(sys.argv[1])
    from hasten.runtime import leave_worker
    leave_worker(0)   # as hasten's own workers do: no interpreter finalisation under torchrun
