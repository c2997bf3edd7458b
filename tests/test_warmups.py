"""Sequence-length and batch-size warm-up: exact token bookkeeping and loss equivalence."""
import torch
import torch.nn.functional as F

from hasten import Algorithm, Trainer
from hasten.algorithms import BatchSizeWarmup, SeqLenWarmup, reshape_sequences, take_batch
from hasten.algorithms.seq_len_warmup import warmup_length
from hasten.data import RandomWindows
from hasten.models import GPT, GPTConfig


def test_reshape_keeps_every_token_and_the_shifted_targets():
    x = torch.arange(2 * 16).view(2, 16)
    y = x + 1
    a, b = reshape_sequences(x, y, 4)
    assert a.shape == (8, 4) and torch.equal(a.flatten(), x.flatten()) and torch.equal(b, a + 1)


def test_learned_position_model_on_reshaped_rows_equals_the_short_windows():
    """Each reshaped row is exactly a short window: the same loss as computing it window by window."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    x = torch.randint(0, 50, (2, 16))
    y = torch.randint(0, 50, (2, 16))
    a, b = reshape_sequences(x, y, 8)
    whole = F.cross_entropy(m(a).flatten(0, 1), b.flatten(), reduction="none")
    pieces = torch.cat([F.cross_entropy(m(x[i:i + 1, j:j + 8])[0], y[i, j:j + 8], reduction="none")
                        for i in range(2) for j in (0, 8)])
    torch.testing.assert_close(whole, pieces)


def test_warmup_length_schedule():
    assert [warmup_length(p, 8, 64, 8) for p in (0, 0.25, 0.5, 0.99, 1.0)] == [8, 16, 32, 32, 64]


class Seen(Algorithm):
    def __init__(self):
        self.shapes = []

    def batch_start(self, state, logger):
        self.shapes.append(tuple(state.batch[0].shape))


def _tiny_lm():
    return torch.nn.Sequential(torch.nn.Embedding(7, 8), torch.nn.Linear(8, 7))


def test_seq_len_warmup_in_the_trainer_counts_all_tokens():
    seen = Seen()
    data = RandomWindows(torch.arange(2000) % 7, block_size=16, batch_size=4)
    tr = Trainer(_tiny_lm(), data, max_duration="10ba", device="cpu",
                 algorithms=[SeqLenWarmup(start=4, step=4, duration="0.5dur"), seen])
    tr.fit()
    assert seen.shapes[0] == (16, 4) and seen.shapes[-1] == (4, 16)
    assert tr.state.timestamp.token == 10 * 4 * 16


def test_batch_size_warmup_grows_and_counts_samples():
    seen = Seen()
    data = RandomWindows(torch.arange(2000) % 7, block_size=8, batch_size=8)
    tr = Trainer(_tiny_lm(), data, max_duration="8ba", device="cpu",
                 algorithms=[BatchSizeWarmup(start_fraction=0.25, duration="0.5dur", multiple=2), seen])
    tr.fit()
    sizes = [s[0] for s in seen.shapes]
    assert sizes[0] == 2 and sizes[-1] == 8 and sizes == sorted(sizes)
    assert tr.state.timestamp.sample == sum(sizes)
    assert torch.equal(take_batch((torch.arange(5), torch.arange(5)), 2)[1], torch.arange(2))
