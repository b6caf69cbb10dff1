"""A CNN sized for a GPU, on CIFAR-sized images made in memory (no download).

Ten classes, 3x32x32 images: each class is a fixed random template, and a sample is its
class's template, randomly scaled, plus as much noise. The task is learnable (a small
CNN passes 90% validation accuracy in a few epochs) and the data costs nothing to load, so
what a run measures is training.

Resource = epochs of ``samples`` images. A trial's randomness comes from its own generators
(``ctx.seeded``, ``ctx.generator``), never from torch's process-wide one, so segments that
train side by side in threads do not disturb each other's draws.

Example (one epoch of a narrow net on 256 images, on the CPU):
    >>> x, y, _, _ = data(256, "cpu")
    >>> model = Net(width=8)
    >>> model(x[:4]).shape
    torch.Size([4, 10])
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn

from elastune.tasks.context import TrialContext

CLASSES = 10
SHAPE = (3, 32, 32)
SAMPLES = 8192  # training images, an epoch's, unless the config says ``samples``


@lru_cache(maxsize=4)
def data(samples: int = SAMPLES, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """``samples`` training and ``samples // 4`` validation images on ``device``, fixed."""
    g = torch.Generator().manual_seed(0)
    templates = torch.randn(CLASSES, *SHAPE, generator=g)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, CLASSES, (n,), generator=g)
        scale = 0.5 + torch.rand(n, 1, 1, 1, generator=g)
        x = templates[y] * scale + torch.randn(n, *SHAPE, generator=g)
        return x, y

    x_train, y_train = draw(samples)
    x_val, y_val = draw(samples // 4)
    return tuple(t.to(device) for t in (x_train, y_train, x_val, y_val))


class Net(nn.Module):
    """Three conv blocks of ``width``, ``2 width`` and ``4 width`` channels, then a linear head."""

    def __init__(self, width: int = 32, dropout: float = 0.0):
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            )

        self.features = nn.Sequential(
            block(3, width), block(width, 2 * width), block(2 * width, 4 * width)
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(4 * width * 16, CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build(config: dict, device: torch.device) -> tuple[Net, torch.optim.Optimizer]:
    model = Net(int(config.get("width", 32)), float(config.get("dropout", 0.0))).to(device)
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=float(config["lr"]),
        momentum=0.9,
        weight_decay=float(config.get("weight_decay", 5e-4)),
    )
    return model, optimizer


def train_steps(
    model: Net,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """One epoch over ``x`` in shuffled batches; the last batch's loss (not synchronised)."""
    model.train()
    order = torch.randperm(len(y), generator=generator).to(x.device)
    loss = torch.zeros((), device=x.device)
    for begin in range(0, len(y) - batch_size + 1, batch_size):
        idx = order[begin : begin + batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
    return loss.detach()


def train(config: dict, ctx: TrialContext) -> None:
    x_train, y_train, x_val, y_val = data(int(config.get("samples", SAMPLES)), str(ctx.device))
    with ctx.seeded():
        model, optimizer = build(config, ctx.device)
    start = ctx.restore(model=model, optimizer=optimizer)
    batch_size = int(config.get("batch_size", 128))
    for epoch in ctx.range(start):
        # One generator per (trial, epoch): a resumed trial shuffles as one that never stopped.
        train_loss = train_steps(
            model, optimizer, x_train, y_train, batch_size, ctx.generator(epoch)
        )
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            accuracy = (logits.argmax(1) == y_val).float().mean().item()
        ctx.report(val_accuracy=accuracy, train_loss=train_loss.item())
        ctx.checkpoint(model=model, optimizer=optimizer)
