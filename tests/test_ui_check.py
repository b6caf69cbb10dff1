"""The Prefect UI served by `prefect server start` shows the three deployments of
prefect.yaml and the nightly schedule (infra/ui_check.py), and after a job run from the
`tune` deployment the Prefect and MLflow UIs show its story (infra/ui_job.py); both read by
headless Chromium."""

from __future__ import annotations

import pytest

from elastune.infra.ui_check import CHROMIUM, Expected, cron_text, deploy_and_check, read_page
from elastune.infra.ui_job import check_job_ui


def test_cron_text_describes_a_daily_cron_as_the_ui_does() -> None:
    assert cron_text("0 2 * * *") == "At 02:00 AM"
    assert cron_text("30 14 * * *") == "At 02:30 PM"
    assert cron_text("5 0 * * *") == "At 12:05 AM"
    with pytest.raises(ValueError, match="only daily"):
        cron_text("0 2 * * 1")


@pytest.mark.slow
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"{CHROMIUM} not found: the UI check needs Chromium (apt-get install -y chromium)",
)
def test_the_ui_shows_the_three_deployments_and_the_nightly_schedule(tmp_path) -> None:
    report = deploy_and_check(tmp_path / "ui.png")

    assert report.missing == [], "\n".join(report.lines())
    assert [page.url.split("/", 3)[3] for page in report.pages] == ["deployments", "v2/deployments"]
    for page in report.pages:
        assert {"tune", "tune-nightly", "train-segment"} <= set(page.deployments)
        assert page.schedules["tune-nightly", "At 02:00 AM"] is not None
    assert report.screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The same rendered pages fail a check for what was not deployed.
    undeployed = Expected(
        ["tune", "tune-nightly", "train-segment", "tune-weekly"],
        {"tune": ["At 02:00 AM"], "tune-nightly": ["At 03:00 AM"]},
    )
    for page in report.pages:
        assert read_page(page.url, page.texts, undeployed).missing == [
            "deployment 'tune-weekly'",
            "schedule 'At 02:00 AM' of 'tune'",
            "schedule 'At 03:00 AM' of 'tune-nightly'",
        ]


@pytest.mark.slow
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"{CHROMIUM} not found: the UI check needs Chromium (apt-get install -y chromium)",
)
def test_the_uis_tell_a_finished_jobs_story(tmp_path) -> None:
    views = check_job_ui(tmp_path)

    assert [v.name for v in views] == [
        "prefect-logs",
        "prefect-task-runs",
        "prefect-artifacts",
        "mlflow-runs",
    ]
    assert [gap for view in views for gap in view.missing] == []
    logs, tasks, _, mlflow = views
    job_id = logs.expected[0]
    assert f"job {job_id} done" in logs.shown and "promoted from rung 0" in logs.shown
    assert len(tasks.shown) == 6  # 6 segments, each a task run named after its trial
    assert set(mlflow.shown) == {job_id, *(f"trial-{t}" for t in range(5))}
    for view in views:
        png = tmp_path / f"{view.name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 400_000
