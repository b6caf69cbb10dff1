"""Segment parameters in an MLflow tracking server's artifact store, over HTTP.

A warm pool passes each segment's parameters through a Prefect storage block
(:mod:`elastune.flows.warm_pool`). On one machine that is a folder; across hosts that share
nothing but the network it is :class:`MlflowArtifacts`: files under ``prefix`` of the
artifact store a tracking server proxies (``mlflow server --artifacts-destination ...``),
read and written through its ``mlflow-artifacts`` REST API with the credentials every host
already has for MLflow (``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, from
the environment: the block itself holds none). On AWS the same role is an S3 bucket
(docs/ecs.md).
"""

from __future__ import annotations

import asyncio
import os
import threading

import requests
from prefect.filesystems import WritableFileSystem

# One session per process: its connections are kept alive between segments.
_session = threading.local()


def _http() -> requests.Session:
    if not hasattr(_session, "value"):
        _session.value = requests.Session()
    return _session.value


class MlflowArtifacts(WritableFileSystem):
    """Files under ``prefix`` of the artifact store proxied by the MLflow server at
    ``tracking_uri``."""

    _block_type_name = "Elastune MLflow Artifacts"
    _block_type_slug = "elastune-mlflow-artifacts"

    tracking_uri: str
    prefix: str

    def _url(self, path: str) -> str:
        base = self.tracking_uri.rstrip("/")
        return f"{base}/api/2.0/mlflow-artifacts/artifacts/{self.prefix.strip('/')}/{path}"

    @staticmethod
    def _auth() -> tuple[str, str] | None:
        user = os.environ.get("MLFLOW_TRACKING_USERNAME")
        return None if user is None else (user, os.environ.get("MLFLOW_TRACKING_PASSWORD", ""))

    def read_path(self, path: str) -> bytes:  # type: ignore[override]
        response = _http().get(self._url(path), auth=self._auth(), timeout=60)
        response.raise_for_status()
        return response.content

    def write_path(self, path: str, content: bytes) -> str:  # type: ignore[override]
        response = _http().put(self._url(path), data=content, auth=self._auth(), timeout=60)
        response.raise_for_status()
        return path

    async def aread_path(self, path: str) -> bytes:
        return await asyncio.to_thread(self.read_path, path)

    async def awrite_path(self, path: str, content: bytes) -> str:
        return await asyncio.to_thread(self.write_path, path, content)
