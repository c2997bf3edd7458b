"""Profile: where a run's time goes, measured on a short window of its steps.

    Trainer(..., callbacks=[Profile(steps=20, folder="runs/x/profile")])
    hasten train RECIPE trainer.profile=20          # the same, into RUN/profile

After `warmup` steps (compilation, allocator and cache warm-up), the next `steps` steps run
under `torch.profiler`, with every hasten event timed at its start and end. At the end of fit
a table is printed (standard error) and written (`profile.md`, `profile.json`): the share of
the window's wall time spent in data loading, forward (and the loss), backward, the optimizer
step, evaluation, checkpointing and hasten's own events (algorithms and callbacks at every
event), the rest as "other" (logging, the loop itself), and the ten operators with the most
self time. The trace (`trace.json`, Chrome trace format) opens in Perfetto
(https://ui.perfetto.dev): PyTorch has deprecated its TensorBoard profiler plugin.

The phases come from the event order (docs/architecture.md): data is the time between
BEFORE_DATALOADER and AFTER_DATALOADER, forward from BEFORE_FORWARD to AFTER_FORWARD plus
BEFORE_LOSS to AFTER_LOSS (the loss's reduction up to BEFORE_BACKWARD included), backward from
BEFORE_BACKWARD to AFTER_BACKWARD, the optimizer from BEFORE_OPTIM_STEP to BATCH_END (the step,
zeroing gradients, schedules), each measured between the end of one event's dispatch and the
start of the next; hasten's events are the dispatches themselves. The profiler's own cost
lands in the phases it instruments (mostly the operators'): read the shares, not the absolute
times, and compare the window's step time with an unprofiled run's.
"""
from __future__ import annotations

import json
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import torch

from ..core import Callback, Event
from ..files import atomic_write
from ..hardware import cpu_has_bf16

PHASES = ("data", "forward", "backward", "optimizer", "evaluation", "checkpointing", "hasten events", "other")

# (phase, from the end of this event's dispatch, to the start of that one's)
_GAPS = (("data", Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER),
         ("forward", Event.BEFORE_FORWARD, Event.AFTER_FORWARD),
         ("forward", Event.BEFORE_LOSS, Event.AFTER_LOSS),
         ("forward", Event.AFTER_LOSS, Event.BEFORE_BACKWARD),
         ("backward", Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD),
         ("optimizer", Event.BEFORE_OPTIM_STEP, Event.AFTER_OPTIM_STEP),
         ("optimizer", Event.AFTER_OPTIM_STEP, Event.BATCH_END))
_INSIDE = {Event.EVAL_START: "evaluation", Event.CHECKPOINT: "checkpointing"}


class _Timer:
    def __init__(self):
        self.marks: list[tuple[Event, str, float]] = []

    def start(self, event):
        self.marks.append((event, "start", time.perf_counter()))

    def end(self, event):
        self.marks.append((event, "end", time.perf_counter()))


def phase_times(marks: list) -> dict[str, float]:
    """Seconds per phase from the (event, 'start'|'end', time) marks of a window."""
    out = defaultdict(float)
    last_end: dict[Event, float] = {}
    eval_start = None
    for event, kind, t in marks:
        if kind == "start":
            for phase, a, b in _GAPS:
                if event == b and a in last_end:
                    out[phase] += t - last_end.pop(a)
            if event == Event.EVAL_START:
                eval_start = t
            elif event == Event.CHECKPOINT:
                last_end["_ckpt"] = t
            else:
                last_end[("_dispatch", event)] = t
        else:
            if event == Event.EVAL_END and eval_start is not None:
                out["evaluation"] += t - eval_start
                eval_start = None
            elif event == Event.CHECKPOINT and "_ckpt" in last_end:
                out["checkpointing"] += t - last_end.pop("_ckpt")
            elif ("_dispatch", event) in last_end and eval_start is None:
                out["hasten events"] += t - last_end.pop(("_dispatch", event))
            last_end[event] = t
    return dict(out)


class Profile(Callback):
    main_rank_only = True

    def __init__(self, steps: int = 20, warmup: int = 5, folder: "str | Path | None" = None, top: int = 10,
                 print_table: bool = True):
        if steps < 1 or warmup < 0:
            raise ValueError(f"Profile: steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
        self.steps, self.warmup, self.top = int(steps), int(warmup), int(top)
        self.folder = Path(folder) if folder is not None else None
        self.print_table = print_table
        self.engine = None
        self.result: dict | None = None
        self._timer = self._prof = None
        self._t0 = self._first = None

    def attach(self, engine) -> None:
        """The Trainer hands over its engine, whose event dispatches the window times."""
        self.engine = engine

    # ------------------------------------------------------------------ the window
    def before_dataloader(self, state, logger):
        if self._timer is None and self.result is None and state.timestamp.batch == (self._first or 0) + self.warmup:
            self._open(state)

    def fit_start(self, state, logger):
        self._first = state.timestamp.batch

    def _open(self, state):
        self._timer = _Timer()
        if self.engine is not None:
            self.engine.time_events(self._timer)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if state.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=activities, record_shapes=False)
        self._prof.__enter__()
        self._t0 = time.perf_counter()
        self._timer.start(Event.BEFORE_DATALOADER)   # this event's dispatch is under way: the data phase
        self._timer.end(Event.BEFORE_DATALOADER)     # starts now

    def checkpoint(self, state, logger):
        if self._timer is not None and state.timestamp.batch >= (self._first or 0) + self.warmup + self.steps:
            self._close(state)

    def fit_end(self, state, logger):
        if self._timer is not None:
            self._close(state)
        ran = state.timestamp.batch - (self._first or 0)
        if self.result is None and self._first is not None and ran <= self.warmup:
            warnings.warn(f"Profile: the run took {ran} step(s), no more than the profile's {self.warmup} warm-up "
                          "steps, so nothing was profiled and no profile written; profile a longer run")
        elif self.result is not None and self.result["steps"] < self.steps:
            warnings.warn(f"Profile: the run ended after {self.result['steps']} of the {self.steps} steps asked to be "
                          "profiled; the profile holds those")
        if self.result is not None and self.print_table:
            print(render(self.result), file=sys.stderr, flush=True)

    def _close(self, state):
        self._timer.end(Event.CHECKPOINT)
        if state.device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - self._t0
        self._prof.__exit__(None, None, None)
        if self.engine is not None:
            self.engine.time_events(None)
        times = phase_times(self._timer.marks)
        named = sum(times.values())
        times["other"] = max(0.0, wall - named)
        steps = max(1, state.timestamp.batch - (self._first or 0) - self.warmup)
        ops = sorted(self._prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[: self.top]
        self.result = {
            "steps": steps, "window_s": wall, "step_s": wall / steps,
            "shares": {p: times.get(p, 0.0) / wall for p in PHASES},
            "seconds": {p: times.get(p, 0.0) for p in PHASES},
            "top_operators": [{"name": e.key, "calls": e.count, "self_cpu_s": e.self_cpu_time_total / 1e6,
                               "share_of_self_cpu": e.self_cpu_time_total / max(1e-9, sum(
                                   x.self_cpu_time_total for x in self._prof.key_averages()))} for e in ops],
            "device": str(state.device), "precision": state.precision}
        self.result["advice"] = advice(self.result, state.model)
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._prof.export_chrome_trace(str(self.folder / "trace.json"))
            atomic_write(self.folder / "profile.json", lambda f: json.dump(self.result, f, indent=2), binary=False)
            atomic_write(self.folder / "profile.md", lambda f: f.write(render(self.result)), binary=False)
            self.result["trace"] = str(self.folder / "trace.json")
        self._timer = self._prof = None


def render(result: dict) -> str:
    """The profile as a plain table."""
    lines = [f"where the time went: {result['steps']} steps, {result['step_s'] * 1000:.1f} ms a step "
             f"({result['device']}, {result['precision']})", "",
             "| phase | share | ms per step |", "|---|---|---|"]
    for p in PHASES:
        lines.append(f"| {p} | {100 * result['shares'][p]:.1f}% | {1000 * result['seconds'][p] / result['steps']:.2f} |")
    lines += ["", "| operator | calls | self CPU s | share |", "|---|---|---|---|"]
    for op in result["top_operators"]:
        lines.append(f"| {op['name']} | {op['calls']} | {op['self_cpu_s']:.4f} | {100 * op['share_of_self_cpu']:.1f}% |")
    if result.get("advice"):
        lines += ["", "What the numbers point to:"] + [f"- {a}" for a in result["advice"]]
    if result.get("trace"):
        lines += ["", f"trace: {result['trace']} (open it in https://ui.perfetto.dev)"]
    return "\n".join(lines) + "\n"


def advice(result: dict, model) -> list[str]:
    """The one or two changes the profile's numbers point to (none when nothing stands out)."""
    out = []
    shares, ops = result["shares"], {o["name"]: o["share_of_self_cpu"] for o in result["top_operators"]}
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    copies = sum(v for k, v in ops.items() if k in ("aten::copy_", "aten::contiguous", "aten::clone", "aten::to"))
    nchw = convs and not convs[0].weight.is_contiguous(memory_format=torch.channels_last)
    if nchw and copies > 0.10:
        out.append(f"layout copies take {100 * copies:.0f}% of the operators' time in a conv net laid out NCHW: "
                   "channels-last (algorithms.channels_last, or hasten tune) avoids most of them")
    if shares.get("data", 0.0) > 0.2:
        out.append(f"the step waits for data {100 * shares['data']:.0f}% of the time: more loader workers "
                   "(data.num_workers), the device loader (data.loader=device) or a faster source")
    if shares.get("optimizer", 0.0) > 0.2:
        out.append(f"the optimizer step takes {100 * shares['optimizer']:.0f}%: a compiled optimizer step "
                   "(trainer.compile_optimizer) or a foreach/fused optimizer")
    dense = sum(v for k, v in ops.items() if any(s in k for s in ("conv", "mm", "linear", "matmul", "addmm")))
    if result["precision"] == "fp32" and result["device"] == "cpu" and cpu_has_bf16() and dense > 0.4:
        out.append(f"convolutions and matrix products take {100 * dense:.0f}% in fp32 on a CPU with bf16 hardware: "
                   "trainer.precision=auto (bf16-mixed here)")
    return out[:2]


for _event in Event:   # every event fires while a Profile is there, so each can be timed
    if _event.value not in Profile.__dict__:
        setattr(Profile, _event.value, lambda self, state, logger: None)
del _event
