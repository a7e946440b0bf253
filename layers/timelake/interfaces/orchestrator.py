"""Jobs run by the Step Functions workflow: start, inspect and resume executions.

The API Lambda and the CLI's ``--on aws`` both go through here, so an execution is always named
after its job and the job record always knows its latest execution.
"""

from __future__ import annotations

import builtins
import json
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import ClientError

from timelake.interfaces.service import ensure_job, map_concurrency
from timelake.model.report import progress_of, report_of
from timelake.model.spec import SETTINGS, JobSpec, current_setting
from timelake.ports.runtime import Runtime
from timelake.ports.store import JobRecord, Phase
from timelake.steps.abort import abort
from timelake.steps.canary import AWAITING
from timelake.steps.schedule import change_settings

if TYPE_CHECKING:
    from timelake.ports.runtime import LakeConfig


class StepFunctionsOrchestrator:
    def __init__(self, rt: Runtime, state_machine_arn: str, client: Any = None, abort_function: str | None = None) -> None:
        """``abort_function``: the abort Lambda to run aborts in (the API Lambda may not delete lake
        files itself); None runs the abort here, with the caller's credentials (the CLI)."""
        self.rt = rt
        self.state_machine_arn = state_machine_arn
        self.sfn = client or boto3.client("stepfunctions")
        self.abort_function = abort_function

    def execution_arn(self, name: str) -> str:
        return self.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"

    def submit(self, spec: JobSpec) -> dict[str, Any]:
        """Record the job and start an execution named after it (the name makes a double start fail)."""
        job = ensure_job(self.rt, spec)
        if job.state.get("execution_arn"):
            raise ValueError(f"job {spec.job_id} already exists; resume it instead")
        arn = self.sfn.start_execution(
            stateMachineArn=self.state_machine_arn, name=spec.job_id, input=json.dumps(spec.to_json())
        )["executionArn"]
        self.rt.store.update_job(spec.job_id, execution_arn=arn, executions=[arn])
        return {"job_id": spec.job_id, "execution_arn": arn}

    def status(self, job_id: str) -> dict[str, Any]:
        info = progress_of(self.rt.store, job_id)
        arn = self._latest_execution(self.rt.store.get_job(job_id))
        if arn:
            described = self.sfn.describe_execution(executionArn=arn)
            info["execution"] = {"arn": arn, "status": described["status"],
                                 "error": described.get("error"), "cause": described.get("cause")}
            if described["status"] != "RUNNING" and info.get("paused_until"):
                info["paused_until"] = None  # the execution that waited has stopped: nothing waits any more
        return info

    def report(self, job_id: str) -> dict[str, Any]:
        return report_of(self.rt.store, job_id)

    def list(self, table: str | None = None) -> list[dict[str, Any]]:
        return [progress_of(self.rt.store, j.job_id) for j in self.rt.store.list_jobs(table)]

    def resume(self, job_id: str) -> dict[str, Any]:
        """Start a new execution of the same job, which skips every unit already done, unless a redrive
        would truly rerun the failed step. The workflow catches step failures into `Record failure` and
        a Fail state, and a redrive reruns only from the state that failed: the Fail state, which does
        nothing. So the execution history decides (`_redrive_reruns_work`), not RedriveExecution's answer."""
        job = self.rt.store.get_job(job_id)
        if job.phase in (Phase.ABORTED, Phase.FAILED_VALIDATION):
            raise ValueError(f"job {job_id} ended {job.phase.replace('_', ' ')}; nothing to resume, start a new job")
        if job.phase in (Phase.PUBLISHED, Phase.DRY_RUN_COMPLETE):
            return {"job_id": job_id, "execution_arn": job.state.get("execution_arn"), "how": f"nothing to do: {job.phase}"}
        arn = self._latest_execution(job)
        if arn:
            status = self.sfn.describe_execution(executionArn=arn)["status"]
            if status == "RUNNING":
                return {"job_id": job_id, "execution_arn": arn, "how": "already running"}
            if status in ("FAILED", "TIMED_OUT", "ABORTED") and self._redrive_reruns_work(arn) and self._redrive(arn):
                return {"job_id": job_id, "execution_arn": arn, "how": "redrive"}
        executions = job.state.get("executions", [])
        name = f"{job_id}-r{len(executions)}"
        new_arn = self.sfn.start_execution(
            stateMachineArn=self.state_machine_arn, name=name, input=json.dumps({**job.spec, "job_id": job_id})
        )["executionArn"]
        self.rt.store.update_job(job_id, execution_arn=new_arn, executions=[*executions, new_arn])
        return {"job_id": job_id, "execution_arn": new_arn, "how": "new execution"}

    def set_settings(self, job_id: str, max_concurrency: int | None = None,
                     source_rows_per_second: int | None = None) -> dict[str, Any]:
        """Change a job's settings (`timelake.steps.schedule.change_settings`): the rate applies to the
        next rows any scan Lambda reserves; a concurrency applies to each Map the workflow starts from
        now on and, through UpdateMapRun, to the scan, write or check Map running now."""
        job = change_settings(self.rt, job_id, max_concurrency=max_concurrency, source_rows_per_second=source_rows_per_second)
        updated = self._update_running_maps(job) if max_concurrency is not None else []
        return {"job_id": job_id, "settings": {name: current_setting(job, name) for name in SETTINGS},
                "map_runs_updated": updated}

    def _update_running_maps(self, job: JobRecord) -> builtins.list[str]:  # builtins: `list` here is the method above
        """UpdateMapRun's MaxConcurrency on each Map run of the job's execution that has not ended."""
        arn = self._latest_execution(job)
        if arn is None:
            return []
        updated = []
        for page in self.sfn.get_paginator("list_map_runs").paginate(executionArn=arn):
            for run in page["mapRuns"]:
                step = MAP_STEPS.get(map_label(run["mapRunArn"]))
                if step is None or "stopDate" in run:
                    continue
                value = map_concurrency(job, step)
                try:
                    self.sfn.update_map_run(mapRunArn=run["mapRunArn"], maxConcurrency=value)
                except ClientError:  # it ended meanwhile: the next Map starts with the new value anyway
                    continue
                updated.append(f"{map_label(run['mapRunArn'])} {value}")
        return updated

    def approve(self, job_id: str) -> dict[str, Any]:
        """Send the waiting execution the approval of its canary; it then writes and publishes the rest."""
        token = self._approval_token(job_id)
        self.sfn.send_task_success(taskToken=token, output=json.dumps({"approved": True}))
        return {"job_id": job_id, "execution_arn": self.rt.store.get_job(job_id).state.get("execution_arn"),
                "how": "approved: the workflow writes, validates and publishes the rest"}

    def reject(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        """Send the waiting execution the rejection of its canary; its abort path drops the job."""
        token = self._approval_token(job_id)
        self.sfn.send_task_failure(taskToken=token, error="Rejected", cause=reason or f"job {job_id}: canary rejected")
        return {"job_id": job_id, "execution_arn": self.rt.store.get_job(job_id).state.get("execution_arn"),
                "how": "rejected: the workflow aborts the job"}

    def _approval_token(self, job_id: str) -> str:
        job = self.rt.store.get_job(job_id)
        token = job.state.get("approval_token")
        if job.phase != AWAITING or not token:
            raise ValueError(f"job {job_id} is {job.phase}, not waiting for a canary decision")
        return str(token)

    def abort(self, job_id: str) -> dict[str, Any]:
        """Stop the running execution (if any), then remove the branch, unpublished files and the lease.
        A job waiting on its canary is rejected instead, so the workflow itself runs the abort."""
        job = self.rt.store.get_job(job_id)
        if job.phase == AWAITING and job.state.get("approval_token"):
            return self.reject(job_id, f"job {job_id}: aborted by request")
        arn = self._latest_execution(job)
        if arn and self.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING":
            self.sfn.stop_execution(executionArn=arn, error="Aborted", cause=f"job {job_id} aborted by request")
        if not self.abort_function:
            return abort(self.rt, job_id)
        answer = boto3.client("lambda").invoke(FunctionName=self.abort_function, Payload=json.dumps({"job_id": job_id}).encode())
        result = json.loads(answer["Payload"].read() or b"{}")
        if answer.get("FunctionError"):
            raise ValueError(f"job {job_id}: abort failed: {result.get('errorMessage', result)}")
        return dict(result)

    def _latest_execution(self, job: JobRecord) -> str | None:
        """The job's latest execution: the one `submit` or `resume` recorded, else the execution named
        after the job if there is one (a job started with ``aws stepfunctions start-execution --name
        JOB``, whose record the workflow creates without knowing the execution's ARN)."""
        if job.state.get("execution_arn"):
            return str(job.state["execution_arn"])
        arn = self.execution_arn(job.job_id)
        try:
            self.sfn.describe_execution(executionArn=arn)
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ExecutionDoesNotExist":
                return None
            raise
        return arn

    def _redrive_reruns_work(self, arn: str) -> bool:
        """Whether the execution ended in a working state (a task or Map that failed uncaught, or a
        timeout): a redrive restarts there. An execution that reached a Fail state has nothing to rerun."""
        events = self.sfn.get_execution_history(executionArn=arn, reverseOrder=True, maxResults=25)["events"]
        return not any(e["type"] == "FailStateEntered" for e in events)

    def _redrive(self, arn: str) -> bool:
        try:
            self.sfn.redrive_execution(executionArn=arn)
        except ClientError:  # not redrivable: older than 14 days, a Map run over its limit, ...
            return False
        return True


#: the workflow's Distributed Maps by their Label (statemachine/backfill.asl.json) and the step each runs
MAP_STEPS = {"ScanSource": "scan", "WriteUnits": "write", "CheckFiles": "check"}


def map_label(map_run_arn: str) -> str:
    """``arn:…:mapRun:<state machine>/<Label>:<id>`` → ``<Label>``."""
    return map_run_arn.rsplit(":mapRun:", 1)[-1].split("/", 1)[-1].rsplit(":", 1)[0]


def from_environment(stack_name: str | None = None) -> StepFunctionsOrchestrator:
    """The deployment to talk to: ``TIMELAKE_CONFIG`` + ``TIMELAKE_STATE_MACHINE_ARN`` when set, else the
    ``LakeConfig`` and ``StateMachineArn`` outputs of the CloudFormation stack (``TIMELAKE_STACK``)."""
    from timelake.adapters import compose

    config, arn = deployment(stack_name)
    return StepFunctionsOrchestrator(compose(config), arn)


def deployment(stack_name: str | None = None) -> tuple[LakeConfig, str]:
    """The deployed lake's config and state machine ARN (see `from_environment` for where they come from)."""
    import os

    from timelake.ports.runtime import LakeConfig

    config, arn = os.environ.get("TIMELAKE_CONFIG"), os.environ.get("TIMELAKE_STATE_MACHINE_ARN")
    if not (config and arn):
        name = stack_name or os.environ.get("TIMELAKE_STACK", "TimelakeBackfill")
        try:
            stacks = boto3.client("cloudformation").describe_stacks(StackName=name)["Stacks"]
        except ClientError as exc:
            raise ValueError(
                f"no deployment found: set TIMELAKE_CONFIG and TIMELAKE_STATE_MACHINE_ARN, or deploy stack {name} "
                f"({exc.response['Error']['Message']})"
            ) from exc
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}
        config, arn = outputs.get("LakeConfig"), outputs.get("StateMachineArn")
        if not (config and arn):
            raise ValueError(f"stack {name} has no LakeConfig/StateMachineArn outputs")
    return LakeConfig.model_validate_json(config), arn
