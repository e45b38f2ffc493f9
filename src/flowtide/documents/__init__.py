"""What people and programs read about executions: the read models that the server,
`flowtide ui` and the CLI share, typed (`TypedDict`s the API's OpenAPI document
describes), built from the engine's folded state, the playbook and the store port, and
masked with the execution's secret set in one place.

- `execution`: an execution's document (`shown`, masked; `intact`, for code that uses
  the data), as `flowtide run --json`, `flowtide status` and the API give it.
- `summary`: an execution at a glance (steps, loops, arcs taken, progress) and the part
  of it kept when an execution ends (`SUMMARY_FORMAT`).
- `graph`: the playbook's steps and arcs laid out in layers.
- `timeline`: each step's runs and commands, or their density for a big loop.
- `step`: one step's detail (source, result, calls, Spark run).
- `listing`: lists of executions and pages of events (queries, items).
- `events`: an event as shown, and the Server-Sent Events framing of a live stream.
- `checks`: a playbook text checked for the catalog editor and run form.

Below every front door: it imports the engine, the playbook, the store port, errors and
redaction, never a runtime, the server, `flowtide.web` or `flowtide.ui`
(tests/unit/test_imports.py).
"""
