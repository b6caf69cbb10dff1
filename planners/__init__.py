"""Planning: pure Python (no Prefect, no MLflow), testable in milliseconds.

One package per concern; each imports only those listed before it:

- ``samplers``: Optuna samplers of elastune's own (multi-fidelity TPE);
- ``spec``: the job file, validated (model, loader, search space, rung geometry);
- ``search``: schedulers, the tuning loop that couples one with Optuna, and its journal;
- ``staging``: the staged plan, the speed profile, Fluid packing, placement on nodes;
- ``sim``: whole jobs in simulated time on learning-curve benchmarks (LCBench);
- ``cost``: the cost planner (catalog, billing, plan simulator, RubberBand, SEER), which
  uses ``spec`` and ``staging``;
- ``execution``: a job compiled once into what runs (staged plan, admission, mode), with
  the cost planner when the job is planned.

Example (a job file's SHA ladder, compiled to the stages of its plan):
    >>> from elastune.planners.spec import parse_job
    >>> from elastune.planners.staging import compile_plan
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 27}})
    >>> [(stage.trials, stage.stop) for stage in compile_plan(spec).stages]
    [(27, 1), (9, 3), (3, 9), (1, 27)]
"""
