from elastune.planners.search import Action, Decision, Result
from elastune.planners.search.schedulers import Hyperband, SuccessiveHalving
from elastune.planners.spec.geometry import sha_bracket


def drain(scheduler):
    jobs = []
    while (job := scheduler.next_segment()) is not None:
        jobs.append(job)
    return jobs


def test_sha_waits_at_the_barrier_then_promotes_the_best_third_resuming() -> None:
    sha = SuccessiveHalving(sha_bracket(9, 1, 9, 3))
    rung0 = drain(sha)
    assert [(j.start, j.stop) for j in rung0] == [(0, 1)] * 9
    losses = [0.5, 0.4, 0.6, 0.3, 0.55, 0.45, 0.35, 0.7, 0.2]
    for job, loss in zip(rung0[:-1], losses, strict=False):
        assert sha.on_result(Result(job.trial, 1, loss)) == [Decision(job.trial, Action.PAUSE, 0)]
        assert sha.next_segment() is None  # barrier: one result missing
    decisions = sha.on_result(Result(rung0[-1].trial, 1, losses[-1]))
    promoted = [d.trial for d in decisions if d.action is Action.PROMOTE]
    assert promoted == [8, 3, 6]  # .20, .30, .35
    assert sum(d.action is Action.STOP for d in decisions) == 6
    rung1 = drain(sha)
    assert [(j.trial, j.start, j.stop, j.rung) for j in rung1] == [(t, 1, 3, 1) for t in promoted]


def test_failed_and_nan_trials_are_never_promoted() -> None:
    sha = SuccessiveHalving(sha_bracket(3, 1, 3, 3))
    a, b, c = drain(sha)
    sha.on_result(Result(a.trial, 1, 0.1, failed=True))
    sha.on_result(Result(b.trial, 1, float("nan")))
    decisions = sha.on_result(Result(c.trial, 1, 0.9))
    assert [d.trial for d in decisions if d.action is Action.PROMOTE] == [c.trial]
    assert drain(sha)[0].trial == c.trial


def test_top_rung_results_complete_the_trials() -> None:
    sha = SuccessiveHalving(sha_bracket(3, 1, 3, 3))
    for job in drain(sha):
        sha.on_result(Result(job.trial, 1, job.trial))
    (final,) = drain(sha)
    assert sha.on_result(Result(final.trial, 3, 0.0))[-1].action is Action.COMPLETE
    assert sha.done and sha.next_segment() is None


def test_hyperband_fills_idle_workers_from_the_next_bracket() -> None:
    hb = Hyperband(1, 9, 3)
    jobs = drain(hb)
    # Every bracket's first rung is available at once: 9 + 5 + 3 segments, distinct trials.
    assert len(jobs) == 17 and len({j.trial for j in jobs}) == 17
    assert {j.bracket for j in jobs} == {0, 1, 2}
    # Results route back to their own bracket.
    for job in jobs:
        if job.bracket == 2:
            assert hb.on_result(Result(job.trial, 9, 0.1))[-1].action in (
                Action.PAUSE,
                Action.COMPLETE,
            )
