"""benchmarks/tuners.py: each installed peer runs through its own library on the simulated
clock and yields the metrics; a peer that restarts pays for retraining, one that continues
does not; the one-epoch baseline keeps the best of each round. A peer whose library is
missing (an install without the ``bench`` extra) is skipped, saying which."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import tuners
from benchmarks.baselines import OneEpoch
from benchmarks.peers import PEERS, missing
from benchmarks.peers.adapters import Ask, Continuing, Restarting
from elastune.planners.search import Result
from elastune.planners.sim import Curve, simulate
from elastune.planners.spec import parse_job

TASK = "3945"


@pytest.mark.parametrize("method", tuners.METHODS)
def test_each_installed_peer_runs_and_is_measured(method: str) -> None:
    if method != tuners.DEFAULT and (why := missing(PEERS[method])) is not None:
        pytest.skip(f"{method}: {why}")
    run = tuners.run_one(TASK, method, seed=0, workers=2, horizon=1.0)
    assert run["trials_started"] > 0 and run["segments_run"] >= run["trials_started"]
    facts = tuners.task_facts(TASK)
    seen = run["best_at"]["1"]
    assert seen is not None and facts["worst"] <= seen
    assert 0 <= tuners.regret(seen, facts) < 1
    assert run["reached"] == (run["time_to_target"] <= 1.0)


def test_the_summary_ranks_every_method_on_common_cells() -> None:
    runs = [
        {"task": "t", "seed": s, "method": m, "best_at": {"1": v}, "reached": v >= 99,
         "time_to_target": 0.5 if v >= 99 else math.inf, "cpu_seconds": 0.1}
        for s, values in enumerate([(99.0, 90.0), (95.0, 95.0)])
        for m, v in zip(["a", "b"], values, strict=True)
    ]  # fmt: skip
    runs.append({**runs[0], "task": "u"})  # a cell that only "a" ran: left out of the ranks
    facts = {"t": {"best": 100.0, "worst": 80.0}, "u": {"best": 100.0, "worst": 80.0}}
    summary = tuners.summarise(runs, ["a", "b"], facts)
    assert summary["a"]["mean_rank"]["1"] == 1.25 and summary["b"]["mean_rank"]["1"] == 1.75
    assert summary["b"]["normalized_regret"]["1"] == pytest.approx((0.5 + 0.25) / 2)
    assert summary["a"]["reached"] == 2 and summary["b"]["reached"] == 0
    assert math.isinf(summary["b"]["median_time_to_target"])
    assert summary["a"]["median_time_to_target_where_reached"] == 0.5
    assert summary["a"]["median_best_at_deadline_pct"] == 99.0  # 99, 95 and 99 of 100
    assert summary["b"]["median_best_at_deadline_pct"] == 92.5


def test_the_head_to_head_counts_the_cells_both_ran() -> None:
    runs = [
        {"task": t, "seed": 0, "method": m, "best_at": {"1": 90.0, "10": v}}
        for t, values in [("t", (99.0, 98.0)), ("u", (97.0, 97.0)), ("v", (96.0, 98.0))]
        for m, v in zip([tuners.DEFAULT, "peer"], values, strict=True)
    ]  # fmt: skip
    runs.append({**runs[0], "task": "w"})  # the peer did not run it
    assert tuners.head_to_head(runs, [tuners.DEFAULT, "peer"]) == {
        "peer": {"better": 1, "worse": 1}
    }


def test_a_variant_of_the_default_is_ranked_among_the_peers_alone() -> None:
    variant = next(iter(tuners.VARIANTS))
    runs = [
        {"task": "t", "seed": 0, "method": m, "best_at": {"1": v}, "reached": False,
         "time_to_target": math.inf, "cpu_seconds": 0.1}
        for m, v in [(tuners.DEFAULT, 99.0), (variant, 98.0), ("peer", 97.0)]
    ]  # fmt: skip
    facts = {"t": {"best": 100.0, "worst": 80.0}}
    ranks = {
        m: row["mean_rank"]["1"]
        for m, row in tuners.summarise(runs, [tuners.DEFAULT, variant, "peer"], facts).items()
    }
    # Among three the variant would rank 2nd and the peer 3rd; each default-like row stands
    # alone against the peers, and the peers are ranked against the default.
    assert ranks == {tuners.DEFAULT: 1.0, variant: 1.0, "peer": 2.0}
    assert tuners.chosen_methods(None) == tuners.METHODS  # variants only when named
    assert tuners.chosen_methods(["the default"]) == [variant]


def test_the_command_prints_the_table_and_writes_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tuners, "RESULTS", tmp_path)
    argv = ["--tasks", TASK, "--seeds", "1", "--workers", "1", "--horizon", "1", "--jobs", "1"]
    payload = tuners.main([*argv, "--methods", "elastune", "one", "--name", "t"])
    out = capsys.readouterr().out
    assert "| **elastune default (bloom + mf-tpe)** |" in out and "| one epoch, top 3 |" in out
    assert (tmp_path / "tuners_t.json").exists() and (tmp_path / "tuners_t.png").exists()
    again = tuners.main(
        [*argv, "--methods", "elastune", "--merge", str(tmp_path / "tuners_t.json")]
    )
    assert again["results"]["1"].keys() == payload["results"]["1"].keys()  # merged back in
    capsys.readouterr()
    tuners.main(["--report", str(tmp_path / "tuners_t.json"), "--tasks", TASK])
    assert "| one epoch, top 3 |" in capsys.readouterr().out  # the stored runs, none run
    with pytest.raises(SystemExit, match="holds no run on the tasks chosen"):
        tuners.main(["--report", str(tmp_path / "tuners_t.json"), "--tasks", "held-out"])


class Toy:
    """Accuracy 50 + x * epochs (one second an epoch)."""

    name, max_resource, table = "toy", 9, None

    def curve(self, config: Any) -> Curve:
        return Curve([50 + config["x"] * e for e in range(1, 10)], [float(e) for e in range(1, 10)])


SPEC = parse_job({
    "name": "toy", "trainable": "m:f", "metric": "acc",
    "space": {"x": {"type": "float", "low": 0, "high": 1}},
    "scheduler": {"name": "random", "max_resource": 9},
})  # fmt: skip


class Promoter:
    """A restarting peer that asks for one configuration at 3 epochs, then at 9."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.told: list[float] = []

    def ask(self) -> Ask:
        epochs = 3 if not self.asked else 9
        self.asked.append(epochs)
        return Ask({"x": 0.5}, epochs, len(self.asked))

    def tell(self, token: Any, error: float, seconds: float) -> None:
        self.told.append(seconds)


def test_a_restarting_peer_pays_for_retraining_a_promoted_configuration() -> None:
    peer = Promoter()
    scheduler = Restarting(peer, 9, error=lambda loss: -loss)
    run = simulate(SPEC, Toy(), workers=1, seed=0, deadline=12.0, scheduler=scheduler, fast=True)
    assert peer.asked[:2] == [3, 9] and peer.told[:2] == [3.0, 9.0]  # 9 epochs from scratch
    assert run.time_to(54.5) == 12.0  # 3 + 9 simulated seconds to the 9th epoch


class Keeper:
    """A continuing peer that keeps every trial of configuration x = 0.5."""

    def __init__(self) -> None:
        self.reports: list[int] = []

    def start(self) -> tuple[dict[str, float], int]:
        return {"x": 0.5}, 0

    def report(self, token: Any, epoch: int, error: float) -> bool:
        self.reports.append(epoch)
        return True

    def complete(self, token: Any, epoch: int, error: float) -> None:
        self.reports.append(epoch)


def test_a_continuing_peer_hears_every_epoch_and_trains_each_once() -> None:
    peer = Keeper()
    scheduler = Continuing(peer, [1, 3, 9], error=lambda loss: -loss)
    run = simulate(SPEC, Toy(), workers=1, seed=0, deadline=9.0, scheduler=scheduler, fast=True)
    assert peer.reports == list(range(1, 10))
    assert run.time_to(54.5) == 9.0


def test_one_epoch_keeps_the_best_of_each_round_and_resumes_them() -> None:
    one = OneEpoch(9, screen=3, keep=1)
    first = [one.next_segment() for _ in range(3)]
    assert all(s is not None and (s.start, s.stop) == (0, 1) for s in first)
    losses = zip(first, [0.3, 0.1, 0.2], strict=True)
    actions = [one.on_result(Result(s.trial, 1, loss)) for s, loss in losses]
    assert [d.action.value for d in actions[-1]] == ["stop", "promote", "stop"]
    resumed = one.next_segment()
    assert (resumed.trial, resumed.start, resumed.stop) == (1, 1, 9)
    with pytest.raises(ValueError, match=r"keep must lie in 1\.\.screen=3, got 4"):
        OneEpoch(9, screen=3, keep=4)
