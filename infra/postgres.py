"""Debian's PostgreSQL, as a cluster's services host runs it: installed with apt-get when it
is missing, and a database folder of the cluster's own (``initdb``), served by a
``postgres`` process the host's supervisor starts as the ``postgres`` user
(:mod:`elastune.infra.cluster_layout`). Nothing of the machine's own PostgreSQL (its
``main`` cluster, its service) is used or changed.

``python -m elastune.infra.postgres`` installs it if missing (``.ci/run`` does, before the
tests).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

from elastune.infra.cluster_layout import postgres_bin


class PostgresError(RuntimeError):
    """PostgreSQL could not be installed or set up; the message is one line."""


def ensure_postgres() -> Path:
    """PostgreSQL's ``bin`` folder, installing Debian's ``postgresql`` first if it is missing."""
    found = postgres_bin()
    if found is not None:
        return found
    if shutil.which("apt-get") is None:
        raise PostgresError("PostgreSQL is not installed and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "postgresql"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PostgresError(f"{' '.join(command)}: {done.stderr.strip()[-300:]}")
    found = postgres_bin()
    if found is None:
        raise PostgresError("apt-get installed postgresql, but no postgres binary was found")
    return found


def as_postgres() -> None:
    """``preexec_fn``: run as the ``postgres`` user (PostgreSQL refuses to run as root)."""
    account = pwd.getpwnam("postgres")
    os.setgid(account.pw_gid)
    os.initgroups(account.pw_name, account.pw_gid)
    os.setuid(account.pw_uid)


def initdb(data: Path, socket_dir: Path, hba: str) -> None:
    """A new database folder ``data`` owned by ``postgres``, its socket in ``socket_dir``
    (only root and ``postgres`` may open it), clients admitted as ``hba`` says."""
    account = pwd.getpwnam("postgres")
    for folder in (data, socket_dir):
        folder.mkdir(mode=0o700)
        os.chown(folder, account.pw_uid, account.pw_gid)
    command = [str(ensure_postgres() / "initdb"), "-D", str(data), "-U", "postgres"]
    command += ["--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8"]
    done = subprocess.run(
        command, preexec_fn=as_postgres, capture_output=True, text=True, check=False, cwd=data
    )
    if done.returncode != 0:
        raise PostgresError(f"initdb: {done.stderr.strip()[-300:]}")
    (data / "pg_hba.conf").write_text(hba)
    # Connections: Prefect's server pools a few dozen, MLflow's workers theirs, each
    # driver Optuna's.
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("max_connections = 200\nunix_socket_permissions = 0700\n")


def main() -> None:
    try:
        print(ensure_postgres())
    except PostgresError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
