"""The ``ctx`` a trainable receives (docs/architecture.md §3), in the style of Ray Tune's
function API::

    def train(config: dict, ctx: TrialContext) -> None:
        model, optimizer = build(config)
        start = ctx.restore(model=model, optimizer=optimizer)  # resource already trained
        for epoch in ctx.range(start):                         # start+1 .. this segment's target
            ...
            ctx.report(val_accuracy=acc, loss=loss)            # step = epoch
            ctx.checkpoint(model=model, optimizer=optimizer)

The object passed as ``model=`` is the one registered in MLflow for the job's best trial.

Randomness: a worker process trains one trial's segment after another's (and a warm node
several side by side in threads), so a trainable that draws from torch's process-wide
generator gets draws that depend on what the other segments did. ``ctx`` gives each trial
its own: :meth:`TrialContext.seeded` for code
that can only use the global generator (a model's initialisation), and
:meth:`TrialContext.generator` for draws a trainable makes itself (shuffling, dropout masks),
one per ``(trial, salt)``, so a trial resumed at epoch ``e`` draws as one that never stopped::

    with ctx.seeded():
        model = build(config)
    for epoch in ctx.range(start):
        order = torch.randperm(n, generator=ctx.generator(epoch))

Example:
    >>> ctx = TrialContext(trial=3, start=0, stop=1, max_resource=1, run_id="", tracker=None)
    >>> a = torch.rand(2, generator=ctx.generator(1))
    >>> bool((a == torch.rand(2, generator=ctx.generator(1))).all())
    True
    >>> with ctx.seeded():
    ...     first = torch.nn.Linear(2, 1).weight.detach().clone()
    >>> with ctx.seeded():
    ...     bool((first == torch.nn.Linear(2, 1).weight).all())
    True

A segment's time limit (``compute.segment_timeout``) raises into the thread running the
trainable, at whatever instruction it has reached; ``ctx``'s own reads and writes of MLflow
are shielded from it (Prefect's ``shield``, the counterpart of the limit it sets) and finish
first: interrupted inside a database transaction, a write could leave a SQLite store locked
for every process that shares it.

A job's deadline (``budget.deadline``) ends :meth:`TrialContext.range` at its first step
past it: what the steps before reported and checkpointed is kept, and the segment ends cut
short (docs/job-file.md, ``budget``).

Elastic trials: a segment granted ``g > 1`` GPUs runs the trainable on ``g`` data-parallel
processes when the trainable declares it can (``train.distributed = True``). Each process
gets its own ``ctx`` with ``rank``, ``world_size`` and ``device``; the trainable wraps its
model with :meth:`TrialContext.wrap` and draws its share of each global batch from
:meth:`TrialContext.batches`. Every rank restores the same checkpoint; only rank 0 logs
metrics and writes checkpoints, which hold the unwrapped model, so a trial resumes at any
width.
"""

from __future__ import annotations

import contextlib
import io
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from prefect._internal.concurrency.cancellation import shield

from elastune.tasks.checkpoint_spool import Spool
from elastune.tasks.distributed import GlobalBatches, unwrap, wrap
from elastune.tasks.fence import relaunched
from elastune.tasks.tracking import Tracker

# Reported metrics reach MLflow in one write per checkpoint (or per segment), and at the
# latest this many seconds after they were reported, so the UI's curves stay live.
FLUSH_SECONDS = 10.0


def mix(*keys: int) -> int:
    """A 63-bit seed from ``keys``, the same in every process (unlike ``hash`` of a str)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1, np.uint64)[0] >> 1)


# Held while a trial draws from torch's global generator, so no other segment draws between.
_GLOBAL_RNG = threading.Lock()


class TrialContext:
    """What one segment of one trial may do: resume, iterate, report, checkpoint.

    Args:
        trial: The trial id.
        start: Resource the scheduler expects the trial to resume from.
        stop: Resource this segment trains up to.
        max_resource: The job's maximum resource, for schedules tied to it (§3.6.4).
        run_id: The trial's MLflow run, where metrics and checkpoints go.
        tracker: MLflow access.
        device: Where to train, e.g. ``"cpu"`` or ``"cuda:0"``.
        gpus: GPUs granted to this segment (``< 1`` means a shared GPU).
        rank: This process's rank in a data-parallel segment.
        world_size: Processes in a data-parallel segment.
        seed: The trial's seed (:meth:`elastune.tasks.contract.JobRef.trial_seed`: the job's
            ``sampler.seed`` mixed with the trial id); default: the trial id.
        spool: Where checkpoints are kept until :meth:`finish` hands the newest to MLflow
            (segments of the local pool); None: each goes to MLflow at once.
        deadline_at: Wall-clock time (``time.time()``) of the job's deadline: :meth:`range`
            ends at its first step past it (:attr:`cut` then says so); None: no deadline.

    Metrics are written to MLflow in batches: with the checkpoint that follows them (so a
    checkpoint in MLflow always has its metrics there too), at :meth:`finish`, and at
    least every ``FLUSH_SECONDS``.
    """

    def __init__(
        self,
        *,
        trial: int,
        start: float,
        stop: float,
        max_resource: float,
        run_id: str,
        tracker: Tracker,
        device: str = "cpu",
        gpus: float = 1.0,
        rank: int = 0,
        world_size: int = 1,
        seed: int | None = None,
        spool: Spool | None = None,
        deadline_at: float | None = None,
    ):
        self.trial = trial
        self.start = start
        self.stop = stop
        self.max_resource = max_resource
        self.run_id = run_id
        self.device = torch.device(device)
        self.gpus = gpus
        self.rank = rank
        self.world_size = world_size
        self.seed = trial if seed is None else seed
        self.deadline_at = deadline_at
        self.cut = False  # range() ended short of stop: the job's deadline had passed
        self.resource: float = start
        self.restored_from: float = 0
        # (resource, metrics) of every report, and the objects handed to restore().
        self.reports: list[tuple[float, dict[str, float]]] = []
        self.objects: dict[str, Any] = {}
        self._tracker = tracker
        self._spool = spool
        self._unwritten: list[tuple[int, dict[str, float]]] = []  # reported, not in MLflow
        self._written_at = time.monotonic()
        self._restored = False

    def restore(self, **objects: Any) -> float:
        """Load the trial's newest checkpoint into ``objects`` (matched by keyword).

        Returns the resource the checkpoint was taken at, or 0 for a fresh trial.
        """
        self.objects = objects
        self._restored = True
        with shield():
            if self._spool is not None:
                self._hand_over_left()
            loaded = self._tracker.load_checkpoint(
                self.run_id,
                lambda f: torch.load(f, map_location=self.device, weights_only=True),
            )
        if loaded is None:
            return 0
        resource, payload = loaded
        for name, obj in objects.items():
            if name in payload["state"] and hasattr(obj, "load_state_dict"):
                unwrap(obj).load_state_dict(payload["state"][name])
        self.restored_from = self.resource = resource
        return resource

    def range(self, start: float | None = None) -> Iterator[int]:
        """Resource levels ``start+1 .. stop`` (1-based epochs or steps); tracks progress.
        Past the job's deadline it ends before the next level: the segment stops with what
        it trained and checkpointed so far, and :attr:`cut` is set."""
        begin = self.restored_from if start is None else start
        for resource in range(math.floor(begin) + 1, math.floor(self.stop) + 1):
            if self._past_deadline():
                self.cut = True
                return
            self.resource = resource
            yield resource

    def _past_deadline(self) -> bool:
        """Whether the deadline has passed; a data-parallel segment's ranks agree on it (any
        rank past it stops them all), so none waits in a collective for a peer that left."""
        if self.deadline_at is None:
            return False
        past = time.time() >= self.deadline_at
        if not self.distributed:
            return past
        flag = torch.tensor([float(past)], device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def report(self, resource: float | None = None, **metrics: float) -> None:
        """Log metrics at ``resource`` (default: the current one) to the trial's MLflow run."""
        step = self.resource if resource is None else _step(resource)
        values = {k: float(v) for k, v in metrics.items()}
        self.reports.append((step, values))
        if self.rank == 0:
            self._unwritten.append((round(step), values))
            if time.monotonic() - self._written_at > FLUSH_SECONDS:
                self._write_metrics()

    def checkpoint(self, **objects: Any) -> None:
        """Save ``objects`` (anything with ``state_dict()``, or plain values) at the
        current resource: to the trial's MLflow run, or to the spool until :meth:`finish`."""
        if self.rank != 0:
            return
        state = {
            k: unwrap(v).state_dict() if hasattr(v, "state_dict") else v for k, v in objects.items()
        }
        buffer = io.BytesIO()
        # A spooled checkpoint carries the metrics not yet in MLflow, for a retry to log.
        unwritten = self._unwritten if self._spool is not None else []
        torch.save({"resource": self.resource, "state": state, "metrics": unwritten}, buffer)
        buffer.seek(0)
        # What restore (torch.load, weights only) would refuse fails the trial now, not its
        # next segment silently from scratch (a refused checkpoint reads as none).
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(buffer)
        if unsafe:
            raise ValueError(
                f"ctx.checkpoint: {', '.join(sorted(objects))} hold {', '.join(unsafe)}, which "
                "torch.load(weights_only=True) refuses: checkpoint state_dicts, tensors, "
                "plain numbers, strings, lists and dicts"
            )
        if self._spool is not None:
            self._spool.write(self.run_id, self.resource, buffer.getvalue())
            return
        with shield():
            self._write_metrics()
            self._tracker.save_checkpoint(self.run_id, buffer.getvalue(), self.resource)

    def finish(self) -> None:
        """End the segment: its unwritten metrics and its newest spooled checkpoint go to
        MLflow (before its report does, so a finished segment is all in MLflow)."""
        if self.rank != 0:
            return
        self._write_metrics()
        if self._spool is not None:
            # A trainable that restored knows MLflow's newest level; listing costs ~25 ms.
            known = self.restored_from if self._restored else self._tracker_newest()
            for resource, path in self._spool.files(self.run_id)[:1]:
                if resource > known:
                    self._tracker.upload_checkpoint(self.run_id, path)
            self._spool.clear(self.run_id)

    def _write_metrics(self) -> None:
        if self._unwritten:
            with shield():
                if relaunched():  # a launch given up on may have logged some of them
                    self._log_missing(self._unwritten)
                else:
                    self._tracker.log_history(self.run_id, self._unwritten)
        self._unwritten = []
        self._written_at = time.monotonic()

    def _tracker_newest(self) -> float:
        found = self._tracker.checkpoints(self.run_id)
        return found[0][0] if found else 0

    def _hand_over_left(self) -> None:
        """What a killed segment of this trial left in the spool goes to MLflow: the
        metrics its newest readable checkpoint holds (those MLflow lacks) and the
        checkpoint itself, if MLflow has none as new."""
        for resource, path in self._spool.files(self.run_id):
            try:
                payload = torch.load(path, weights_only=True)
            except Exception:  # a file it cannot read is skipped
                continue
            self._log_missing(payload.get("metrics", []))
            if resource > self._tracker_newest():
                self._tracker.upload_checkpoint(self.run_id, path)
            break
        self._spool.clear(self.run_id)

    def _log_missing(self, metrics: list[tuple[int, dict[str, float]]]) -> None:
        keys = {key for _, values in metrics for key in values}
        history = {key: self._tracker.metric_history(self.run_id, key) for key in keys}
        logged = {(key, step) for key, points in history.items() for step, _ in points}
        missing = [
            (step, {k: v for k, v in values.items() if (k, step) not in logged})
            for step, values in metrics
        ]
        self._tracker.log_history(self.run_id, [(s, m) for s, m in missing if m])

    # --- randomness ----------------------------------------------------------------------

    def generator(self, salt: int = 0) -> torch.Generator:
        """A CPU generator of this trial's own, the same for the same ``salt`` (e.g. the
        epoch) in every segment, process and run."""
        return torch.Generator().manual_seed(mix(self.seed, salt))

    @contextlib.contextmanager
    def seeded(self, salt: int = 0) -> Iterator[None]:
        """Torch's global generators set to this trial's seed for the block, and restored
        after it; other segments of the process wait meanwhile."""
        with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
            torch.manual_seed(mix(self.seed, salt, 1))
            yield

    # --- data-parallel segments ----------------------------------------------------------

    @property
    def distributed(self) -> bool:
        """Is this one of several data-parallel processes?"""
        return self.world_size > 1

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` (already on :attr:`device`) wrapped for gradient averaging across the
        segment's processes; ``model`` itself in a single-process segment."""
        return wrap(model, self.device) if self.distributed else model

    def batches(self, size: int, global_batch: int, seed: int = 0) -> GlobalBatches:
        """This process's share of each global batch of ``global_batch`` indices out of
        ``size``; the global batches, and so the training, do not depend on the width."""
        return GlobalBatches(size, global_batch, self.rank, self.world_size, seed)


# MLflow keeps a metric's step as a 64-bit integer; beyond 2**53 a float step is not exact.
_MAX_STEP = 2**53


def _step(resource: Any) -> float:
    """The resource a trainable reports at, as a float; ValueError (its trial fails, the job
    goes on) for anything but a finite number in [0, 2**53]."""
    if isinstance(resource, str | bytes) or not 0 <= (step := float(resource)) <= _MAX_STEP:
        raise ValueError(f"ctx.report: resource must be a number in [0, 2**53], got {resource!r}")
    return step
