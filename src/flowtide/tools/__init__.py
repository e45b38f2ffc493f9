"""The tool kinds a task can use, one module each, found by name in `registry`.

`base` is what every tool gets (`ToolContext`: the execution and step, credentials,
the render context, a timeout, where secrets it touched are noted). A tool turns a rendered task config into a JSON-ready result
(`flowtide.jsonvalues`) or raises `ToolError`. The large ones keep their parts beside
them: `python_code`, `python_namespace`, `python_output`, `python_run` (and python steps
in child processes: `python_pool`, `python_child`); `postgres_sql`, `postgres_params`,
`postgres_conn`; `transfer_io` (a transfer's readers and writers), `transfer_spark` (a
transfer on Spark). `artifact` reads and writes what `flowtide.artifacts` stores.
"""
