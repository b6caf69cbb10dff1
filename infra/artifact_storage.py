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
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

# One session per thread: its connections are kept alive between segments.
_session = threading.local()


# A server that restarts is waited for, as MLflow's own client does: asked again after 2,
# 4, ... 64 s, about 2 minutes in all.
RETRY = Retry(total=7, backoff_factor=1, status_forcelist=(502, 503, 504), allowed_methods=None)


def _http() -> requests.Session:
    if not hasattr(_session, "value"):
        session = requests.Session()
        session.mount("http://", HTTPAdapter(max_retries=RETRY))
        session.mount("https://", HTTPAdapter(max_retries=RETRY))
        _session.value = session
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

    # ``_sync``: what Prefect's result store passes to a block's sync methods (it marks a
    # dispatch to the sync one of a pair; these are sync already).
    def read_path(self, path: str, _sync: bool = True) -> bytes:  # type: ignore[override]
        response = _http().get(self._url(path), auth=self._auth(), timeout=60)
        response.raise_for_status()
        return response.content

    def write_path(self, path: str, content: bytes, _sync: bool = True) -> str:  # type: ignore[override]
        response = _http().put(self._url(path), data=content, auth=self._auth(), timeout=60)
        response.raise_for_status()
        return path

    async def aread_path(self, path: str) -> bytes:
        return await asyncio.to_thread(self.read_path, path)

    async def awrite_path(self, path: str, content: bytes) -> str:
        return await asyncio.to_thread(self.write_path, path, content)
