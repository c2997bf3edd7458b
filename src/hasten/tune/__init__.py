"""`hasten tune`: measure the systems settings on the user's own model and machine, and write
the fastest recipe (docs/tune.md).

- plan.py: the stages and options searched on this machine, the recipe's own setting in each,
  a trial's throughput with its interval, the machine key and the cache;
- search.py: the search (`Tuner`, `tune`): trials in their own processes, rounds, the decision
  rules, the quality guard, the final check against the recipe as written;
- report.py: the table, summary, plot, tune.json and tuned.yaml;
- worker.py: one trial (`python -m hasten.tune.worker`); lr_range.py: `hasten tune --lr`.

The names below are loaded when first used, so that a trial's worker process does not import
the search.
"""
import importlib as _importlib

_HOMES = {"plan": ("BATCH_STATS", "GUARDED", "KEYS", "Option", "Trial", "bf16_fast", "cache_path", "machine_key",
                   "own_setting", "stages", "throughput"),
          "search": ("Tuner", "tune"), "report": ("explain_lines", "plot", "render", "summary", "write")}
_WHERE = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(_importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
