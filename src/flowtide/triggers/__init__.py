"""Runs that start themselves: schedules, webhooks, subscriptions.

A trigger is a stored resource (like a catalog entry) named by its kind and name. Its
firing record and the execution it starts are written in one transaction of the shard
that owns it, so a slot, a delivery or a message starts exactly one run.

Pure (no I/O, time passed in):

* `when`: when a schedule fires: `Cron` (5 or 6 fields, aliases, an IANA zone, DST rules)
  or `Every` (a fixed interval with an offset); `slots` between two instants,
  `next_slots`; durations (`parse_duration`).
* `spec`: a schedule as written (CLI flags or a `kind: Schedule` document) and stored.
* `plan`: what a scheduler does now: which slots fire, which are skipped, buffered or
  cancel a running one (overlap policies, catchup window, jitter).
"""
