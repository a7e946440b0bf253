"""How a source's pieces are cut into scan tasks (`plan.scan_tasks`): runs of consecutive pieces of about
equal bytes, two a worker, none below the minimum a task is worth, a multiple of the workers where that
still holds."""

from __future__ import annotations

import pytest

from timelake.steps.plan import MIN_TASK_BYTES, TASKS_PER_WORKER, scan_tasks

MB = 1 << 20


def _bytes(tasks: list[list[int]], sizes: list[int]) -> list[int]:
    return [sum(sizes[first:last]) for first, last in tasks]


@pytest.mark.parametrize("workers", [1, 2, 8])
def test_a_file_per_device_is_cut_into_two_tasks_a_worker_of_equal_bytes(workers: int) -> None:
    """Every task spills to a file that each unit of a per-device source reads: two a worker, not four."""
    sizes = [int(0.45 * MB)] * 1200
    tasks = scan_tasks(sizes, workers)
    assert len(tasks) == TASKS_PER_WORKER * workers == 2 * workers
    assert [t[0] for t in tasks[1:]] == [t[1] for t in tasks[:-1]] and tasks[0][0] == 0 and tasks[-1][1] == len(sizes)
    assert max(_bytes(tasks, sizes)) - min(_bytes(tasks, sizes)) <= sizes[0]


def test_a_small_source_gets_fewer_tasks_each_worth_its_cost_and_a_multiple_of_the_workers() -> None:
    sizes = [int(0.84 * MB)] * 30  # the day files of the benchmark at 1x: 25 MB
    tasks = scan_tasks(sizes, 2)
    assert len(tasks) == 4 and min(_bytes(tasks, sizes)) >= MIN_TASK_BYTES / 2
    assert scan_tasks([MB] * 3, 2) == [[0, 3]]  # all of it below the minimum a task is worth: one task
    assert len(scan_tasks([3 * MB] * 100, 4)) == 8
