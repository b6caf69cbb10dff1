"""Forecast next to measurement: what a planned run's plan forecast, held against what it
measured, per stage and in total (docs/cli.md, ``run --json``).

The forecast is the cost planner's (:meth:`elastune.planners.cost.PlanReport.forecast`): each
stage's end, seconds from the job's start (p50, p95), and the JCT and cost (p50, p95). The run notes
when each stage ends; a stage's measured time runs from the end of the stage before it in
its bracket (the job's start for the first) to its own end, and its measured cost is that
time at what the plan's nodes of the stage cost per second. The measured JCT is the job's
``wall_seconds``. A stage that took more than :data:`CONTRADICTS` times as long as forecast,
or less than a third, contradicts the profile: it is listed with both numbers.

Example:
    >>> forecast = {"jct_s": {"p50": 10.0, "p95": 12.0}, "cost_usd": {"p50": 0.0, "p95": 0.0},
    ...     "stages": {"b0-r0": {"end_s": {"p50": 10.0, "p95": 12.0}, "cost_usd": 0.0,
    ...                          "usd_per_s": 0.001}}}
    >>> check = ForecastCheck(forecast)
    >>> check.stage_done(0, 0, 40.0)
    >>> check.measured(41.0)["stages"]["b0-r0"]
    {'end_s': 40.0, 'seconds': 40.0, 'cost_usd': 0.04}
    >>> check.contradictions()
    [{'stage': 'b0-r0', 'forecast_s': 10.0, 'measured_s': 40.0, 'ratio': 4.0}]
"""

from __future__ import annotations

from typing import Any

CONTRADICTS = 3.0  # measured over forecast stage time, either way, that contradicts the profile


class ForecastCheck:
    """A planned run's forecast and the stage ends it has measured so far."""

    def __init__(self, forecast: dict[str, Any]):
        self.forecast = forecast
        self.ends: dict[str, float] = {}

    def stage_done(self, bracket: int, rung: int, seconds: float) -> None:
        """The stage ended ``seconds`` after the job's start."""
        self.ends[f"b{bracket}-r{rung}"] = round(seconds, 3)

    def _seconds(self, name: str, ends: dict[str, float]) -> float:
        """The stage's time: from the previous stage of its bracket (or 0) to its end."""
        bracket, rung = name.split("-")
        before = ends.get(f"{bracket}-r{int(rung[1:]) - 1}", 0.0)
        return ends[name] - before

    def measured(self, wall_seconds: float | None = None) -> dict[str, Any]:
        """What the run measured: each ended stage's end, time and cost, and, once the job
        ended, its JCT (``wall_seconds``) and cost."""
        stages: dict[str, Any] = {}
        for name, end in self.ends.items():
            seconds = self._seconds(name, self.ends)
            rate = self.forecast["stages"][name]["usd_per_s"]
            stages[name] = {"end_s": end, "seconds": round(seconds, 3), "cost_usd": rate * seconds}
        out: dict[str, Any] = {"stages": stages}
        if wall_seconds is not None:
            out["jct_s"] = wall_seconds
            out["cost_usd"] = round(sum(s["cost_usd"] for s in stages.values()), 6)
        return out

    def contradictions(self) -> list[dict[str, Any]]:
        """Stages whose measured time is over :data:`CONTRADICTS` times the forecast (p50)
        or under a third of it, with both numbers."""
        p50 = {name: s["end_s"]["p50"] for name, s in self.forecast["stages"].items()}
        out = []
        for name in self.ends:
            forecast, measured = self._seconds(name, p50), self._seconds(name, self.ends)
            ratio = measured / forecast if forecast > 0 else float("inf")
            if not 1 / CONTRADICTS <= ratio <= CONTRADICTS:
                out.append(
                    {
                        "stage": name,
                        "forecast_s": round(forecast, 3),
                        "measured_s": round(measured, 3),
                        "ratio": round(ratio, 3),
                    }
                )
        return out

    def verdict(self, wall_seconds: float) -> str:
        """Where the measured JCT fell: ``within p50`` (at most the p50), ``within p95``
        or ``above p95``."""
        jct = self.forecast["jct_s"]
        if wall_seconds <= jct["p50"]:
            return "within p50"
        return "within p95" if wall_seconds <= jct["p95"] else "above p95"

    def to_markdown(self, wall_seconds: float | None = None) -> str:
        """The forecast and the measurement side by side, stage by stage and in total."""
        measured = self.measured(wall_seconds)["stages"]
        lines = [
            "| stage | forecast end p50 (s) | p95 (s) | measured end (s) "
            "| forecast cost ($) | measured cost ($) |",
            "|---|---|---|---|---|---|",
        ]
        for name, f in self.forecast["stages"].items():
            m = measured.get(name)
            end, cost = ("-", "-") if m is None else (f"{m['end_s']:.1f}", f"{m['cost_usd']:.4f}")
            lines.append(
                f"| {name} | {f['end_s']['p50']:.1f} | {f['end_s']['p95']:.1f} | {end} "
                f"| {f['cost_usd']:.4f} | {cost} |"
            )
        jct = self.forecast["jct_s"]
        total = "running" if wall_seconds is None else f"{wall_seconds:.1f} s"
        lines.append(
            f"\nJCT forecast p50 {jct['p50']:.1f} s, p95 {jct['p95']:.1f} s; measured {total}"
            + ("" if wall_seconds is None else f" ({self.verdict(wall_seconds)})")
        )
        for c in self.contradictions():
            lines.append(
                f"\nstage {c['stage']} took {c['measured_s']:.1f} s against {c['forecast_s']:.1f}"
                f" s forecast ({c['ratio']:.2f}x): the profile does not describe this run"
            )
        return "\n".join(lines)
