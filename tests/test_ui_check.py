"""The Prefect UI served by `prefect server start` shows the three deployments of
prefect.yaml and the nightly schedule (infra/ui_check.py, read by headless Chromium)."""

from __future__ import annotations

import pytest

from infra.ui_check import CHROMIUM, Expected, cron_text, deploy_and_check, read_page


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
