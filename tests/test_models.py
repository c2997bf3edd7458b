"""Reference models: causality, options, FLOP counts."""
import pytest
import torch

from hasten.models import GPT, GPTConfig, ResNet9, forward_flops


@pytest.mark.parametrize("pos,qk_norm,mlp", [("learned", False, "gelu"), ("rope", True, "relu2")])
def test_gpt_is_causal(pos, qk_norm, mlp):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16, pos=pos, qk_norm=qk_norm,
                      mlp=mlp)).eval()
    x = torch.randint(0, 11, (2, 16))
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 11
    a, b = m(x), m(y)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_rope_is_a_rotation_of_each_pair_by_its_positions_angle():
    from hasten.models.gpt import apply_rope, rope_tables
    torch.manual_seed(0)
    B, H, T, D = 2, 3, 10, 8
    x = torch.randn(B, H, T, D, dtype=torch.float64)
    cos, sin = rope_tables(16, D)
    got = apply_rope(x, cos.double(), sin.double())
    # reference: the pair (x_i, x_{i+D/2}) as the complex number x_i + j x_{i+D/2}, times e^{j t theta_i}
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    turn = torch.polar(torch.ones(T, D // 2, dtype=torch.float64), torch.arange(T, dtype=torch.float64)[:, None] * theta)
    z = torch.complex(x[..., : D // 2], x[..., D // 2:]) * turn
    torch.testing.assert_close(got, torch.cat([z.real, z.imag], -1))
    # what it is for: a query-key product depends on the positions' difference only
    q, k = torch.randn(D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    rot = lambda v, t: apply_rope(v.expand(1, 1, 16, D), cos.double(), sin.double())[0, 0, t]  # noqa: E731
    assert float(rot(q, 7) @ rot(k, 4)) == pytest.approx(float(rot(q, 12) @ rot(k, 9)), rel=1e-6)   # tables in fp32
    assert float(rot(q, 7) @ rot(k, 4)) != pytest.approx(float(rot(q, 7) @ rot(k, 5)), rel=1e-3)


def test_gpt_options():
    tied = GPT(GPTConfig(n_layer=1, tie_embeddings=True))
    untied = GPT(GPTConfig(n_layer=1, tie_embeddings=False))
    assert tied.lm_head.weight is tied.wte.weight and untied.lm_head.weight is not untied.wte.weight
    z = GPT(GPTConfig(n_layer=2, zero_init_proj=True))
    assert all(b.attn.proj.weight.abs().sum() == 0 and b.mlp.proj.weight.abs().sum() == 0 for b in z.blocks)
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=10, n_head=4)


def test_gpt_flops_per_token_matches_a_count():
    c = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
    m = GPT(c)
    # 6 FLOPs per parameter per token (non-embedding count excludes wpe) + attention 12*L*d*T
    assert m.flops_per_token == 6 * (sum(p.numel() for p in m.parameters()) - 64 * 128) + 12 * 4 * 128 * 64


def test_resnet9_flops():
    assert forward_flops(ResNet9(width=64), torch.zeros(1, 3, 32, 32)) == pytest.approx(0.7585e9, rel=1e-3)
    assert forward_flops(ResNet9(width=40), torch.zeros(1, 3, 32, 32)) == pytest.approx(0.297e9, rel=1e-2)
    assert ResNet9()(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
