"""The modded-nanogpt peer rendering (benchmarks/comparisons/peers/modded_nanogpt.py) against
independent references: its orthogonalisation against the polar factor from an SVD, its
schedule against upstream's published stage values, and its optimizer's tying of the embedding
to the head."""
import importlib.util
import math
from pathlib import Path

import pytest
import torch

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "comparisons" / "peers" / "modded_nanogpt.py"


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("modded_nanogpt_peer", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_polar_express_approximates_the_polar_factor_of_each_matrix_of_a_bank(peer):
    torch.manual_seed(0)
    for shape in ((3, 64, 320), (2, 1280, 320), (2, 320, 320)):
        g = torch.randn(*shape)
        out = peer.polar_express(g).float()
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        polar = u @ vh
        cos = (out * polar).sum(dim=(-2, -1)) / (out.norm(dim=(-2, -1)) * polar.norm(dim=(-2, -1)))
        assert out.shape == g.shape
        assert (cos > 0.98).all(), cos
        s = torch.linalg.svdvals(out)
        assert s.max() < 1.2, s.max()
        if max(shape[1:]) >= 2 * min(shape[1:]):   # well conditioned: every singular value near 1
            assert s.min() > 0.7, s.min()


def test_the_schedule_follows_upstreams_stages(peer):
    bounds = peer.stage_bounds()
    assert bounds[0] == (0, 100) and bounds[2] == (200, 300) and bounds[3][1] == 300 + peer.EXTENSION
    assert [peer.lookup(s)[0][0] for s in (0, 150, 250, 301)] == [8, 16, 24, 24]
    # linear cooldown from 40% of the scheduled steps to 0.15 at their end, then flat
    assert peer.lr_factor(0) == 1.0 and peer.lr_factor(119) == 1.52
    assert math.isclose(peer.lr_factor(300), 0.15) and math.isclose(peer.lr_factor(302), 0.15)
    assert math.isclose(peer.lr_factor(210), 1.73 * (1 - 0.5) + 0.15 * 0.5)
    assert peer.momentum(0) == 0.85 and peer.momentum(150) == 0.95
    assert math.isclose(peer.momentum(300 + peer.EXTENSION), 0.85)
    assert peer.mtp_weights(0) == [1.0, 0.5, 0.25] and peer.mtp_weights(100) == [1.0, 0.5]
    assert peer.mtp_weights(250) == [1.0]


def test_the_multi_token_loss_sums_weighted_cross_entropies_of_later_tokens(peer):
    torch.manual_seed(0)
    logits, targets = torch.randn(2, 7, 11), torch.randint(0, 11, (2, 7))
    w = [1.0, 0.5, 0.25]
    ref = sum(wk * torch.nn.functional.cross_entropy(logits[:, :7 - k].reshape(-1, 11), targets[:, k:].reshape(-1),
                                                     reduction="sum") for k, wk in enumerate(w))
    assert torch.allclose(peer.loss_sum(logits, targets, w), ref)


def test_the_embedding_follows_the_head_until_the_split_then_learns_on_its_own(peer):
    torch.manual_seed(0)
    model = peer.ModdedGPT()
    opt = peer.NorMuonAndAdam(model)
    x = torch.randint(0, peer.VOCAB, (1, 32))
    for step in range(4):
        peer.loss_sum(model(x, (16, 48)), x, [1.0]).backward()
        opt.step(step, 1.0, 0.9)
        if step == 1:
            assert torch.equal(model.embed, model.lm_head.T)
    opt.untie()
    peer.loss_sum(model(x, (16, 48)), x, [1.0]).backward()
    opt.step(5, 1.0, 0.9)
    assert not torch.equal(model.embed, model.lm_head.T)
