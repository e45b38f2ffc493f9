"""The tool kinds a task can use.

What a kind is: a `ToolSpec` (`spec`): its fields, checks, runner and result. The
built-in kinds' specs are in `builtin`; `kinds` knows every kind by name, built in or
from a plugin (the `flowtide.tools` entry point group), and is what the loader asks;
`registry` keeps one runner per kind, made on first use (`get_tool`, `warm_tools`,
`cancel_running`). Each built-in runner is a module of its own (`playbook`, which the
runtime runs, has its call in `subplaybook`); a table that a kind's check and its
runner both read (the nats operations) is declared in `builtin`.

`base` is what every tool gets (`ToolContext`: the execution and step, credentials,
the render context, a timeout, where secrets it touched are noted). A tool turns a
rendered task config into a JSON-ready result (`flowtide.jsonvalues`) or raises
`ToolError`. The large ones keep their parts beside them: `python_code`,
`python_namespace`, `python_output`, `python_run` (and python steps in child processes:
`python_pool`, `python_child`); `postgres_sql`, `postgres_params`, `postgres_conn`;
`nats_conn` (credentials, the loop NATS calls run on, pooled connections);
`transfer_sources` (a transfer's readers), `transfer_targets` (its writers),
`transfer_ends` (what both ends share), `transfer_spark` (a transfer on Spark). `shell`
and `script` run programs through `process` (process group, timeout, capped output, the
python steps' user). `script_source` reads a task's `script:` field (a file or inline
code) for python, postgres and `script` tasks. `artifact` reads and writes what
`flowtide.artifacts` stores.
"""
