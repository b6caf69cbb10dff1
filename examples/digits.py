"""A small CNN on scikit-learn's digits (ships with the package: no download).

Resource = epochs. Every draw comes from the trial's own generators (``ctx.seeded`` for the
initial weights, ``ctx.generator(epoch)`` for dropout masks, ``ctx.batches`` for shuffling),
never from torch's process-wide one, so segments training side by side in threads do not
change each other's results, and a trial resumed from its checkpoint trains exactly as one
that never stopped.

Data-parallel (``train.distributed = True``): on a segment of ``g`` GPUs each of the ``g``
processes trains on its slice of every global batch of ``batch_size`` (``ctx.batches``) and
DistributedDataParallel averages the gradients, so the training does not depend on ``g``.
The last incomplete batch of each epoch is dropped to keep the global batch fixed.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from sklearn.datasets import load_digits
from torch import nn

from elastune.tasks.context import TrialContext
from elastune.tasks.distributed import mean_across_ranks


@lru_cache(maxsize=1)
def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed 80/20 split of the 1797 8x8 images, pixels scaled to [0, 1]."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    cut = int(0.8 * len(y))
    return x[:cut], y[:cut], x[cut:], y[cut:]


class Dropout(nn.Module):
    """Dropout whose masks come from ``generator`` (set per epoch) rather than the global one."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.rand(x.shape, generator=self.generator).to(x.device) >= self.p
        return x * keep / (1 - self.p)


class Net(nn.Module):
    def __init__(self, width: int, dropout: float = 0.0):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
        )
        self.dropout = Dropout(dropout)
        self.head = nn.Sequential(nn.Flatten(), self.dropout, nn.Linear(16 * width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def train(config: dict, ctx: TrialContext) -> None:
    x_train, y_train, x_val, y_val = (t.to(ctx.device) for t in data())
    with ctx.seeded():
        model = Net(int(config["width"]), float(config.get("dropout", 0.0))).to(ctx.device)
    if config.get("optimizer", "adam") == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    batches = ctx.batches(len(y_train), int(config.get("batch_size", 64)), seed=ctx.seed)
    loss_fn = nn.CrossEntropyLoss()

    start = ctx.restore(model=model, optimizer=optimizer)
    parallel = ctx.wrap(model)
    for epoch in ctx.range(start):
        model.dropout.generator = ctx.generator(epoch)
        parallel.train()
        for step in range((epoch - 1) * len(batches), epoch * len(batches)):
            idx = batches.batch(step).to(ctx.device)
            optimizer.zero_grad()
            loss = loss_fn(parallel(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            val_loss = loss_fn(logits, y_val).item()
            accuracy = (logits.argmax(1) == y_val).float().mean().item()
        train_loss = mean_across_ranks(loss.detach())  # a collective: every rank calls it
        ctx.report(val_accuracy=accuracy, val_loss=val_loss, train_loss=train_loss)
        ctx.checkpoint(model=model, optimizer=optimizer)


train.distributed = True  # type: ignore[attr-defined]
