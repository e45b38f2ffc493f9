"""Notifications: who is told when a run fails, completes, is cancelled, misses a
deadline or is interrupted (a playbook's `notify:`, `flowtide.playbook.notify`, and the
server-wide default `FLOWTIDE_NOTIFY_DEFAULT`).

A transition's deliveries are owed from the moment it is recorded: `owed` computes them
from the events a step recorded (pure), and the runtime writes them with those events in
one transaction (the notification outbox, `flowtide.store.notifications`). A relay
(`relay`) leases the rows, sends each (`targets`: webhook, Slack-compatible webhook,
SMTP with STARTTLS, or another playbook started with the document as workload) after
checking where a URL goes (`ssrf`), and records every attempt as a `notification.sent` or
`notification.failed` event of the execution, retrying with exponential backoff while the
target is down. Nothing here runs on the engine's path: a run is never failed or delayed
by a notification. The document (`document`) holds nothing secret: it is masked with the
execution's secret set when it is owed, and what is sent is masked again.
"""
