"""The notification settings read into what the runtimes need: the server-wide default
targets (FLOWTIDE_NOTIFY_DEFAULT, JSON or a file) and the relay built from NotifySection."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from flowtide.errors import SettingsError
from flowtide.notify.relay import NotificationRelay
from flowtide.notify.ssrf import TargetPolicy, own_addresses
from flowtide.notify.targets import Credentials, Sender, StartPlaybook
from flowtide.playbook.notify import NotifyTarget, parse_notify
from flowtide.settings.tree import NotifySection
from flowtide.store.base import Store

__all__ = ["default_targets", "relay_from"]


def default_targets(section: NotifySection) -> tuple[NotifyTarget, ...]:
    """The server-wide `notify:` list of FLOWTIDE_NOTIFY_DEFAULT (JSON text, or a YAML/JSON file's
    path); () when unset.

    Raises:
        SettingsError: unreadable or invalid, naming the variable and every problem.
    """
    text = (section.default or "").strip()
    if not text:
        return ()
    where = "FLOWTIDE_NOTIFY_DEFAULT"
    if not text.startswith("["):
        path = Path(text).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingsError(f"{where}: cannot read {path}: {exc.strerror}") from exc
        where = f"FLOWTIDE_NOTIFY_DEFAULT ({path})"
    try:
        if text.lstrip().startswith("["):
            raw = json.loads(text)
        else:
            import yaml

            raw = yaml.safe_load(text)
    except ValueError as exc:
        raise SettingsError(f"{where}: not a JSON list: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - yaml's errors have no common base we import
        raise SettingsError(f"{where}: not YAML: {exc}") from exc
    problems: list[str] = []
    targets = parse_notify(
        raw, lambda _at, message, field, _exp: problems.append(f"{field}: {message}")
    )
    if problems:
        raise SettingsError(f"{where}: " + "; ".join(problems))
    return targets


def relay_from(
    section: NotifySection,
    store: Store,
    next_id: Callable[[], int],
    *,
    credentials: Credentials | None = None,
    start_playbook: StartPlaybook | None = None,
    own_hosts: Sequence[str] = (),
    public_url: str | None = None,
) -> NotificationRelay:
    """A relay over `store` as the settings say."""
    policy = TargetPolicy.from_setting(section.allow_hosts, own_addresses(own_hosts))
    sender = Sender(
        policy, timeout=section.timeout, credentials=credentials, start_playbook=start_playbook
    )
    return NotificationRelay(
        store,
        sender,
        next_id,
        attempts=section.attempts,
        backoff=section.backoff,
        max_backoff=section.max_backoff,
        public_url=section.public_url or public_url,
    )
