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
