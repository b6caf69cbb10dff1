"""Work-pool mode against a real `prefect server`: warm node workers (`flows/segment.py`,
started as `elastune.infra.local_cluster` does), and a flow run per segment on `prefect worker
--type process`."""

from __future__ import annotations

import itertools
import json
import traceback

import pytest
from mlflow import MlflowClient
from prefect.artifacts import Artifact
from prefect.client.orchestration import PrefectClient

import elastune.flows.warm_pool
from elastune.flows.cli import main
from elastune.infra.local_cluster import create_warm_pool
from elastune.infra.prefect_pools import read_pool
from tests.helpers.jobs import create_pool, write_job
from tests.helpers.prefect_server import running_worker, segment_runs, warm_nodes

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def test_segments_run_on_warm_nodes_one_per_free_slot(
    prefect_api, tmp_path, stores, capsys, monkeypatch
) -> None:
    # Epochs that take a while, so that two segments on one node would overlap.
    monkeypatch.setenv("ELASTUNE_TEST_PIDS", str(tmp_path / "pids.log"))
    monkeypatch.setenv("ELASTUNE_TEST_SPANS", str(tmp_path / "spans.log"))
    monkeypatch.setenv("ELASTUNE_TEST_EPOCH_SECONDS", "0.5")
    job = write_job(tmp_path, trainable="tests.trainables:pid_logged_quadratic")
    built: list[set[str]] = []  # the functions on the stack where each async client was built
    init = PrefectClient.__init__

    def building(self, *args, **kwargs) -> None:
        built.append({frame.name for frame in traceback.extract_stack()})
        init(self, *args, **kwargs)

    monkeypatch.setattr(PrefectClient, "__init__", building)
    # A job before this one on the session's server left its launch client open.
    monkeypatch.setattr(elastune.flows.warm_pool, "_clients", {})
    with warm_nodes(prefect_api, tmp_path / "cluster", nodes=2, gpus_per_node=1, pool="warm"):
        code = main(["run", job, "--pool", "warm", "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "pool: warm, warm workers on" in err
    summary = json.loads(out)
    assert summary["segments"] == 4 and summary["best"] is not None
    # The driver's launches share one client: otherwise Prefect builds one for every delay
    # and every wait, each with a new SSL context (about 25 ms).
    assert [names for names in built if "launch_client" in names]
    assert not [names for names in built if names & {"create_run", "wait_async"}]

    # Each segment was a background task run on a node, and the 2 workers the job had used
    # both nodes. The third segment of the first rung was handed out ahead and queued behind
    # one on its node (its run overlaps that one's), yet a node of 1 slot never trained two
    # at once: each node is one process, and its epochs never overlap.
    ours = segment_runs(summary["job_id"], warm=True)
    assert sorted(r.state_name for r in ours) == ["Completed"] * 4
    assert {t for run in ours for t in run.tags if t.startswith("node:")} == {
        "node:node-0",
        "node:node-1",
    }
    assert "workers = segments (as many more queued on nodes)" in err
    spans: dict[str, list[tuple[float, float]]] = {}
    for line in (tmp_path / "spans.log").read_text().splitlines():
        pid, began, ended, frozen = line.split()
        spans.setdefault(pid, []).append((float(began), float(ended)))
        # The node's imports are left out of its full collections (flows/segment.py).
        assert int(frozen) > 10_000, line
    assert len(spans) == 2
    for epochs in spans.values():
        epochs.sort()
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(epochs)), epochs
    assert_sized_and_recorded("warm", summary, tmp_path)


def test_a_hung_segment_on_a_warm_node_times_out_and_frees_its_node(
    prefect_api, tmp_path, stores, capsys
) -> None:
    job = write_job(
        tmp_path,
        trainable="tests.trainables:hangs_for_small_x",
        sampler={"name": "random", "seed": 1},
        scheduler={"name": "random", "max_resource": 1, "max_trials": 8},
        compute={"workers": 2, "segment_timeout": "2s"},
    )
    with warm_nodes(prefect_api, tmp_path / "cluster", nodes=2, gpus_per_node=1, pool="hung"):
        code = main(["run", job, "--pool", "hung", "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("pooled").experiment_id
    failed = client.search_runs([experiment], "tags.`elastune.status` = 'fail'")
    assert failed, "the seed must draw some x < 0.3"
    errors = [r.data.tags["elastune.error"] for r in failed]
    assert all("timeout: segment ran over 2 s" in e for e in errors), errors
    # The nodes were free again: the trials after the hung ones trained.
    assert summary["best"] is not None


def test_segments_run_as_flow_runs_and_the_limit_follows_the_plan(
    prefect_api, tmp_path, stores, capsys
) -> None:
    create_pool("train-pool")
    with running_worker(prefect_api, "train-pool", tmp_path / "worker"):
        code = main(["run", write_job(tmp_path), "--pool", "train-pool", "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["segments"] == 4 and summary["best"] is not None

    # Each segment was a flow run of the pool's train-segment deployment.
    ours = segment_runs(summary["job_id"])
    assert sorted(r.state_name for r in ours) == ["Completed"] * 4
    assert_sized_and_recorded("train-pool", summary, tmp_path)


def assert_sized_and_recorded(pool: str, summary: dict, tmp_path) -> None:
    """The pool's limit followed the plan stage by stage: 3 trials at rung 0 but 2 workers,
    then 1 trial; and was put back afterwards. Results and checkpoints came back through
    MLflow."""
    sizing = Artifact.get(f"{summary['job_id']}-pool-sizing")
    rows = [(r["stage"], r["after"]) for r in json.loads(sizing.data)]
    assert rows == [("b0-r0", 2), ("b0-r1", 1), ("release", "none")]
    assert read_pool(pool).concurrency_limit is None

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    finalist = client.get_run(
        client.search_runs(
            [client.get_experiment_by_name("pooled").experiment_id],
            "tags.`elastune.status` = 'complete'",
        )[0].info.run_id
    )
    history = client.get_metric_history(finalist.info.run_id, "epochs_trained")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
    ]


@pytest.mark.parametrize(
    ("pool", "pool_type", "message"),
    [
        ("no-such-pool", None, "work pool 'no-such-pool' not found"),
        ("ecs-pool", "ecs", "compute.ecs"),
        ("idle-pool", "process", "no worker polled work pool 'idle-pool'"),
        ("idle-warm", "elastune-warm", "no warm worker of pool 'idle-warm' alive"),
    ],
)
def test_pool_mistakes_are_bad_input(
    pool, pool_type, message, tmp_path, stores, capsys, monkeypatch
) -> None:
    monkeypatch.setattr("elastune.flows.pools.WORKER_TIMEOUT", 2.0)
    if pool_type == "elastune-warm":
        create_warm_pool(pool, tmp_path / "segments")
    elif pool_type:
        create_pool(pool, pool_type)
    code = main(["run", write_job(tmp_path), "--pool", pool, *stores])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1], err
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "optuna.db").exists()


def test_a_planned_job_on_warm_nodes_is_replanned_from_its_segments(
    prefect_api, tmp_path, stores, capsys, monkeypatch
) -> None:
    # The cost planner sizes each stage, and the job re-plans from the segments its nodes
    # train: their time on the node, not the wait for one.
    monkeypatch.setenv("ELASTUNE_TEST_EPOCH_SECONDS", "0.5")
    monkeypatch.setattr(elastune.flows.warm_pool, "_clients", {})
    profile = {"seconds_per_unit": {1: 0.5}, "overhead_s": 0.5, "job_overhead_s": 3.0}
    job = write_job(tmp_path, profile=profile, budget={"deadline": 600})
    with warm_nodes(prefect_api, tmp_path / "cluster", nodes=2, gpus_per_node=1, pool="plans"):
        code = main(["run", job, "--pool", "plans", "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["mode"]["planned"] and summary["mode"]["replanned"]
    assert summary["segments"] == 4 and summary["best"] is not None
    decisions = summary["replanning"]["decisions"]
    assert decisions, err  # at the first stage's first wave and its barrier
    assert not summary["replanning"]["deadline_at_risk"], json.dumps(decisions, indent=1)


def test_a_job_on_warm_nodes_stops_at_its_deadline(
    prefect_api, tmp_path, stores, capsys, monkeypatch
) -> None:
    # Segments of 27 epochs of 0.5 s, far past the deadline: the two training stop at their
    # next epoch on their nodes, and the two queued behind them start after it and train
    # nothing; every trial ends stopped, nothing is left running on the nodes.
    monkeypatch.setenv("ELASTUNE_TEST_PIDS", str(tmp_path / "pids.log"))
    monkeypatch.setenv("ELASTUNE_TEST_EPOCH_SECONDS", "0.5")
    monkeypatch.setattr(elastune.flows.warm_pool, "_clients", {})
    job = write_job(
        tmp_path,
        trainable="tests.trainables:pid_logged_quadratic",
        scheduler={"name": "random", "max_resource": 27, "max_trials": 8},
        budget={"deadline": 6},
    )
    with warm_nodes(prefect_api, tmp_path / "cluster", nodes=2, gpus_per_node=1, pool="due"):
        code = main(["run", job, "--pool", "due", "--json", *stores])
        out, err = capsys.readouterr()
        assert code == 0, err
        summary = json.loads(out)
        ours = segment_runs(summary["job_id"], warm=True)
        assert sorted(r.state_name for r in ours) == ["Completed"] * 4
    assert summary["deadline"] == {"seconds": 6.0, "passed": True, "segments_cut": 4}
    assert summary["trials"] == 4 and summary["wall_seconds"] < 27 * 0.5
    epochs: dict[int, list[int]] = {}
    for line in (tmp_path / "pids.log").read_text().splitlines():
        _, trial, epoch = map(int, line.split())
        epochs.setdefault(trial, []).append(epoch)
    assert len(epochs) == 2 and all(1 <= len(e) < 27 for e in epochs.values()), epochs
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("pooled").experiment_id
    runs = client.search_runs([experiment], "tags.`elastune.trial` != ''")
    assert (
        sorted((r.info.status, r.data.tags["elastune.status"]) for r in runs)
        == [("FINISHED", "stop")] * 4
    )
