"""A trainable that replays an LCBench learning curve instead of training.

The YAHPO Gym surrogate (``elastune.planners.sim.lcbench``) predicts each epoch's validation
accuracy for the configuration; this trainable reports those values epoch by epoch and checkpoints
its progress, so a whole job of ``examples/lcbench.yaml`` runs through Prefect, MLflow and
Optuna in seconds, with real promotions resuming from checkpoints. The OpenML task comes
from ``$LCBENCH_TASK`` (default 3945).
"""

from __future__ import annotations

import os
from typing import Any

from elastune.planners.sim import LCBenchSurrogate


def train(config: dict[str, Any], ctx: Any) -> None:
    curve = LCBenchSurrogate(os.environ.get("LCBENCH_TASK", "3945")).curve(config)
    start = ctx.restore()  # the epoch the checkpoint reached, or 0
    for epoch in ctx.range(start):
        ctx.report(val_accuracy=curve.metric[epoch - 1])
    ctx.checkpoint()  # nothing to save but the progress itself
