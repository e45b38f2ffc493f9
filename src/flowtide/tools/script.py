"""The `script` tool: NoETL's script runner, run here as a local process.

In NoETL (`noetl/tools/script/__init__.py`, `noetl/tools/container/loader.py`) a
`kind: script` task loads a Python script from `script: {uri, source: {type: file | gcs
| s3 | http}}` and runs it as a Kubernetes Job: `python3 /scripts/script.py
'<args as JSON>'`, with `job.env` as its environment and `job.timeout` (default 600 s),
then returns the pod's log. flowtide runs the same script the same way, without
Kubernetes: this interpreter (or, on a root worker whose interpreter other users cannot
run, the one its python steps run with: `flowtide.tools.python_interpreter`, given this
process's packages through PYTHONPATH), the script file, the task's `args` as JSON in `argv[1]`,
and returns NoETL's result shape::

    {"status": "completed", "job_name": "script-<task>-<execution_id>",
     "namespace": null, "pod_name": null, "execution_time": 0.05,
     "output": "<stdout and stderr, in order>", "succeeded": 1, "failed": 0,
     "exit_code": 0, "truncated": false, "runner": "local"}

* Sources: `file` only (`uri`/`path`, or `file://`; relative to the playbook's folder,
  then the working directory, as python scripts). `gcs`, `s3` and `http` need a
  service outside this machine and are refused with a `config_error` saying so: copy
  the script next to the playbook and use `source: {type: file}`.
* `job.image`, `job.namespace`, `job.resources`, `job.backoffLimit`,
  `job.ttlSecondsAfterFinished` and `job.install_dependencies` describe a Kubernetes
  Job and are not used: the script runs with this process's Python (its version) and the
  packages installed there, as python steps do.
* Environment, output cap (`max_output`), process group, cancellation and user are the
  `shell` tool's (`flowtide.tools.shell`): the environment is not the worker's (PATH,
  LANG, HOME... and the variables templates may see), then `job.env` (or `env`); a
  worker running as root runs the script as the python steps' user.
* A script that exits non-zero fails the task: `ToolError` kind `script_error` (code =
  the exit status) whose `data` is the result above with `status: failed`. Past its
  timeout it is killed: kind `timeout`, retryable.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools.base import ToolContext, seconds
from flowtide.tools.process import Launch, RunsPrograms, start_error, stopped_error
from flowtide.tools.python_interpreter import child_executable, child_pythonpath
from flowtide.tools.script_source import script_path
from flowtide.tools.shell import last_line, launch_of

__all__ = ["DEFAULT_TIMEOUT", "ScriptTool"]

DEFAULT_TIMEOUT = 600.0
_REMOTE = {
    "gcs": "Google Cloud Storage",
    "gs": "Google Cloud Storage",
    "s3": "Amazon S3",
    "http": "an HTTP server",
    "https": "an HTTP server",
}


def _invalid(message: str) -> ToolError:
    return ToolError(message, kind="config_error")


def _source(config: Mapping[str, Any]) -> tuple[str, str]:
    """(source type, location) of the task's `script`."""
    script = config.get("script")
    if isinstance(script, str):
        script = {"uri": script}
    if not isinstance(script, Mapping):
        raise _invalid("script tool needs `script: {uri, source: {type: file}}`")
    source = script.get("source")
    source_map: Mapping[str, Any] = source if isinstance(source, Mapping) else {}
    location = script.get("uri") or script.get("path") or source_map.get("path")
    if not isinstance(location, str) or not location.strip():
        raise _invalid("script: needs `uri` (the script file)")
    scheme = location.split("://", 1)[0].lower() if "://" in location else ""
    kind = source_map.get("type") or (source if isinstance(source, str) else None)
    kind = str(kind or {"gs": "gcs", "file": "file"}.get(scheme, scheme) or "file").lower()
    return kind, location.strip()


def _script_path(config: Mapping[str, Any], ctx: ToolContext) -> Path:
    kind, location = _source(config)
    if kind in _REMOTE:
        raise _invalid(
            f"script source type {kind!r} ({location}) needs {_REMOTE[kind]}, which flowtide"
            " does not fetch scripts from: copy the script next to the playbook and use"
            " `source: {type: file}`"
        )
    if kind != "file":
        raise _invalid(f"script source type {kind!r} is not supported (supported: file)")
    return script_path(location, ctx.base_dir, tool="script", step=ctx.step, kind="script_error")


def _args(config: Mapping[str, Any]) -> str:
    args = config.get("args")
    if args in (None, ""):
        args = {}
    if not isinstance(args, Mapping):
        raise _invalid("script `args` must be a mapping (the script gets it as JSON in argv[1])")
    try:
        return json.dumps(args, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise _invalid(f"script `args` are not JSON: {exc}") from None


def _with_our_packages(launch: Launch) -> Launch:
    """`launch`, its PYTHONPATH ending with this process's packages when the script runs
    with another interpreter than this one (`python_interpreter.child_pythonpath`)."""
    ours = child_pythonpath()
    if not ours:
        return launch
    theirs = launch.env.get("PYTHONPATH")
    env = {**launch.env, "PYTHONPATH": f"{theirs}{os.pathsep}{ours}" if theirs else ours}
    return dataclasses.replace(launch, env=env)


class ScriptTool(RunsPrograms):
    """Run a script file as a local process (tool kind `script`); see the module
    docstring."""

    kind = "script"

    def run(self, config: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        job = config.get("job") if isinstance(config.get("job"), Mapping) else {}
        assert isinstance(job, Mapping)
        path = _script_path(config, ctx)
        args = _args(config)
        timeout = seconds({**config, **job}, ctx, "timeout", default=DEFAULT_TIMEOUT)
        assert timeout is not None
        launch = launch_of(config, ctx, job.get("env") or config.get("env"), "job.env")
        name = str(config.get("name") or ctx.task or ctx.step or "script_job")
        job_name = f"script-{name.replace('_', '-')}-{ctx.execution_id}"[:63]
        launch = _with_our_packages(launch)
        argv = [child_executable(), str(path), args]
        try:
            run = launch.run(argv, timeout, merge_stderr=True)
        except OSError as exc:
            raise start_error(exc, argv[0], f"script {path.name}", launch.user) from None
        ok = run.returncode == 0 and run.stopped is None
        result = {
            "status": "completed" if ok else "failed",
            "job_name": job_name,
            "namespace": None,
            "pod_name": None,
            "execution_time": round(run.duration, 3),
            "output": run.stdout,
            "succeeded": 1 if ok else 0,
            "failed": 0 if ok else 1,
            "exit_code": run.returncode,
            "truncated": bool(run.stdout_dropped),
            "runner": "local",
        }
        if ok:
            return result
        what = f"script {path.name}"
        error = stopped_error(what, run, timeout) or ToolError(
            f"{what} exited with status {run.returncode}{last_line(run.stdout)}",
            kind="script_error",
            code=str(run.returncode),
        )
        error.data = result
        raise error
