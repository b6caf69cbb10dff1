"""The plan as a Gantt chart: instances over time, the trials on them, spend and deadline.

One row per instance (grouped by bracket, labelled with its type, and "spot" for a spot
instance); within a row each trial's segment is a box as tall as its share of the node's
GPUs, coloured by stage and cross-hatched on spot instances. The hatched part of a row is
the startup and queueing the instance is billed for before it is ready. Below, the money
spent so far and the GPUs held. Times are the plan played once with mean times and no
spot interruption (the nominal trace); the title gives the Monte Carlo p50/p95, which
include them, and the legend every spot stage's expected interruptions.

This module imports matplotlib (Agg backend), so ``elastune.planners.cost`` does not.

Example:
    >>> import tempfile, pathlib
    >>> from elastune.planners.spec import parse_job
    >>> from elastune.planners.cost import plan_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9},
    ...     "budget": {"deadline": "1h"}, "compute": {"instance_types": ["g5.12xlarge"]},
    ...     "profile": {"seconds_per_unit": {1: 120}, "speedup": {2: 1.8, 4: 3.2}}})
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "plan.png"
    >>> draw_gantt(plan_job(spec), path) == path and path.stat().st_size > 10_000
    True
    >>> import shutil; shutil.rmtree(path.parent)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Patch, Rectangle

from elastune.planners.cost.montecarlo.trace import NodeSpan, Trace
from elastune.planners.cost.reports.plan_report import PlanReport, format_duration

_PAD = 0.08  # vertical gap between instance rows, in row heights


def _scale(seconds: float) -> tuple[float, str]:
    """Divisor and unit for the time axis."""
    return (3600.0, "hours") if seconds > 3 * 3600 else (60.0, "minutes")


def draw_gantt(report: PlanReport, path: str | Path) -> Path:
    """Draw ``report``'s plan to a PNG at ``path`` and return the path."""
    trace = report.trace
    if trace is None:
        raise ValueError("the report has no trace to draw")
    path = Path(path)
    nodes = sorted(trace.nodes, key=lambda n: (n.bracket, n.requested, n.node))
    horizon = max(trace.jct, report.deadline_s or 0.0, float(report.outcome.jct_q))
    unit, unit_name = _scale(horizon)

    stages = sorted({(s.bracket, s.rung) for s in trace.segments})
    palette = plt.get_cmap("tab20" if len(stages) > 10 else "tab10")
    colour = {stage: palette(i % palette.N) for i, stage in enumerate(stages)}

    height = min(2.6 + 0.22 * len(nodes), 40.0)
    fig, (ax, spend_ax) = plt.subplots(
        2,
        1,
        figsize=(13, height + 2.4),
        sharex=True,
        gridspec_kw={"height_ratios": [height, 2.4], "hspace": 0.08},
    )
    _draw_instances(ax, trace, nodes, colour, unit, horizon)
    _label_rows(ax, nodes, len(report.plan.chains) > 1, horizon * 1.06 / unit)
    _mark_times(ax, spend_ax, report, unit)
    _draw_spend(spend_ax, report, trace, nodes, (unit, unit_name))
    _draw_legend(ax, report, colour, nodes)
    fig.suptitle(_dollars(_title(report)), fontsize=11, x=0.01, ha="left")
    fig.subplots_adjust(top=1 - 0.55 / (height + 2.4))  # title close to the chart
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _draw_instances(
    ax: Axes,
    trace: Trace,
    nodes: list[NodeSpan],
    colour: dict[tuple[int, int], Any],
    unit: float,
    horizon: float,
) -> None:
    """One row per instance: its billed lifetime (hatched while starting), then the
    trials on it, each a box as tall as its share of the node's GPUs."""
    row = {n.node: i for i, n in enumerate(nodes)}

    def box(start: float, end: float, top: float, tall: float, **style: object) -> None:
        """A box over seconds ``start``..``end``, ``tall`` row heights from ``top``."""
        ax.add_patch(Rectangle((start / unit, top), (end - start) / unit, tall, **style))

    for n in nodes:
        y = row[n.node] + _PAD / 2
        lifetime = {"facecolor": "#f2f2f2", "edgecolor": "#bbbbbb", "linewidth": 0.5}
        box(n.requested, n.released, y, 1 - _PAD, **lifetime)
        startup = {"facecolor": "none", "edgecolor": "#999999", "hatch": "////", "linewidth": 0}
        box(n.requested, n.ready, y, 1 - _PAD, **startup)
    by_node = {n.node: n for n in nodes}
    named = set()  # stages already labelled
    for s in trace.segments:
        gpus = by_node[s.node].gpus
        top = row[s.node] + _PAD / 2 + (1 - _PAD) * s.offset / gpus
        tall = (1 - _PAD) * s.gpus / gpus
        spot = by_node[s.node].market == "spot"
        box(
            s.start,
            s.end,
            top,
            tall,
            facecolor=colour[(s.bracket, s.rung)],
            edgecolor="white",
            linewidth=0.4,
            hatch="x" if spot else None,
        )
        # Name each stage once, on its first box with room for the name.
        if (s.bracket, s.rung) not in named and s.end - s.start > 0.06 * horizon and tall >= 0.45:
            named.add((s.bracket, s.rung))
            ax.text(
                (s.start + s.end) / 2 / unit,
                top + tall / 2,
                f"b{s.bracket}-r{s.rung}",
                color="white",
                fontsize=7,
                ha="center",
                va="center",
            )


def _label_rows(ax: Axes, nodes: list[NodeSpan], several: bool, right: float) -> None:
    """Label every instance when they fit, else every k-th; brackets separated (and named
    when there are ``several``); the time axis runs to ``right``."""
    step = max(1, len(nodes) // 60)
    ax.set_yticks([i + 0.5 for i in range(0, len(nodes), step)])
    ax.set_yticklabels(
        [
            (f"b{nodes[i].bracket} · " if several else "")
            + f"{nodes[i].instance_type} #{i}"
            + (" spot" if nodes[i].market == "spot" else "")
            for i in range(0, len(nodes), step)
        ],
        fontsize=7,
    )
    for i in range(1, len(nodes)):
        if nodes[i].bracket != nodes[i - 1].bracket:
            ax.axhline(i, color="#555555", linewidth=0.8)
    ax.set_ylim(len(nodes), 0)
    ax.set_xlim(0, right)
    ax.set_ylabel("instances")
    ax.grid(axis="x", color="#dddddd", linewidth=0.5)
    ax.set_axisbelow(True)


def _mark_times(ax: Axes, spend_ax: Axes, report: PlanReport, unit: float) -> None:
    """The p95 JCT and the deadline as vertical lines across both charts."""
    p95 = report.outcome.summary(report.outcome.jct)["p95"]
    marks = [(p95, "#333333", ":", f"p95 JCT {format_duration(p95)}")]
    if report.deadline_s:
        deadline = format_duration(report.deadline_s)
        marks.append((report.deadline_s, "#d62728", "--", f"deadline {deadline}"))
    # Labels run up the lines, the earlier on its left and the later on its right.
    for index, (at, col, style, label) in enumerate(sorted(marks)):
        for axis in (ax, spend_ax):
            axis.axvline(at / unit, color=col, linestyle=style, linewidth=1.4)
        ax.text(
            at / unit,
            0.15,
            f" {label} ",
            color=col,
            fontsize=8,
            rotation=90,
            va="top",
            ha="right" if index == 0 and len(marks) > 1 else "left",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )


def _draw_spend(
    spend_ax: Axes,
    report: PlanReport,
    trace: Trace,
    nodes: list[NodeSpan],
    scale: tuple[float, str],
) -> None:
    """Money spent so far (list price accrues while instances are held; the billed total
    closes it), the budget, and the GPUs held; ``scale`` is the time axis' unit."""
    unit, unit_name = scale
    times = np.linspace(0, trace.jct, 400)
    held = np.zeros_like(times)
    spent = np.zeros_like(times)
    for n in nodes:
        alive = (times >= n.requested) & (times < n.released)
        held += alive * n.gpus
        spent += (
            report.catalog.get(n.instance_type).price(n.market)
            / 3600
            * np.clip(times - n.requested, 0, None).clip(max=n.released - n.requested)
        )
    priced = "list and spot prices" if any(n.market == "spot" for n in nodes) else "list price"
    spend_ax.plot(times / unit, spent, color="#1f77b4", linewidth=1.6, label=f"spent ({priced})")
    spend_ax.plot([trace.jct / unit], [trace.cost], "o", color="#1f77b4")
    spend_ax.annotate(
        _dollars(f"billed ${trace.cost:,.2f} (mean times)"),
        (trace.jct / unit, trace.cost),
        textcoords="offset points",
        xytext=(6, -4),
        fontsize=8,
        color="#1f77b4",
    )
    top = _draw_budget(spend_ax, report.budget_usd, trace.cost)
    spend_ax.set_ylabel("USD spent")
    spend_ax.set_ylim(0, top)
    gpu_ax = spend_ax.twinx()
    held_label = f"{report.devices} held"
    gpu_ax.step(times / unit, held, where="post", color="#7f7f7f", linewidth=1, label=held_label)
    gpu_ax.set_ylabel(held_label, color="#7f7f7f")
    gpu_ax.set_ylim(0, max(held.max(), 1) * 1.15)
    spend_ax.set_xlabel(f"time since submission ({unit_name})")
    spend_ax.grid(axis="x", color="#dddddd", linewidth=0.5)
    handles = spend_ax.get_legend_handles_labels()[0] + gpu_ax.get_legend_handles_labels()[0]
    spend_ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.07, 1.0), fontsize=8, frameon=False
    )


def _draw_budget(spend_ax: Axes, budget: float | None, billed: float) -> float:
    """The budget on the spend chart; returns the chart's top in dollars."""
    top = billed * 1.25 or 1.0
    if budget and budget <= 2.5 * billed:
        top = max(top, budget * 1.1)
        spend_ax.axhline(budget, color="#d62728", linestyle="--", linewidth=1)
    if budget:
        # A budget far above the spend would flatten the curve: say it instead of drawing it.
        shown = budget <= top
        text = _dollars(f"budget ${budget:,.2f}") + ("" if shown else " (off scale)")
        spend_ax.text(
            0.5,
            budget / top if shown else 0.97,
            text,
            transform=spend_ax.transAxes,
            color="#d62728",
            fontsize=8,
            ha="center",
            va="bottom" if shown else "top",
        )
    return top


def _draw_legend(
    ax: Axes, report: PlanReport, colour: dict[tuple[int, int], Any], nodes: list[NodeSpan]
) -> None:
    """Every stage's allocation, the startup hatching and, with spot nodes, their crosses."""
    legend = []
    for stage, allocation in _stage_labels(report).items():
        legend.append(Patch(facecolor=colour.get(stage, "#cccccc"), label=allocation))
    legend.append(Patch(facecolor="#f2f2f2", edgecolor="#999999", hatch="////", label="starting"))
    if any(n.market == "spot" for n in nodes):
        legend.append(
            Patch(
                facecolor="#bbbbbb",
                edgecolor="#333333",
                hatch="xx",
                label="on spot (chart: no interruptions;\np50/p95: with them)",
            )
        )
    ax.legend(
        handles=legend,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
        title=f"stage · trials × {report.devices} · instances",
        title_fontsize=8,
    )


def _title(report: PlanReport) -> str:
    """The planner, the Monte Carlo p50/p95 of JCT and cost, and the verdict."""
    jct = report.outcome.summary(report.outcome.jct)
    cost = report.outcome.summary(report.outcome.cost)
    verdict = "feasible" if report.feasible else "INFEASIBLE"
    return (
        f"elastune plan ({report.planner}): JCT p50 {format_duration(jct['p50'])} / "
        f"p95 {format_duration(jct['p95'])}, cost p50 ${cost['p50']:,.2f} / "
        f"p95 ${cost['p95']:,.2f}, {verdict}"
    )


def _dollars(text: str) -> str:
    """``$`` starts maths in matplotlib text; escape it."""
    return text.replace("$", r"\$")


def _stage_labels(report: PlanReport) -> dict[tuple[int, int], str]:
    """Legend text per stage: its name, trials × GPUs per tier, its instances, and on spot
    the interruptions expected while it trains."""
    labels: dict[tuple[int, int], str] = {}
    for stage, outcome in zip(report.plan.stages, report.outcome.stages, strict=True):
        tiers = " + ".join(f"{t.trials}×{t.gpus:g}" for t in stage.tiers)
        spot = ""
        if stage.market == "spot":
            spot = f" spot ({outcome.interruptions:.2f} interruptions)"
        labels[(stage.bracket, stage.rung)] = (
            f"{stage.name} · {tiers} · {stage.instance_type} × {stage.instances}{spot}"
        )
    return labels
