"""examples/lcbench.py: the replay trainable resumes from its checkpoint like real training."""

from __future__ import annotations

import io

import pytest

from elastune.planners.sim import LCBenchSurrogate, LCBenchTable
from elastune.tasks.context import TrialContext
from examples.lcbench import train


class MemoryTracker:
    """The three Tracker calls a TrialContext makes, kept in memory."""

    def __init__(self):
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.saved: list[tuple[float, bytes]] = []

    def log_history(self, run_id: str, reports: list[tuple[int, dict[str, float]]]) -> None:
        self.metrics.extend(reports)

    def save_checkpoint(self, run_id: str, payload: bytes, resource: float) -> None:
        self.saved.append((resource, payload))

    def load_checkpoint(self, run_id: str, loader):
        if not self.saved:
            return None
        resource, payload = self.saved[-1]
        return resource, loader(io.BytesIO(payload))


def test_a_promoted_segment_continues_the_curve_from_its_checkpoint():
    config = LCBenchTable("3945").table[0]
    tracker = MemoryTracker()
    for start, stop in [(0, 2), (2, 6)]:  # rung 0, then a promotion
        ctx = TrialContext(
            trial=0, start=start, stop=stop, max_resource=52, run_id="r", tracker=tracker
        )
        train(dict(config), ctx)
    curve = LCBenchSurrogate("3945").curve(config).metric
    assert [step for step, _ in tracker.metrics] == [1, 2, 3, 4, 5, 6]
    assert [m["val_accuracy"] for _, m in tracker.metrics] == pytest.approx(curve[:6])
    assert [resource for resource, _ in tracker.saved] == [2, 6]
