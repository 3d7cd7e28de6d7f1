"""pipeline/experiments/sweep_points.py: a sweep's names, and what a rerun does with each point (the
plan that keeps a point from running twice); the flow runs themselves are tests/team/test_sweep_pool.py's."""

from __future__ import annotations

import pytest

from pipeline.experiments.sweep_points import PointRun, SweepNameError, check_sweep_name, experiment_name, plan

pytestmark = pytest.mark.fast

POINTS = [{"train.lr_scale": v} for v in (0.5, 1.0, 1.5, 2.0, 2.5)]


def run(state: str, final: bool = True, tags: tuple[str, ...] = (), message: str = "") -> PointRun:
    return PointRun(f"id-{state}", state, final, ("sweep:s", *tags), message)


def test_each_point_is_finished_followed_resumed_or_submitted_by_what_is_pushed_and_its_newest_run():
    runs = {1: run("RUNNING", final=False), 2: run("CRASHED", tags=("worker-queue:on-b",)),
            3: run("FAILED", message="train failed (exit 1)"), 4: run("COMPLETED")}
    steps = plan(POINTS, "s", {"s-p0", "s-p4", "other-p1"}, runs)
    assert [(s.point, s.action, s.queue) for s in steps] == [
        (0, "finished", ""), (1, "follow", ""), (2, "resume", "on-b"), (3, "submit", ""), (4, "finished", "")]
    assert steps[1].flow_run_id == "id-RUNNING"
    # What a new run replaces: its key (one new run per replaced one) names it.
    assert [s.flow_run_id for s in (steps[0], steps[2], steps[3])] == ["", "id-CRASHED", "id-FAILED"]
    assert steps[3].why == "its last flow run ended FAILED: train failed (exit 1)"


def test_a_run_scheduled_but_not_started_is_followed_not_submitted_again():
    (step,) = plan(POINTS[:1], "s", set(), {0: run("SCHEDULED", final=False)})
    assert step.action == "follow"


def test_a_crash_before_the_run_named_its_worker_goes_to_any_worker():
    (step,) = plan(POINTS[:1], "s", set(), {0: run("CRASHED")})
    assert (step.action, step.queue) == ("submit", "")


def test_a_pushed_experiment_wins_over_a_crashed_run():
    (step,) = plan(POINTS[:1], "s", {"s-p0"}, {0: run("CRASHED", tags=("worker-queue:on-a",))})
    assert step.action == "finished"


def test_experiment_names_and_sweep_names():
    assert experiment_name("proxy-1203-0130", 3) == "proxy-1203-0130-p3"
    for good in ("grid", "proxy-1203-013000", "lr_0.5"):
        assert check_sweep_name(good) == good
    for bad in ("", "-x", "a b", "a/b", "a..b", "x.lock", "x.", "é", "a" * 82):
        with pytest.raises(SweepNameError, match="sweep name"):
            check_sweep_name(bad)


def test_a_crashed_point_whose_worker_is_offline_starts_afresh_on_any_worker():
    crashed = {0: run("CRASHED", tags=("worker-queue:on-gone",)), 1: run("CRASHED", tags=("worker-queue:on-b",))}
    steps = plan(POINTS[:2], "s", set(), crashed, online={"on-b", "on-c"})
    assert [(s.action, s.queue) for s in steps] == [("submit", ""), ("resume", "on-b")]
    assert steps[0].why == "it crashed on on-gone, whose worker is offline: starting afresh on any worker"
