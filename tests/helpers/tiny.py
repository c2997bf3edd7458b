"""Tiny models and data for tests."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def mlp(d_in=8, hidden=16, d_out=4, dropout=0.0):
    layers = [nn.Linear(d_in, hidden), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(hidden, d_out))
    return nn.Sequential(*layers)


def classification_data(n=64, d_in=8, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, classes, generator=g)
    y = (x @ w).argmax(1)
    return x, y


def loader(n=64, batch_size=8, shuffle=False, seed=0, d_in=8, classes=4):
    x, y = classification_data(n, d_in, classes, seed)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


def model_and_twin(make=mlp, seed=0):
    """Two models with the same initial weights: one to train, one for a reference computation."""
    torch.manual_seed(seed)
    model = make()
    twin = make()
    twin.load_state_dict(model.state_dict())
    return model, twin


def image_zip(path, train=40, test=20, seed=0):
    """A CIFAR-10-shaped image zip (train/CLASS/i.png, test/CLASS/i.png) of random 32x32 images."""
    import io
    import zipfile

    import numpy as np
    from PIL import Image
    from hasten.data.cifar import CLASSES
    rng = np.random.default_rng(seed)
    with zipfile.ZipFile(path, "w") as zf:
        for split, n in (("train", train), ("test", test)):
            for i in range(n):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
                zf.writestr(f"{split}/{CLASSES[i % 10]}/{i:05d}.png", buf.getvalue())
    return path


def run_cli(*args, cwd=None):
    """`hasten ARGS` in this process (no interpreter start-up, no torch import): the exit code
    and what it printed, as a finished subprocess would report them. For success paths; the
    tests of one-line errors and signals run the real command in its own process."""
    import contextlib
    import io
    import os
    from types import SimpleNamespace

    from hasten.cli import main
    out, err, here, threads = io.StringIO(), io.StringIO(), os.getcwd(), torch.get_num_threads()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as e:
                code = e.code
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)   # a recipe's trainer.threads must not outlive its run
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
