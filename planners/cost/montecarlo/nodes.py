"""The nodes a chain of stages holds, and what they cost: all of one type and market.

Arrays are ``samples x nodes``: per Monte Carlo sample and node, when its current instance
was requested, when it is ready, and when it will be interrupted (spot only).

Example (two on-demand nodes, requested at 0, ready after 2 minutes, released at 1 h,
billed by the second from request; one released early pays its minimum charge):
    >>> import numpy as np
    >>> from elastune.planners.cost.pricing.catalog import read_catalog
    >>> g5 = read_catalog().get("g5.xlarge")
    >>> pool = NodePool(g5, "on-demand", np.zeros((1, 2)), np.full((1, 2), 120.0))
    >>> pool.count, pool.bill(np.array([3600.0]))
    (2, array([2.012]))
    >>> kept, gone = pool.split(1)
    >>> kept.count, gone.charge(np.array([[30.0]]))
    (1, array([[0.01676667]]))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from elastune.planners.cost.pricing.catalog import InstanceType

Array = NDArray[np.float64]


@dataclass(frozen=True)
class NodePool:
    """The nodes a chain holds, all of one type and market. Per sample and node (S x c):
    when the node's current instance was requested, when it is ready, and when it will be
    interrupted (``fails``; None on-demand or at rate 0: never)."""

    instance: InstanceType
    market: str
    request: Array
    ready: Array
    fails: Array | None = None
    ids: tuple[int, ...] = ()  # node ids, only when tracing

    @property
    def count(self) -> int:
        return self.ready.shape[1]

    def charge(self, end: Array) -> Array:
        """Dollars per sample and node for the current instances ended at ``end`` (S x c)."""
        billing = self.instance.billing
        start = self.ready if billing.starts == "running" else self.request
        if np.isfinite(end).all():
            alive = end - start
        else:  # released at the end of a stage that never ends (requested then, too)
            with np.errstate(invalid="ignore"):
                alive = np.where(np.isinf(end), np.inf, end - start)
        dollars = billing.charge(self.instance.price(self.market), np.maximum(alive, 0.0))
        # Billed from running: an instance released before it ran costs nothing.
        return dollars if billing.starts == "request" else np.where(alive < 0, 0.0, dollars)

    def bill(self, until: Array) -> Array:
        """Dollars per sample for every node released at ``until`` (per sample, or per
        sample and node): an instance that was interrupted before then (while idle) is
        billed up to its interruption."""
        end = until[:, None] if until.ndim == 1 else until
        end = end if self.fails is None else np.minimum(end, self.fails)
        return self.charge(end).sum(axis=1)

    def split(self, keep: int) -> tuple[NodePool, NodePool]:
        """The first ``keep`` nodes, and the rest."""

        def cut(part: slice) -> NodePool:
            fails = None if self.fails is None else self.fails[:, part]
            request, ready = self.request[:, part], self.ready[:, part]
            return NodePool(self.instance, self.market, request, ready, fails, self.ids[part])

        return cut(slice(None, keep)), cut(slice(keep, None))

    def reordered(self, order: NDArray[np.intp]) -> NodePool:
        """The nodes in ``order`` (S x c: per sample, the node in each place)."""

        def take(a: Array) -> Array:
            return np.take_along_axis(a, order, axis=1)

        fails = None if self.fails is None else take(self.fails)
        return NodePool(self.instance, self.market, take(self.request), take(self.ready), fails)

    def join(self, new: NodePool) -> NodePool:
        """This pool with ``new``'s nodes after its own (same type and market)."""
        fails = None if self.fails is None else np.hstack([self.fails, new.fails])
        request, ready = np.hstack([self.request, new.request]), np.hstack([self.ready, new.ready])
        return NodePool(self.instance, self.market, request, ready, fails, self.ids + new.ids)
