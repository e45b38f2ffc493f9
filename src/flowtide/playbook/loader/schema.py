"""The playbook's vocabulary, as data: every key the loader knows at each level of a
playbook (the document, a step, a tool, a loop, a policy, `next` and an arc), with its
type, what it means, its default, and whether flowtide acts on it.

One table per level (`LEVELS`); the loader's strictness check (`check_keys`) reads these
same tables, and the DSL reference can be generated from them. A key no table names is
an error (with file:line:column and "did you mean"); a key that is known but not acted on
(`acted=False`: NoETL vocabulary flowtide accepts and ignores) is a warning naming it; a
key with `refused` set is an error with that text (it used to mean something, or it
belongs elsewhere).

The vocabulary is NoETL's v2 DSL (its models in `noetl/core/dsl/engine/models/`:
`Step`, `StepSpec`, `StepPolicy`, `Loop`, `LoopSpec`, `FramePolicy`, `CursorSpec`,
`NextRouter`, `NextSpec`, `Arc`, `TaskPolicy`, `PolicyRuleThen`, `ToolSpec`, `TaskSpec`)
and what its e2e corpus writes (noetl-e2e/DSL-NOTES.md), plus flowtide's own keys.

A tool's own fields (`url`, `command`, `code`...) are its kind's (`flowtide.tools.spec.
ToolSpec.fields`): the `tool` table holds only what every tool mapping may carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["KIND_FIELDS", "LEVELS", "Key", "known", "level"]


@dataclass(frozen=True)
class Key:
    """One key of one level of a playbook."""

    name: str
    #: What the value is, for the docs: "string", "mapping", "list", "template", ...
    type: str
    #: One line: what it means.
    doc: str
    #: Its default when absent ("" when none or not meaningful).
    default: str = ""
    #: flowtide acts on it. False: accepted (NoETL writes it) and ignored, with a warning.
    acted: bool = True
    #: Set: the key is an error, this text says why and what to write instead.
    refused: str = ""
    #: What to write instead of a refused key (the error's `expected`).
    instead: str = ""


def _table(*keys: Key) -> dict[str, Key]:
    return {key.name: key for key in keys}


_SCHEDULE = (
    "'schedule' is not a playbook field: a schedule is its own document (kind: Schedule,"
    " registered with `flowtide catalog register`) or `flowtide schedule add NAME PLAYBOOK"
    " --cron EXPR`"
)
_DOC = "documentation only"

PLAYBOOK = _table(
    Key("apiVersion", "string", "document version, e.g. noetl.io/v2 (any value is accepted)"),
    Key("kind", "string", "document kind: Playbook"),
    Key("metadata", "mapping", "name, path and version of the playbook"),
    Key("workload", "mapping", "inputs and their defaults; `--set`/`--payload` override them"),
    Key("workflow", "list", "the steps"),
    Key("workbook", "list", "named actions steps call with `kind: workbook`"),
    Key("executor", "mapping", "`spec.entry_step`, and runtime hints handed to tools"),
    Key("notify", "list", "who is told of the run's transitions"),
    Key("timeout", "duration", "past it the run fails (deadline_exceeded)"),
    Key("sla", "duration", "past it a running run records deadline_missed"),
    Key(
        "keychain",
        "list",
        "NoETL's keychain declarations; flowtide resolves secrets through `auth:` aliases"
        " (`flowtide credential set`) instead",
        acted=False,
    ),
    Key("tracing", "mapping", "NoETL's tracing settings", acted=False),
    Key("spec", "mapping", "NoETL's top-level spec (write inputs under `workload`)", acted=False),
    Key("schedule", "mapping", "", refused=_SCHEDULE),
)

#: `metadata` is free-form, as in NoETL (its `PlaybookMetadata` allows any key): these
#: are the keys flowtide reads or NoETL names; others are kept and not checked.
METADATA = _table(
    Key("name", "string", "the playbook's name", default="the file's stem"),
    Key("path", "string", "its catalog path"),
    Key("version", "string", "its version"),
    Key("description", "string", _DOC),
    Key("tags", "list", _DOC),
    Key("labels", "mapping", _DOC),
    Key("exposed_in_ui", "bool", "NoETL's GUI flag", acted=False),
    Key("exposes_as_mcp", "bool", "NoETL's MCP flag", acted=False),
    Key("agent", "bool", "NoETL's legacy agent flag", acted=False),
    Key("capabilities", "list", "NoETL's agent capabilities", acted=False),
)

EXECUTOR = _table(
    Key("spec", "mapping", "`entry_step`: the first step"),
    Key("spark", "mapping", "Spark settings of spark tasks: `master`, `data_dir`, ..."),
    Key("profile", "string", "NoETL's runtime profile (local | distributed | auto)", acted=False),
    Key("version", "string", "NoETL's runtime contract version", acted=False),
    Key("requires", "mapping", "NoETL's required tools and features", acted=False),
)

EXECUTOR_SPEC = _table(
    Key("entry_step", "string", "the first step", default="'start', else the first step"),
    Key("final_step", "string", "NoETL's finalization step", acted=False),
    Key("no_next_is_error", "bool", "NoETL: no matching arc is an error", acted=False),
    Key("policy", "mapping", "NoETL's global defaults placeholder", acted=False),
)

#: Misplaced `executor.spec` keys: where they belong.
EXECUTOR_SPEC_MISPLACED: Mapping[str, str] = {
    "spark": "Spark settings are `executor.spark` (not under `executor.spec`)",
}

WORKBOOK_ACTION = _table(
    Key("name", "string", "the action's name, called by `tool: {kind: workbook, name: ...}`"),
    Key("tool", "mapping", "the action's tool (its fields may also sit beside `name`)"),
    Key("desc", "string", _DOC),
    Key("assert", "mapping", "NoETL's input/output assertions", acted=False),
)

STEP = _table(
    Key("step", "string", "the step's name (unique)"),
    Key("desc", "string", _DOC),
    Key("tool", "mapping or list", "what the step runs: one tool, or a pipeline of tasks"),
    Key("input", "mapping", "inputs of the step's tools (a tool's own `input` wins)"),
    Key("loop", "mapping", "run the tool once per element of a collection (or cursor row)"),
    Key("set", "mapping", "values written when the step ends (`ctx.x`, `vars.x`)"),
    Key("next", "mapping", "where to go next: `{spec: {mode}, arcs: [...]}`"),
    Key("output", "mapping", "how results are stored: `store`, `inline_max_bytes`..."),
    Key("spec", "mapping", "`policy.admit` (whether the step runs)"),
    Key("schedule", "mapping", "", refused=_SCHEDULE),
    Key(
        "args",
        "mapping",
        "",
        refused="'args' is NoETL's legacy step field: write 'input' (or 'set')",
    ),
)

_RETRIES_BELONG = (
    "retries belong under 'tool': `retry: N` (or `retry: {attempts, backoff, on}`), or"
    " spec.policy.rules with `do: retry, attempts: N`"
)

#: Misplaced step keys: where they belong.
STEP_MISPLACED: Mapping[str, str] = {
    "timeout": "a tool's `timeout` (seconds) belongs under 'tool'",
    "retry": _RETRIES_BELONG,
    "retries": _RETRIES_BELONG,
    "when": "a step's condition is spec.policy.admit.rules (or a `when` on the arc into it)",
    "case": "NoETL's `case` is gone from v2: route with next.arcs[].when, handle outcomes "
    "with the tool's spec.policy.rules",
    "kind": "'kind' belongs under 'tool'",
    "name": "a step is named by 'step' (a task of a pipeline by its 'name' under 'tool')",
}

STEP_SPEC = _table(
    Key("policy", "mapping", "the step's policy: `admit` rules"),
    Key("timeout", "duration", "NoETL's step timeout (use the tool's `timeout`)", acted=False),
)

_STEP_POLICY_ONLY_ADMIT = (
    "step policy '{}' is not supported: a step's spec.policy takes only 'admit'"
)

STEP_POLICY = _table(
    Key("admit", "mapping", "rules deciding whether the step runs"),
    Key(
        "rules",
        "list",
        "",
        refused="policy rules written on the step would never run: task policy rules "
        "belong under the tool (a step's spec.policy takes only 'admit')",
        instead="tool: {kind: ..., spec: {policy: {rules: [...]}}}",
    ),
    Key(
        "lifecycle",
        "mapping",
        "",
        refused=_STEP_POLICY_ONLY_ADMIT.format("lifecycle"),
        instead="admit",
    ),
    Key(
        "failure", "mapping", "", refused=_STEP_POLICY_ONLY_ADMIT.format("failure"), instead="admit"
    ),
    Key("emit", "mapping", "", refused=_STEP_POLICY_ONLY_ADMIT.format("emit"), instead="admit"),
)

ADMIT = _table(
    Key("rules", "list", "`{when, then: {allow}}` rules, first match wins, and `else`"),
    Key("mode", "string", "NoETL's evaluation mode (here: the first match wins)", acted=False),
)

ADMIT_RULE = _table(
    Key("when", "template or bool", "the rule's condition"),
    Key("then", "mapping", "`{allow: true|false}`"),
    Key("else", "mapping", "`{then: {allow: ...}}` when no rule matched"),
)

RETRY = _table(
    Key("attempts", "int", "attempts in all, the first included", default="3"),
    Key("backoff", "duration", "delay before the first retry, doubling on each", default="1s"),
    Key("max_backoff", "duration", "longest delay between attempts", default="60s"),
    Key(
        "on",
        "list",
        "error kinds retried (`timeout`, `server_error`, ...); default: retryable errors",
    ),
    Key("max_attempts", "int", "older name of `attempts`"),
    Key("retry_on", "list", "older name of `on`"),
    Key("retry_on_status", "list", "HTTP statuses retried (older form)"),
    Key("backoff_seconds", "number", "older name of `backoff`, in seconds"),
    Key("initial_delay", "number", "older name of `backoff`, in seconds"),
    Key("backoff_multiplier", "number", "older form: any value means doubling delays"),
)

ADMIT_THEN = _table(
    Key("allow", "bool", "run the step (true) or skip it and end its branch", default="true"),
)

#: Every key a tool mapping may carry whatever its kind, besides the kind's own fields.
TOOL = _table(
    Key("kind", "string", "the tool kind"),
    Key("name", "string", "the task's name (in a pipeline; the step's otherwise)"),
    Key("spec", "mapping", "`policy` (and the kind's fields, as if written flat)"),
    Key("input", "mapping", "the task's inputs (over the step's)"),
    Key("set", "mapping", "values written after the task (`ctx.x`, `iter.x`, or names)"),
    Key("desc", "string", _DOC),
    Key("timeout", "number", "seconds the call may take"),
    Key("output", "mapping", "how the task's result is stored (`store`, `inline_max_bytes`)"),
    Key("output_select", "mapping or list", "fields kept beside a stored result"),
    Key(
        "retry",
        "mapping or int",
        "shorthand for a retry rule: `{attempts, backoff, max_backoff, on}` (an int: attempts)",
    ),
    Key("assert", "mapping", "NoETL's input/output assertions", acted=False),
    Key("task", "string", "the task's name for a workbook call"),
)

TOOL_SPEC = _table(
    Key("policy", "mapping", "the task's `rules`: retry, jump, break, fail, continue"),
    Key("input", "mapping", "the task's inputs"),
)

POLICY = _table(
    Key("rules", "list", "`{when, then}` rules, first match wins, and `else`"),
    Key("mode", "string", "NoETL's evaluation mode (always exclusive here)", acted=False),
    Key("on_unmatched", "string", "NoETL's default action (here: continue)", acted=False),
    Key("before", "list", "NoETL placeholder hooks", acted=False),
    Key("after", "list", "NoETL placeholder hooks", acted=False),
    Key("finally", "list", "NoETL placeholder hooks", acted=False),
)

RULE = _table(
    Key("when", "template or bool", "the rule's condition"),
    Key("then", "mapping", "what to do: `{do, attempts, backoff, delay, to, set}`"),
    Key("else", "mapping", "`{then: {...}}` when no rule matched"),
)

THEN = _table(
    Key("do", "string", "continue | retry | jump | break | fail", default="continue"),
    Key("attempts", "int", "retry: attempts in all", default="3"),
    Key("max_attempts", "int", "older name of `attempts`"),
    Key("backoff", "string", "retry: fixed | linear | exponential", default="fixed"),
    Key("delay", "number", "retry: first delay in seconds", default="0"),
    Key("backoff_seconds", "number", "older name of `delay`"),
    Key("max_delay", "number", "retry: longest delay in seconds", default="60"),
    Key("to", "string", "jump: the task (or step) to go to"),
    Key("set", "mapping", "values written when the rule fires"),
    Key("then", "mapping", "the body of an `else` written as `else: {then: {...}}`"),
    Key(
        "set_ctx",
        "mapping",
        "",
        refused="'set_ctx' is NoETL's legacy form: write `set: {ctx.name: ...}`",
    ),
    Key(
        "set_iter",
        "mapping",
        "",
        refused="'set_iter' is NoETL's legacy form: write `set: {iter.name: ...}`",
    ),
)

LOOP = _table(
    Key("in", "template or list", "the collection to iterate"),
    Key("collection", "template or list", "older name of `in`"),
    Key("iterator", "string", "the name of the current element"),
    Key("element", "string", "older name of `iterator`"),
    Key(
        "spec",
        "mapping",
        "`mode`, `max_in_flight`, `frame`; spark: `partitions`, `results_max`, `rate`",
    ),
    Key("mode", "string", "older place of `spec.mode`"),
    Key("max_in_flight", "int or template", "older place of `spec.max_in_flight`"),
    Key("cursor", "mapping", "a cursor loop's claim query: `{kind: postgres, auth, claim}`"),
)

LOOP_SPEC = _table(
    Key("mode", "string", "sequential | parallel | cursor | spark", default="sequential"),
    Key(
        "max_in_flight",
        "int or template",
        "iterations (or cursor workers) at once; `mode: spark`: per partition",
    ),
    Key("partitions", "int", "`mode: spark`: the Spark partitions the items are split into"),
    Key(
        "results_max",
        "int",
        "`mode: spark`: up to this many items, the result also holds `results`",
        default="10000",
    ),
    Key(
        "rate",
        "number or template",
        "`mode: spark`: items started per second across the job (one wave, paced)",
    ),
    Key(
        "batch",
        "int",
        "iterations per command, run one after another (default: sized from their"
        " durations; 1: one each)",
    ),
    Key("frame", "mapping", "a cursor loop's claim size: `{max_rows, process}`"),
    Key("policy", "mapping", "NoETL's loop scheduling policy (`exec`)", acted=False),
)

FRAME = _table(
    Key("max_rows", "int", "rows one claim takes", default="1"),
    Key("process", "string", "row (one iteration per row) | frame (one per claim)", default="row"),
    Key("max_seconds", "number", "NoETL's frame time limit", acted=False),
    Key("max_bytes", "int", "NoETL's frame size limit", acted=False),
    Key("lease_seconds", "number", "NoETL's frame lease", acted=False),
    Key("heartbeat_seconds", "number", "NoETL's frame heartbeat", acted=False),
    Key("row_concurrency", "int", "NoETL's rows processed at once in a frame", acted=False),
)

CURSOR = _table(
    Key("kind", "string", "the driver: postgres"),
    Key("auth", "string", "the credential alias"),
    Key("credential", "string", "older name of `auth`"),
    Key("claim", "string", "SQL that claims rows and returns them"),
    Key("params", "list or mapping", "values bound to the claim's placeholders"),
    Key("timeout", "number", "seconds the claim may take"),
    Key("options", "mapping", "NoETL's driver options", acted=False),
)

NEXT = _table(
    Key("spec", "mapping", "`mode`: exclusive | inclusive"),
    Key("arcs", "list", "`{step, when, set}` arcs, in order"),
    Key("mode", "string", "older place of `spec.mode`"),
    Key("step", "string", "a single arc written as the `next` mapping itself"),
    Key("when", "template or bool", "the single arc's condition"),
    Key("set", "mapping", "the single arc's values"),
)

NEXT_SPEC = _table(
    Key("mode", "string", "exclusive (first match) | inclusive (every match)", default="exclusive"),
    Key(
        "on_no_match",
        "string",
        "NoETL's complete | quiet (here: a branch with no matching arc ends)",
        acted=False,
    ),
    Key("policy", "mapping", "NoETL's router policy placeholder", acted=False),
)

ARC = _table(
    Key("step", "string", "the step to go to"),
    Key("when", "template or bool", "the arc's condition", default="always"),
    Key("set", "mapping", "values written when the arc is taken"),
    Key("spec", "mapping", "NoETL's arc spec placeholder", acted=False),
    Key("args", "mapping", "", refused="'args' on an arc is NoETL's legacy form: write 'set'"),
)

#: Every level, by the name the messages use.
LEVELS: Mapping[str, Mapping[str, Key]] = {
    "playbook": PLAYBOOK,
    "metadata": METADATA,
    "executor": EXECUTOR,
    "executor.spec": EXECUTOR_SPEC,
    "workbook action": WORKBOOK_ACTION,
    "step": STEP,
    "step spec": STEP_SPEC,
    "step policy": STEP_POLICY,
    "admit": ADMIT,
    "admit rule": ADMIT_RULE,
    "admit then": ADMIT_THEN,
    "tool": TOOL,
    "tool spec": TOOL_SPEC,
    "policy": POLICY,
    "policy rule": RULE,
    "then": THEN,
    "retry": RETRY,
    "loop": LOOP,
    "loop spec": LOOP_SPEC,
    "frame": FRAME,
    "cursor": CURSOR,
    "next": NEXT,
    "next spec": NEXT_SPEC,
    "arc": ARC,
}


def level(name: str) -> Mapping[str, Key]:
    """The keys of level `name` (a key of `LEVELS`)."""
    return LEVELS[name]


def known(name: str) -> tuple[str, ...]:
    """The keys of level `name` that may be written (not refused)."""
    return tuple(k for k, key in LEVELS[name].items() if not key.refused)


#: The fields each built-in tool kind reads (besides the `tool` level's), the aliases
#: NoETL writes included. A field close to one of these but not one of them is a typo
#: (an error, "did you mean"); any other field a built-in kind does not read is a
#: warning: it reaches the tool, which ignores it. A plugin kind's fields are its
#: `ToolSpec.fields` (`strict=True` refuses the rest).
KIND_FIELDS: Mapping[str, tuple[str, ...]] = {
    "python": ("code", "script", "libs"),
    "http": (
        "url",
        "endpoint",
        "method",
        "headers",
        "params",
        "json",
        "body",
        "data",
        "form",
        "payload",
        "auth",
        "credential",
        "timeout_seconds",
        "verify",
        "verify_ssl",
        "follow_redirects",
        "max_response_bytes",
    ),
    "postgres": (
        "command",
        "query",
        "commands",
        "sql",
        "script",
        "auth",
        "credential",
        "dsn",
        "connection_string",
        "params",
        "pool",
    ),
    "duckdb": ("query", "command", "commands", "sql", "database", "params"),
    "spark": ("sql", "code", "inputs", "sink", "conf", "params"),
    "playbook": ("path", "payload", "return_step"),
    "workbook": (),
    "noop": ("result",),
    "nats": (
        "operation",
        "auth",
        "credential",
        "nats_url",
        "bucket",
        "key",
        "value",
        "data",
        "name",
        "subject",
        "stream",
        "headers",
        "seq",
        "last",
        "pattern",
        "encoding",
        "history",
        "ttl",
        "description",
    ),
    "shell": ("cmds", "cmd", "command", "cwd", "env", "shell", "timeout_seconds", "max_output"),
    "script": ("script", "args", "env", "job"),
    "transfer": ("source", "target", "chunk_size", "engine", "mode"),
    "artifact": (
        "action",
        "data",
        "path",
        "uri",
        "ref",
        "result_ref",
        "compress",
        "store",
    ),
}
