"""Does the Prefect UI show elastune's deployments and the nightly schedule?

``python -m elastune.infra.ui_check --out ui.png`` starts a real ``prefect server start`` on
127.0.0.1 (free port, its own temporary ``PREFECT_HOME``, UI on), creates the ``local-proc``
process pool, runs ``prefect --no-prompt deploy --all`` from the repository root, then opens
the UI's deployments page in headless Chromium. It reads the rendered page of both UIs the
server serves (V1 at ``/deployments``, V2, the default, at ``/v2/deployments``), checks that
every deployment of ``prefect.yaml`` and every cron schedule in it are shown, saves a
screenshot, prints what it found and exits 1 when something is missing (2 when Chromium is
not there). The server is stopped whatever happens. ``infra/ui_deployments.png`` is its
screenshot.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import yaml

from elastune.infra.server import isolated_env, running_server, stop_group

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
POOL = "local-proc"
# The deployments page of each UI the server serves; V2 is the one "/" opens.
PAGES = {"v1": "/deployments", "v2": "/v2/deployments"}
WINDOW = (1600, 1000)
# Flags that work in a container without a display, a GPU, a sandbox or the internet.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
]
# Virtual milliseconds the page may run before the DOM is read; doubled on each retry, as
# the UI's API calls can be slow on a busy machine.
BUDGET_MS = 10_000
ATTEMPTS = 3
CHROMIUM_TIMEOUT = 120.0
DEPLOY_TIMEOUT = 300.0


def cron_text(cron: str) -> str:
    """How both UIs describe a daily cron ``"M H * * *"`` (V1 adds " every day")."""
    fields = cron.split()
    if (
        len(fields) != 5
        or fields[2:] != ["*", "*", "*"]
        or not all(f.isdigit() for f in fields[:2])
    ):
        raise ValueError(f"cron {cron!r}: only daily schedules 'M H * * *' are checked")
    minute, hour = int(fields[0]), int(fields[1])
    return f"At {(hour - 1) % 12 + 1:02d}:{minute:02d} {'AM' if hour < 12 else 'PM'}"


@dataclass(frozen=True)
class Expected:
    """What ``prefect.yaml`` deploys: deployment names and, per name, its cron texts."""

    deployments: list[str]
    schedules: dict[str, list[str]]

    @classmethod
    def from_yaml(cls, path: Path) -> Expected:
        entries = yaml.safe_load(path.read_text())["deployments"]
        schedules = {
            entry["name"]: [cron_text(s["cron"]) for s in entry["schedules"]]
            for entry in entries
            if entry.get("schedules")
        }
        return cls([entry["name"] for entry in entries], schedules)


class _Text(HTMLParser):
    """The text nodes of a rendered page, stripped, scripts and styles left out."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.texts.append(" ".join(data.split()))


def page_texts(html: str) -> list[str]:
    parser = _Text()
    parser.feed(html)
    return parser.texts


@dataclass
class PageReport:
    """What one UI's deployments page showed."""

    url: str
    texts: list[str]  # the page's text nodes, in document order
    deployments: dict[str, bool] = field(default_factory=dict)
    # (deployment, expected text) -> the text shown in that deployment's row, or None
    schedules: dict[tuple[str, str], str | None] = field(default_factory=dict)

    @property
    def missing(self) -> list[str]:
        gone = [f"deployment {name!r}" for name, seen in self.deployments.items() if not seen]
        return gone + [
            f"schedule {text!r} of {name!r}"
            for (name, text), shown in self.schedules.items()
            if shown is None
        ]


def read_page(url: str, texts: list[str], expected: Expected) -> PageReport:
    """Which expected deployments the page lists, and which schedules their rows show."""
    report = PageReport(url, texts)
    names = set(expected.deployments)
    # A deployment's name is a text node of its own (its link), so "tune" is not found
    # inside "tune-nightly".
    report.deployments = {name: name in texts for name in expected.deployments}
    for name, wanted in expected.schedules.items():
        # The row of `name`: from its name to the next other deployment's name.
        row: list[str] = []
        if name in texts:
            after = texts[texts.index(name) :]
            ends = (i for i, t in enumerate(after) if t in names and t != name)
            row = after[: next(ends, len(after))]
        for text in wanted:
            report.schedules[name, text] = next((t for t in row if t.startswith(text)), None)
    return report


@dataclass
class UiReport:
    pages: list[PageReport]
    screenshot: Path

    @property
    def missing(self) -> list[str]:
        return [f"{page.url}: {gap}" for page in self.pages for gap in page.missing]

    def lines(self) -> list[str]:
        out = []
        for page in self.pages:
            out.append(page.url)
            for name, seen in page.deployments.items():
                out.append(f"  deployment {name:<14} {'shown' if seen else 'MISSING'}")
            for (name, text), shown in page.schedules.items():
                seen = repr(shown) if shown else f"MISSING ({text!r})"
                out.append(f"  schedule   {name:<14} {seen}")
        out.append(f"screenshot {self.screenshot}")
        return out


def chromium(url: str, *args: str, chromium_path: Path = CHROMIUM) -> str:
    """Run headless Chromium on ``url`` with a new empty profile; its stdout."""
    with tempfile.TemporaryDirectory(prefix="elastune-chromium-") as profile:
        command = [str(chromium_path), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url]
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its renderer and GPU processes go with it
        )
        try:
            out, err = process.communicate(timeout=CHROMIUM_TIMEOUT)
        finally:
            stop_group(process, signal.SIGTERM, grace=5)
    if process.returncode != 0:
        tail = "\n".join(err.splitlines()[-10:])
        raise RuntimeError(f"chromium exited with {process.returncode} on {url}:\n{tail}")
    return out


def shrink(png: Path) -> None:
    """Rewrite the screenshot ``png`` smaller."""
    # A 64-colour palette keeps UI text sharp at a third of the size (Pillow comes with
    # matplotlib).
    from PIL import Image

    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    small.save(png, optimize=True)


def check_ui(base_url: str, out: Path, expected: Expected, screenshot_ui: str = "v2") -> UiReport:
    """Read each UI's deployments page at ``base_url``; save ``screenshot_ui``'s to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)  # a stale file must not pass for a new screenshot
    pages = []
    for ui, path in PAGES.items():
        url = base_url + path
        shot = [f"--screenshot={out.resolve()}"] if ui == screenshot_ui else []
        for attempt in range(ATTEMPTS):
            budget = f"--virtual-time-budget={BUDGET_MS * 2**attempt}"
            page = read_page(url, page_texts(chromium(url, budget, "--dump-dom", *shot)), expected)
            if not page.missing:
                break
        pages.append(page)
    if not out.exists():
        raise RuntimeError(f"chromium wrote no screenshot of {base_url + PAGES[screenshot_ui]}")
    shrink(out)
    return UiReport(pages, out)


@contextlib.contextmanager
def deployed_server(root: Path = ROOT) -> Iterator[str]:
    """A fresh server with the UI on, the process pool and ``root``'s prefect.yaml deployed;
    yields its base URL and stops it on exit."""
    with tempfile.TemporaryDirectory(prefix="elastune-ui-") as home_dir:
        home = Path(home_dir)
        with running_server(home, ui=True) as api:
            from prefect.client.orchestration import get_client
            from prefect.client.schemas.actions import WorkPoolCreate
            from prefect.settings import PREFECT_API_URL, temporary_settings

            with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as c:
                c.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
            deploy = subprocess.run(
                [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"],
                cwd=root,
                env=isolated_env(home, PREFECT_API_URL=api),
                capture_output=True,
                text=True,
                timeout=DEPLOY_TIMEOUT,
            )
            if deploy.returncode != 0:
                raise RuntimeError(f"prefect deploy --all failed:\n{deploy.stdout[-3000:]}")
            yield api.removesuffix("/api")


def deploy_and_check(out: Path, root: Path = ROOT, screenshot_ui: str = "v2") -> UiReport:
    """The whole check: server, pool, ``prefect deploy --all``, Chromium; server stopped."""
    expected = Expected.from_yaml(root / "prefect.yaml")
    with deployed_server(root) as base_url:
        return check_ui(base_url, out, expected, screenshot_ui)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elastune.infra.ui_check", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="where to write the PNG")
    parser.add_argument("--ui", choices=sorted(PAGES), default="v2", help="UI to screenshot")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        print(f"{CHROMIUM} not found: apt-get install -y chromium", file=sys.stderr)
        return 2
    # A SIGTERM unwinds like Ctrl-C, through the block that stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    report = deploy_and_check(args.out, screenshot_ui=args.ui)
    print("\n".join(report.lines()))
    for gap in report.missing:
        print(f"missing: {gap}", file=sys.stderr)
    return 1 if report.missing else 0


if __name__ == "__main__":
    sys.exit(main())
