"""hasten's layers, bottom to top: every module is on one, and a module imports (at module
level) only from its own layer and those below. tests/test_architecture.py checks the code
against this map and docs/architecture.md's "Layers" section against `render()`.

A module is placed by the longest name below that is it or a package holding it."""
LAYERS = (
    ("foundations", "errors, typed time and events, the schema, the version and provenance: nothing of hasten's above",
     ("errors", "version", "registry", "hardware", "seeding", "files", "outputs", "processes", "allocator", "schema", "provenance", "usercode",
      "microbatch", "core.time", "core.event", "bench.stats", "bench.survival")),
    ("runtime", "the world of processes, FSDP's options, the runtime (device, precision, seeds)",
     ("distributed", "runtime")),
    ("core", "state, engine, Algorithm and Callback", ("core",)),
    ("building blocks", "data, models, optimizers, loggers, the loss, metrics, Hugging Face models",
     ("data", "models", "optim", "loggers", "loss", "metrics", "integrations")),
    ("methods and tasks", "one module per method (each registers itself), one per task",
     ("algorithms", "tasks", "functional")),
    ("checkpoints and callbacks", "the checkpoint format and writers, the callbacks, the Trainer's argument checks",
     ("checkpoint", "callbacks", "arguments")),
    ("assembly and the loop", "the options, the assembler, preparing a model, the Trainer",
     ("assembly", "trainer")),
    ("applications", "recipes, run folders, the harness, compression, tune, data preparation, the command line, the hosts' "
     "integrations (imported by users, never by the core), and the package face",
     ("", "config", "runs", "build", "bench", "compress", "tune", "data.prepare", "cli", "__main__", "integrations.host",
      "integrations.lightning", "integrations.hf_trainer")),
)


def layer_of(module: str) -> int:
    """The layer index of `module` ('hasten.x.y'); -1 when no entry places it."""
    name = module[len("hasten."):] if module.startswith("hasten.") else "" if module == "hasten" else module
    best, where = -1, -1
    for i, (_, _, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (p == "" and name == "") or (p and (name == p or name.startswith(p + "."))):
                if len(p) > best:
                    best, where = len(p), i
    return where


def render() -> str:
    """The "Layers" list of docs/architecture.md."""
    lines = []
    for i, (title, what, prefixes) in enumerate(LAYERS, 1):
        names = ", ".join(f"`{p}`" if p else "the package face `hasten`" for p in prefixes)
        lines.append(f"{i}. {title} ({what}): {names}")
    return "\n".join(lines)
