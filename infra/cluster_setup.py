"""The services host's one-off steps, run by its supervisor (:mod:`elastune.infra.cluster_host`)
between its services, with the host's secrets in the environment:

- ``database``: PostgreSQL's roles and databases, one each for Prefect, MLflow and Optuna,
  each role with its own password (``ELASTUNE_PG_<ROLE>``), created over the server's Unix
  socket, which only root and ``postgres`` may open;
- ``mlflow-users``: the database of MLflow's accounts, and its admin;
- ``services``: MLflow's account for the cluster's hosts (``MLFLOW_TRACKING_USERNAME``),
  made by the admin, and the warm pool whose segment parameters go through MLflow's
  artifact proxy (:class:`elastune.infra.artifact_storage.MlflowArtifacts`).
"""

from __future__ import annotations

import os
import sys

ROLES = ("prefect", "mlflow", "optuna")


def create_databases(socket_dir: str) -> None:
    """A role and a database of its own for each of :data:`ROLES` (passwords from the
    environment: never on a command line)."""
    import psycopg2
    from psycopg2 import sql

    connection = psycopg2.connect(host=socket_dir, user="postgres", dbname="postgres")
    connection.autocommit = True  # CREATE DATABASE runs outside a transaction
    with connection.cursor() as cursor:
        for role in ROLES:
            password = os.environ[f"ELASTUNE_PG_{role.upper()}"]
            cursor.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(role)),
                [password],
            )
            cursor.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(role), sql.Identifier(role)
                )
            )
    connection.close()


def create_mlflow_user(tracking_uri: str) -> None:
    """The hosts' MLflow account, made by the admin (``admin`` and
    ``MLFLOW_AUTH_ADMIN_PASSWORD``)."""
    import requests

    response = requests.post(
        f"{tracking_uri}/api/2.0/mlflow/users/create",
        json={
            "username": os.environ["MLFLOW_TRACKING_USERNAME"],
            "password": os.environ["MLFLOW_TRACKING_PASSWORD"],
        },
        auth=("admin", os.environ["MLFLOW_AUTH_ADMIN_PASSWORD"]),
        timeout=60,
    )
    response.raise_for_status()


def create_pool(pool: str, tracking_uri: str) -> None:
    """Warm pool ``pool``, its segment parameters under ``elastune-pools/<pool>`` of MLflow's
    artifact store."""
    from elastune.infra.artifact_storage import MlflowArtifacts
    from elastune.infra.local_cluster import create_warm_pool

    storage = MlflowArtifacts(tracking_uri=tracking_uri, prefix=f"elastune-pools/{pool}")
    create_warm_pool(pool, storage)


def main(argv: list[str] | None = None) -> None:
    step, *args = argv or sys.argv[1:]
    if step == "database":
        create_databases(*args)
    elif step == "mlflow-users":
        from mlflow.server.auth import bootstrap_admin_user

        bootstrap_admin_user()  # its database, and the admin (MLFLOW_AUTH_ADMIN_PASSWORD)
    elif step == "services":
        pool, tracking_uri = args
        create_mlflow_user(tracking_uri)
        create_pool(pool, tracking_uri)
    else:
        raise SystemExit(f"unknown step {step!r}: database or services")


if __name__ == "__main__":
    main()
