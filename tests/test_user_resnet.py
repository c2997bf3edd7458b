"""The user-style model of the tune and vs-trainers measurements (benchmarks/comparisons/user_resnet.py)
stays a model hasten takes from its recipe, and its augmentation is what it says."""
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.comparisons.user_resnet import MEAN, STD, Augmented, ResNet, loaders
from tiny import image_zip

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "benchmarks" / "comparisons" / "recipes" / "user-resnet.yaml"


def test_each_training_image_is_a_padded_crop_of_its_image_flipped_or_not():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (3, 32, 32, 3), generator=g, dtype=torch.uint8)
    ds = Augmented(images, torch.tensor([0, 1, 2]))
    torch.manual_seed(1)
    for i in range(3):
        x, y = ds[i]
        assert x.shape == (3, 32, 32) and int(y) == i
        raw = x * STD + MEAN   # back to 0..1
        padded = F.pad(images[i].permute(2, 0, 1).float() / 255, (4, 4, 4, 4))
        crops = [padded[:, dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
        assert any(torch.allclose(raw, c, atol=1e-5) or torch.allclose(raw, c.flip(2), atol=1e-5) for c in crops)


def test_the_model_is_a_resnet_of_the_stated_shape():
    net = ResNet(widths=(16, 32, 64), blocks=2)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in net.modules()) == 1 + 3 * 2 * 2 + 2   # stem, blocks, 2 shortcuts


def test_the_recipe_trains_the_users_model_from_its_factory(tmp_path, monkeypatch):
    from hasten.cli import main
    z = image_zip(tmp_path / "c.zip", train=16, test=8)
    assert len(loaders(z, subset=10)[0]) == 10
    monkeypatch.chdir(ROOT)   # the recipe names its model and data as modules beside it, from the repository root
    rc = main(["train", str(RECIPE), f"data.factory_args.path={z}", "data.batch_size=8", "data.num_workers=0",
               "trainer.max_duration=2ba", "trainer.eval_interval=2ba", f"trainer.run_dir={tmp_path / 'run'}",
               "trainer.progress_bar=false", "trainer.tensorboard=false"])
    assert rc == 0


def test_vs_trainers_refuses_a_run_too_short_for_its_warm_up_in_one_line():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "benchmarks.comparisons.vs_trainers", "resnet", "--epochs", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--epochs 1" in r.stderr and "2 or more" in r.stderr
