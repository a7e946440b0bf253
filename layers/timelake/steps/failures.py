"""Why a piece or a unit failed, kept beside the job's scratch files.

A scan or a write that fails leaves a note; the step that then finds the piece or unit missing (cut,
stage) names the first failure, so the job's error says which file broke and how, not only that
something is missing.
"""

from __future__ import annotations

import contextlib

from timelake.ports.runtime import Runtime


def note(rt: Runtime, job_id: str, item: str, error: BaseException) -> None:
    fs, path = rt.objects.filesystem(rt.staging_path(job_id, "failures", f"{item}.txt"))
    rt.objects.make_parent(fs, path)
    with fs.open_output_stream(path) as out:
        out.write(f"{type(error).__name__}: {error}".encode())


def clear(rt: Runtime, job_id: str, item: str) -> None:
    fs, path = rt.objects.filesystem(rt.staging_path(job_id, "failures", f"{item}.txt"))
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


def first(rt: Runtime, job_id: str, items: list[str]) -> str | None:
    """The recorded failure of the first of ``items`` that has one."""
    for item in items:
        fs, path = rt.objects.filesystem(rt.staging_path(job_id, "failures", f"{item}.txt"))
        try:
            with fs.open_input_stream(path) as handle:
                return f"{item}: {handle.read().decode()}"
        except FileNotFoundError:
            continue
    return None
