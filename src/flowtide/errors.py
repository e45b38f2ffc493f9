"""The one exception tree of flowtide.

    FlowtideError
    ├── PlaybookError        invalid playbook (file, line, column, step, field)
    ├── TemplateError        a template failed to render (step, expression, missing name)
    ├── ToolError            a tool call failed (kind, retryable, code, http_status)
    ├── StoreError           event/command/catalog store failure
    │   ├── NotFoundError    no such execution / playbook / credential
    │   └── AlreadyFired     a trigger's slot, delivery or message fired before (execution_id)
    ├── CredentialError      missing alias, bad master key
    ├── AuthError            a request without valid credentials (401) or rights (403)
    │   └── WrongPool        a worker's claim of another pool's command (403)
    ├── ClaimConflict        a command already claimed or closed, or a stale notification
    ├── ExecutionFinished    the execution is completed, failed or cancelled (execution_id)
    ├── ServerError          a flowtide server refused a request (status) or is unreachable
    ├── NatsError            NATS unreachable, credentials refused or incomplete (url)
    ├── DatasetError         a spark step's output cannot be read back here (uri, format)
    ├── KVError              key-value port errors (see flowtide.kv)
    ├── PostgresSetupError   a local PostgreSQL cluster cannot be set up (flowtide.dev)
    ├── DevStackError        a part of the dev stack cannot start or stop (flowtide.dev)
    ├── KVUnavailable        a KV bucket cannot be opened as given (flowtide.kv.errors)
    ├── SettingsError        a setting's value is invalid (env, value; flowtide.settings)
    ├── TriggerError         a schedule, hook or subscription is invalid (name, field)
    └── RequestError         an API route refuses a request (status; flowtide.web.problems)

Errors carry their data as attributes; the message is for people.
Nothing above an adapter sees a psycopg, sqlite3, httpx or duckdb exception.

Each error meets its HTTP status in one place (`flowtide.web.errors.problem`) and
its exit status in one place (`exit_code` below).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

#: Exit statuses of the `flowtide` command: done (a run that completed), failed (a run
#: that failed, or a server or service that failed us), invalid (the input was refused).
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_INVALID: Final = 2


class FlowtideError(Exception):
    """Root of every error flowtide raises on purpose.

    `refused`: the input was refused (a playbook, a template, a name that does not
    exist...), not a failure of a run or a service: `exit_code` gives EXIT_INVALID. A
    class says so of itself and its subclasses, so this module never has to import the
    packages that raise them (the KV port's errors)."""

    refused: ClassVar[bool] = False


class PlaybookError(FlowtideError):
    """A playbook failed to load or validate. Nothing has run."""

    refused = True

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
        step: str | None = None,
        field: str | None = None,
        expected: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.step = step
        self.field = field
        self.expected = expected
        super().__init__(self.render())

    def location(self) -> str:
        parts = [self.file or "<playbook>"]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)

    def render(self) -> str:
        where = []
        if self.step is not None:
            where.append(f"step '{self.step}'")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        head = f"{self.location()}: "
        if where:
            head += ", ".join(where) + ": "
        text = head + self.message
        if self.expected:
            text += f" (expected {self.expected})"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "step": self.step,
            "field": self.field,
            "message": self.message,
            "expected": self.expected,
        }


class PlaybookErrors(PlaybookError):
    """Several validation errors found in one pass; `errors` lists them in file order."""

    def __init__(self, errors: list[PlaybookError]) -> None:
        self.errors = sorted(errors, key=lambda e: (e.line or 0, e.column or 0))
        first = self.errors[0]
        super().__init__(
            first.message,
            file=first.file,
            line=first.line,
            column=first.column,
            step=first.step,
            field=first.field,
            expected=first.expected,
        )

    def render(self) -> str:
        return "\n".join(e.render() for e in getattr(self, "errors", [])) or super().render()


class TemplateError(FlowtideError):
    """A template failed to render: names the step, the expression and the missing name."""

    refused = True

    def __init__(
        self,
        message: str,
        *,
        expression: str,
        step: str | None = None,
        field: str | None = None,
        missing: str | None = None,
    ) -> None:
        self.message = message
        self.expression = expression
        self.step = step
        self.field = field
        self.missing = missing
        where = f"step '{step}': " if step else ""
        if field:
            where += f"field '{field}': "
        super().__init__(f"{where}cannot render {expression!r}: {message}")


class ToolError(FlowtideError):
    """A tool call failed. `kind` follows NoETL's error kinds (rate_limit, server_error, auth,
    not_found, timeout, connection, client_error, sql_error, python_error, ...)."""

    def __init__(
        self,
        message: str,
        *,
        kind: str = "error",
        retryable: bool = False,
        code: str | None = None,
        http_status: int | None = None,
        data: Any = None,
    ) -> None:
        self.message = message
        self.kind = kind
        self.retryable = retryable
        self.code = code
        self.http_status = http_status
        self.data = data
        super().__init__(message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "retryable": self.retryable,
            "code": self.code,
            "message": self.message,
            "http_status": self.http_status,
            "status": self.http_status,
        }


class StoreError(FlowtideError):
    """The event/command/catalog store failed."""


class MachineLeaseExpired(StoreError):
    """A process's snowflake machine-id lease ran out before the cluster database renewed
    it: issuing ids now could repeat another process's (flowtide.machines)."""


class NotFoundError(StoreError):
    """No such execution, playbook version or credential."""

    refused = True


class AlreadyFired(StoreError):
    """A trigger's firing (a schedule's slot, a webhook's delivery id, a subscription's
    message) is already recorded: nothing new was written. `execution_id` is the run it
    started, None when it started none (a skipped or buffered slot)."""

    def __init__(self, trigger_id: int, key: str, execution_id: int | None) -> None:
        super().__init__(f"trigger {trigger_id}: {key!r} fired before")
        self.trigger_id = trigger_id
        self.key = key
        self.execution_id = execution_id


class CredentialError(FlowtideError):
    """A credential alias is missing (`missing`) or cannot be decrypted."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        self.missing = missing
        super().__init__(message)


class AuthError(FlowtideError):
    """A request that may not be served: `status` is 401 (no valid credential) or 403
    (a valid credential without the right to do this)."""

    def __init__(self, message: str, *, status: int = 403) -> None:
        self.message = message
        self.status = status
        super().__init__(message)


class NatsError(FlowtideError):
    """A NATS connection of the server or a worker could not be made: the server is
    unreachable, refused the credentials, or they are incomplete. `url` is the NATS URL
    with its password shown as ***."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        self.message = message
        self.url = url
        super().__init__(message)


class DatasetError(FlowtideError):
    """A spark step's output cannot be read without Spark (`flowtide data`). `reason` is
    "not_local" (not parquet, csv or json on this machine's disk) or "unreadable" (the
    files are there but do not read); `uri` and `format` name the output."""

    def __init__(self, message: str, *, reason: str, uri: str | None, format: str) -> None:
        self.message = message
        self.reason = reason
        self.uri = uri
        self.format = format
        super().__init__(message)


class WrongPool(AuthError):
    """A claim for a command of another pool than the claiming worker's (403)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=403)


class ClaimConflict(FlowtideError):
    """The command cannot be claimed (already claimed, finished, or a stale notification);
    `holder` is the worker that holds it, when one does."""

    def __init__(self, message: str, *, holder: str | None = None) -> None:
        super().__init__(message)
        self.holder = holder


class ExecutionFinished(FlowtideError):
    """The execution is already completed, failed or cancelled (its log is closed)."""

    def __init__(self, execution_id: int, status: str) -> None:
        super().__init__(f"execution {execution_id} is {status}")
        self.execution_id = execution_id
        self.status = status


class SettingsError(FlowtideError):
    """A setting's value cannot be used: `env` names the variable (or option) it came
    from, `value` what it held. Raised when a process reads its settings, before it
    does anything."""

    refused = True

    def __init__(self, message: str, *, env: str | None = None, value: str | None = None):
        self.message = message
        self.env = env
        self.value = value
        super().__init__(message)


class TriggerError(FlowtideError):
    """A schedule, hook or subscription cannot be used as given: `name` is the trigger's
    name (when known), `field` the field at fault (`cron`, `timezone`, `every`, ...),
    `location` where it was written (`file:line:column`, when it came from a document),
    `kind` what the trigger is (`schedule`, `hook`, `subscription`)."""

    refused = True

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        field: str | None = None,
        location: str | None = None,
        kind: str = "schedule",
    ) -> None:
        self.message = message
        self.name = name
        self.field = field
        self.location = location
        self.kind = kind
        where = f"{location}: " if location else ""
        what = f"{kind} {name!r}, " if name else ""
        what += f"field {field!r}: " if field else ""
        super().__init__(f"{where}{what}{message}")


class ServerError(FlowtideError):
    """A flowtide server refused a request (`status` is its HTTP status) or gave no usable
    answer (0: unreachable, the connection lost, a timeout)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def exit_code(exc: BaseException) -> int:
    """The exit status of a `flowtide` command that ends on `exc`: EXIT_INVALID when the
    input was refused (a playbook, a template, a request the server answered 4xx, an id,
    key or bucket that does not exist, a KV that cannot be opened as given), EXIT_FAILED
    otherwise."""
    if isinstance(exc, FlowtideError) and exc.refused:
        return EXIT_INVALID
    if isinstance(exc, ServerError) and 400 <= exc.status < 500:
        return EXIT_INVALID
    return EXIT_FAILED
