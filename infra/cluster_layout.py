"""What runs where on a cluster of hosts (:mod:`elastune.infra.netns_cluster`): the hosts
and their addresses, each host's programs, and which secrets each host holds.

- ``services`` (``.1``): PostgreSQL (one database each for Prefect, MLflow and Optuna),
  Prefect's server on it with API auth (``PREFECT_SERVER_API_AUTH_STRING``), MLflow's
  tracking server on it with MLflow's basic-auth app, proxying the artifact store
  (checkpoints, reports and segment parameters travel over HTTP);
- ``driver`` (``.2``): where jobs are run from; no program of its own;
- ``node-0`` .. (``.10`` ..): one warm node worker each (``python -m elastune.flows.segment``),
  restarted by the host's supervisor when it dies.

A host's secrets are in ``secrets.env`` in its folder (mode 0600) and reach its programs
by environment: the services host holds the database passwords, the admin's and the
server-side auth settings; every other host holds the clients' credentials alone (Prefect's
auth string, MLflow's account, Optuna's database password in a ``.pgpass`` file).
"""

from __future__ import annotations

import math
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path

from elastune.infra.cluster_host import HostSpec, Program
from elastune.infra.server import MLFLOW_SERVER_ENV

SERVICES, DRIVER = "services", "driver"
PREFECT_PORT, MLFLOW_PORT, POSTGRES_PORT = 4200, 5000, 5432
POOL = "warm"
POSTGRES_BIN = Path("/usr/lib/postgresql")


@dataclass(frozen=True)
class Layout:
    """Cluster ``name``: its hosts in ``subnet`` (the first three octets of a /24), their
    folders under ``root``, and the folder trainables are imported from (``code``)."""

    name: str
    root: Path
    code: Path
    subnet: str = "10.77.0"
    nodes: int = 3
    gpus_per_node: float = 1.0
    # More environment for every host, each value's "{folder}" its own folder (tests: where
    # a test trainable logs what it trains).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def node_names(self) -> list[str]:
        return [f"node-{i}" for i in range(self.nodes)]

    @property
    def hosts(self) -> list[str]:
        return [SERVICES, DRIVER, *self.node_names]

    def address(self, host: str) -> str:
        last = {SERVICES: 1, DRIVER: 2}.get(host)
        if last is None:
            last = 10 + self.node_names.index(host)
        return f"{self.subnet}.{last}"

    def folder(self, host: str) -> Path:
        return self.root / host

    @property
    def prefect_api(self) -> str:
        return f"http://{self.address(SERVICES)}:{PREFECT_PORT}/api"

    @property
    def mlflow_uri(self) -> str:
        return f"http://{self.address(SERVICES)}:{MLFLOW_PORT}"

    @property
    def optuna_storage(self) -> str:
        """Optuna's store: no password in it (libpq reads it from the host's .pgpass)."""
        return f"postgresql+psycopg2://optuna@{self.address(SERVICES)}:{POSTGRES_PORT}/optuna"

    @property
    def storage_block(self) -> str:
        return f"elastune-mlflow-artifacts/{POOL}-segments"

    def job_overrides(self) -> list[str]:
        """The ``--set`` values that point a job at the cluster's stores."""
        return [
            f"tracking.mlflow_uri={self.mlflow_uri}",
            f"tracking.optuna_storage={self.optuna_storage}",
        ]


def new_secrets() -> dict[str, str]:
    """Every secret of a new cluster."""

    def token() -> str:
        return secrets.token_urlsafe(24)

    return {
        "ELASTUNE_PG_PREFECT": token(),
        "ELASTUNE_PG_MLFLOW": token(),
        "ELASTUNE_PG_OPTUNA": token(),
        "PREFECT_AUTH": f"elastune:{token()}",
        "MLFLOW_AUTH_ADMIN_PASSWORD": token(),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": token(),
        "MLFLOW_TRACKING_PASSWORD": token(),
    }


def client_secrets(made: dict[str, str]) -> dict[str, str]:
    """What a host that runs jobs or segments holds."""
    return {
        "PREFECT_API_AUTH_STRING": made["PREFECT_AUTH"],
        "MLFLOW_TRACKING_USERNAME": "elastune",
        "MLFLOW_TRACKING_PASSWORD": made["MLFLOW_TRACKING_PASSWORD"],
    }


def services_secrets(layout: Layout, made: dict[str, str]) -> dict[str, str]:
    """What the services host holds: the servers' side, and the clients' for its set-up."""
    local = f"127.0.0.1:{POSTGRES_PORT}"
    return {
        **{key: made[key] for key in made if key.startswith("ELASTUNE_PG_")},
        "PREFECT_API_DATABASE_CONNECTION_URL": (
            f"postgresql+asyncpg://prefect:{made['ELASTUNE_PG_PREFECT']}@{local}/prefect"
        ),
        "PREFECT_SERVER_API_AUTH_STRING": made["PREFECT_AUTH"],
        "MLFLOW_AUTH_ADMIN_PASSWORD": made["MLFLOW_AUTH_ADMIN_PASSWORD"],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": made["MLFLOW_FLASK_SERVER_SECRET_KEY"],
        **client_secrets(made),
    }


def pgpass(layout: Layout, made: dict[str, str], host: str) -> str:
    """A host's ``.pgpass`` lines: Optuna's database for every host, MLflow's too for the
    services host (its tracking server's backend store)."""
    services = layout.address(SERVICES)
    lines = [f"{services}:{POSTGRES_PORT}:optuna:optuna:{made['ELASTUNE_PG_OPTUNA']}"]
    if host == SERVICES:
        lines.append(f"127.0.0.1:{POSTGRES_PORT}:mlflow:mlflow:{made['ELASTUNE_PG_MLFLOW']}")
    return "".join(line + "\n" for line in lines)


def host_env(layout: Layout, host: str) -> dict[str, str]:
    """A host's environment, less its secrets: its own folders, the cluster's services."""
    folder = layout.folder(host)
    return {
        "ELASTUNE_HOST": host,
        "HOME": str(folder),
        "TMPDIR": str(folder / "tmp"),
        "PREFECT_HOME": str(folder / "prefect"),
        "ELASTUNE_CACHE": str(folder / "cache"),
        "MPLCONFIGDIR": str(folder / "cache" / "matplotlib"),
        "PGPASSFILE": str(folder / ".pgpass"),
        "PREFECT_API_URL": layout.prefect_api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "MLFLOW_TRACKING_URI": layout.mlflow_uri,
        # A tracking server that restarts is waited for about 8 minutes, asked again after
        # 2, 4, 8, ... s (MLflow's defaults: 4, 8, 16, ... s, 4 minutes): a restart costs
        # less of the wait that follows it.
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "10",
        "PYTHONPATH": str(layout.code),
        **{key: value.replace("{folder}", str(folder)) for key, value in layout.env.items()},
    }


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's ``bin`` folder (Debian's layout), if any."""
    versions = sorted(POSTGRES_BIN.glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    return versions[-1].parent if versions else None


def services_programs(layout: Layout) -> list[Program]:
    folder, address = layout.folder(SERVICES), layout.address(SERVICES)
    python = [sys.executable, "-m"]
    postgres = str(postgres_bin() / "postgres")
    auth = {"MLFLOW_AUTH_CONFIG_PATH": str(folder / "basic_auth.ini")}
    return [
        Program(
            "postgres",
            [
                postgres,
                "-D",
                str(folder / "postgres"),
                "-p",
                str(POSTGRES_PORT),
                "-c",
                f"listen_addresses=127.0.0.1,{address}",
                "-c",
                f"unix_socket_directories={folder / 'pg-socket'}",
            ],
            health=f"tcp://127.0.0.1:{POSTGRES_PORT}",
            user="postgres",
            stop_signal="SIGINT",  # fast shutdown: SIGTERM waits for every client to leave
        ),
        Program(
            "databases",
            [*python, "elastune.infra.cluster_setup", "database", str(folder / "pg-socket")],
            once=True,
        ),
        # MLflow's users before its server's workers start: each would otherwise make
        # them, side by side.
        Program(
            "mlflow-users",
            [*python, "elastune.infra.cluster_setup", "mlflow-users"],
            env=auth,
            once=True,
        ),
        Program(
            "prefect",
            [*python, "elastune.infra.prefect_app", "--host", address, "--port", str(PREFECT_PORT)],
            env={"PREFECT_UI_ENABLED": "false"},
            health=f"{layout.prefect_api}/health",
        ),
        Program(
            "mlflow",
            [
                *python,
                "mlflow",
                "server",
                "--app-name",
                "elastune-fenced",  # basic-auth, fenced: tasks/fence.py
                "--backend-store-uri",
                f"postgresql://mlflow@127.0.0.1:{POSTGRES_PORT}/mlflow",
                "--artifacts-destination",
                str(folder / "artifacts"),
                "--host",
                address,
                "--port",
                str(MLFLOW_PORT),
                "--workers",  # one: it starts again in half the time two take here
                "1",
            ],
            env={**auth, **MLFLOW_SERVER_ENV},
            health=f"{layout.mlflow_uri}/health",
        ),
        Program(
            "setup",
            [*python, "elastune.infra.cluster_setup", "services", POOL, layout.mlflow_uri],
            once=True,
        ),
    ]


def node_program(layout: Layout, node: str) -> Program:
    # The nodes share this machine's cores, as local_cluster's do.
    threads = max(1, (os.cpu_count() or 1) // math.ceil(layout.nodes * layout.gpus_per_node))
    argv = [sys.executable, "-m", "elastune.flows.segment", "--pool", POOL, "--node", node]
    argv += ["--gpus", f"{layout.gpus_per_node:g}", "--storage", layout.storage_block]
    return Program("worker", [*argv, "--threads", str(threads)])


def host_spec(layout: Layout, host: str) -> HostSpec:
    if host == SERVICES:
        programs = services_programs(layout)
    elif host == DRIVER:
        programs = []
    else:
        programs = [node_program(layout, host)]
    return HostSpec(host, str(layout.folder(host)), programs, host_env(layout, host))


def basic_auth_ini(layout: Layout) -> str:
    """MLflow's basic-auth settings: its users in a SQLite file of the services host, the
    admin's password from the environment, every account allowed to edit what it can see
    (the hosts' one account writes the runs of every job), and a password check cached a
    minute (else each request pays a PBKDF2 hash)."""
    users = layout.folder(SERVICES) / "mlflow-auth.db"
    return (
        "[mlflow]\n"
        "default_permission = EDIT\n"
        f"database_uri = sqlite:///{users}\n"
        "admin_username = admin\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "auth_cache_ttl_seconds = 60\n"
    )


def pg_hba(layout: Layout) -> str:
    """Who may open which database: Prefect and MLflow from the services host only, Optuna
    from the cluster's hosts, each with its role's password; the superuser over the Unix
    socket alone."""
    subnet = f"{layout.subnet}.0/24"
    return (
        "local all postgres trust\n"
        "host prefect prefect 127.0.0.1/32 scram-sha-256\n"
        "host mlflow mlflow 127.0.0.1/32 scram-sha-256\n"
        f"host optuna optuna {subnet} scram-sha-256\n"
    )
