"""How long each step ran, from the phases the store logged and the runs of the processes that ran
the job: the arithmetic behind the report's elapsed_seconds, on records built by hand."""

from __future__ import annotations

import pytest

from timelake.model.report import progress, step_seconds
from timelake.ports.store import JobRecord, UnitRecord

LOG = [["created", 100.0], ["planning", 100.0], ["scanning", 101.0], ["planned", 111.0], ["writing", 112.0],
       ["written", 130.0], ["staged", 131.0], ["validated", 133.0], ["publishing", 133.5], ["published", 135.0]]


def job(phase: str = "published", log: list | None = None, **state) -> JobRecord:
    return JobRecord("j", "iot.a", phase, {}, state, phase_log=LOG if log is None else log)


def test_a_phase_is_its_next_steps_time():
    assert step_seconds(job(), now=500.0) == {"plan": 1.0, "scan": 10.0, "write": 19.0, "stage": 1.0,
                                              "validate": 2.0, "publish": 2.0}


def test_time_outside_every_run_counts_for_no_step():
    """A runner killed at 120 (its last heartbeat) and resumed at 300: the 180 s between are no step's."""
    log = [*LOG[:5], ["writing", 300.0], ["written", 305.0], ["staged", 306.0]]
    seconds = step_seconds(job("staged", log, runs=[[100.0, 120.0], [300.0, 306.5]]), now=400.0, live=False)
    assert seconds == {"plan": 1.0, "scan": 10.0, "write": 1.0 + 8.0 + 5.0, "stage": 1.0, "validate": 0.5}


def test_a_running_job_counts_up_to_now_and_a_waiting_one_does_not():
    running = job("writing", LOG[:5], runs=[[100.0, 112.0]])
    assert step_seconds(running, now=120.0)["write"] == pytest.approx(9.0)  # the last heartbeat is old; it runs
    waiting = job("awaiting-approval", [*LOG[:5], ["awaiting-approval", 115.0]], runs=[[100.0, 115.0]])
    assert "awaiting" not in str(step_seconds(waiting, now=900.0)) and step_seconds(waiting, now=900.0)["write"] == 4.0


def test_time_paused_for_quiet_hours_counts_for_no_step():
    """Writing (from the plan's end at 111) until 130 with a pause from 115 to 125, and scanning paused
    from 105 until 108: the steps ran 19 - 10 and 10 - 3 seconds. A pause that lasts runs to now."""
    paused = job(pauses=[[105.0, 108.0], [115.0, 125.0]])
    seconds = step_seconds(paused, now=500.0)
    assert seconds["write"] == 19.0 - 10.0 and seconds["scan"] == 10.0 - 3.0
    waiting = job("writing", LOG[:5], pauses=[[115.0, None]], paused_until=1000.0)
    assert step_seconds(waiting, now=120.0)["write"] == pytest.approx(9.0 - 5.0)


def test_an_interrupted_job_shows_where_and_no_eta():
    units = [UnitRecord("u1", {}, "done", {"rows_in": 10}), UnitRecord("u2", {})]
    info = progress(job("writing", LOG[:5], runs=[[100.0, 113.0]], rows_in_scope=20), units, running=False, now=200.0)
    assert (info["phase"], info["stopped_in"], info["step"], info["eta_seconds"]) == ("interrupted", "writing", "write", None)
    write = info["steps"][-1]
    assert (write["name"], write["state"], write["done"], write["total"], write["eta_seconds"]) == ("write", "interrupted", 1, 2, None)
    alive = progress(job("writing", LOG[:5], runs=[[100.0, 113.0]], rows_in_scope=20), units, running=True, now=114.0)
    assert alive["phase"] == "writing" and alive["steps"][-1]["eta_seconds"] == pytest.approx(3.0)  # half done in 3 s


def test_a_failed_step_says_so():
    failed = progress(job("failed", LOG[:3], failed_phase="scanning", error="boom"), [], running=False, now=120.0)
    assert failed["phase"] == "failed" and [(s["name"], s["state"]) for s in failed["steps"]] == [("plan", "done"), ("scan", "failed")]
    refused = progress(job("failed_validation", [*LOG[:7], ["failed_validation", 132.0]]), [], running=False, now=200.0)
    assert refused["steps"][-1]["name"] == "validate" and refused["steps"][-1]["state"] == "failed"
