"""What runs an execution around the engine.

`advance`: one engine step over a batch of events (shared with the server). `command`:
one command run and the events that report it (shared with the worker), through
`pipeline`'s `StepRunner`: a step's tasks rendered (`rendering`: scopes, fields, `set`),
called, recorded (`outcome`: calls and the command's outcome) and followed by what the
engine's policy decides (`flowtide.engine.policy.next_action`). `local`: the embedded
runtime (engine loop, group commit) with its command threads in `threads`; `progress`:
an embedded run's live progress on a terminal.
"""
