"""Sending one notification to one target: an HTTP webhook (JSON, or the rendered
`body`), a Slack-compatible incoming webhook (`{"text": ...}`), email over SMTP (STARTTLS,
login from a credential alias), or another playbook started with the document as its
workload. What a target answers becomes an `Attempt`; whether it is retried is the
relay's call (a refused target, a 4xx other than 408/429, or a bad template is final).
"""

from __future__ import annotations

import json
import re
import smtplib
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any, Protocol

from flowtide.errors import FlowtideError, TemplateError
from flowtide.notify.ssrf import Refused, TargetPolicy
from flowtide.playbook.template import render
from flowtide.redaction import masked_url

__all__ = ["Attempt", "Credentials", "Sender", "StartPlaybook", "masked_target"]

_LINE_BREAK = re.compile(r"[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")

#: start(path, version, workload) -> the execution id it started.
StartPlaybook = Callable[[str, int | None, dict[str, Any]], int]


class Credentials(Protocol):
    def resolve(self, name: str) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one attempt got: `ok`, the HTTP status, an error (masked by the caller), and
    whether trying again can help (`retry`)."""

    ok: bool
    status_code: int | None = None
    error: str | None = None
    retry: bool = True
    started_execution_id: int | None = None


def masked_target(kind: str, config: Mapping[str, Any]) -> str:
    """The target as events show it: a URL's scheme, host, port and path (no query string,
    no user or password, no token in the path: `masked_url`); an email's recipients and
    server; a playbook's path."""
    if kind in ("webhook", "slack"):
        return masked_url(str(config.get("url", "")), path=kind != "slack")
    if kind == "email":
        to = config.get("to")
        rcpt = ", ".join(to) if isinstance(to, list) else str(to)
        smtp = config.get("smtp") or {}
        return f"{rcpt} via {smtp.get('host')}:{smtp.get('port', 587)}"
    version = config.get("version")
    return f"{config.get('path')}" + (f" v{version}" if version is not None else "")


def _default_text(doc: Mapping[str, Any]) -> str:
    playbook = doc.get("playbook") or {}
    name = playbook.get("path") or playbook.get("name") or "playbook"
    text = f"flowtide: {name} execution {doc.get('execution_id')} {doc.get('transition')}"
    error = doc.get("error") or {}
    if isinstance(error, dict) and error.get("message"):
        text += f": {error['message']}"
    if doc.get("link"):
        text += f"\n{doc['link']}"
    return text


class Sender:
    """Sends to each kind of target (one instance per relay; thread-safe)."""

    def __init__(
        self,
        policy: TargetPolicy,
        *,
        timeout: float = 10.0,
        credentials: Credentials | None = None,
        start_playbook: StartPlaybook | None = None,
    ) -> None:
        self.policy = policy
        self.timeout = timeout
        self.credentials = credentials
        self.start_playbook = start_playbook

    def send(self, kind: str, config: Mapping[str, Any], doc: Mapping[str, Any]) -> Attempt:
        """One attempt; never raises for what a target or a template does."""
        context = {"doc": doc, **doc}
        try:
            if kind == "webhook":
                return self._webhook(config, doc, context)
            if kind == "slack":
                text = config.get("text")
                body = {"text": str(render(text, context)) if text else _default_text(doc)}
                return self._post(str(config["url"]), json.dumps(body), {})
            if kind == "email":
                return self._email(config, doc, context)
            if kind == "playbook":
                return self._playbook(config, doc)
            return Attempt(False, error=f"unknown target kind {kind!r}", retry=False)
        except Refused as exc:
            return Attempt(False, error=f"refused: {exc}", retry=exc.retry)
        except TemplateError as exc:
            return Attempt(False, error=f"template: {exc}", retry=False)

    def _webhook(
        self, config: Mapping[str, Any], doc: Mapping[str, Any], context: Mapping[str, Any]
    ) -> Attempt:
        headers = {str(k): str(v) for k, v in (config.get("headers") or {}).items()}
        body = config.get("body")
        if body is None:
            text = json.dumps(doc)
        else:
            rendered = render(body, context)
            text = rendered if isinstance(rendered, str) else json.dumps(rendered)
            if isinstance(rendered, str):
                try:
                    json.loads(rendered)
                except ValueError:
                    headers.setdefault("Content-Type", "text/plain; charset=utf-8")
        return self._post(str(config["url"]), text, headers)

    def _post(self, url: str, body: str, headers: dict[str, str]) -> Attempt:
        import httpx

        self.policy.check_url(url)
        headers.setdefault("Content-Type", "application/json")
        headers.setdefault("User-Agent", "flowtide-notify")
        try:
            with httpx.Client(timeout=self.timeout, follow_redirects=False, trust_env=False) as c:
                response = c.post(url, content=body.encode(), headers=headers)
        except httpx.HTTPError as exc:
            return Attempt(False, error=f"{type(exc).__name__}: {exc}".split("?")[0])
        code = response.status_code
        if code < 300:
            return Attempt(True, status_code=code)
        retry = code >= 500 or code in (408, 429)
        return Attempt(False, status_code=code, error=f"HTTP {code}", retry=retry)

    def _email(
        self, config: Mapping[str, Any], doc: Mapping[str, Any], context: Mapping[str, Any]
    ) -> Attempt:
        smtp_cfg = dict(config.get("smtp") or {})
        host = str(smtp_cfg["host"])
        port = int(smtp_cfg.get("port", 587))
        self.policy.check_host(host, port)
        to = config.get("to")
        rcpts = [str(r) for r in ([to] if isinstance(to, str) else list(to or []))]
        sender = str(config.get("from") or "flowtide@localhost")
        if any(_LINE_BREAK.search(a) for a in (*rcpts, sender)):
            # No header nor SMTP command of its own: refused, not retried.
            return Attempt(False, error="an address with a line break", retry=False)
        message = EmailMessage()
        subject = config.get("subject")
        message["Subject"] = (
            # A template over the run (its error: a traceback) may give several lines.
            " ".join(str(render(subject, context)).split())
            if subject
            else f"flowtide: execution {doc.get('execution_id')} {doc.get('transition')}"
        )
        message["From"] = sender
        message["To"] = ", ".join(rcpts)
        body = config.get("body")
        text = str(render(body, context)) if body else _default_text(doc)
        message.set_content(text + "\n\n" + json.dumps(doc, indent=2))
        login: tuple[str, str] | None = None
        alias = smtp_cfg.get("credential")
        if alias:
            if self.credentials is None:
                return Attempt(False, error=f"credential '{alias}': no vault here", retry=False)
            try:
                secret = self.credentials.resolve(str(alias))
            except FlowtideError as exc:
                return Attempt(
                    False, error=f"credential '{alias}': {type(exc).__name__}", retry=False
                )
            user = secret.get("user") or secret.get("username") or secret.get("login")
            password = secret.get("password")
            if not user or not password:
                return Attempt(
                    False, error=f"credential '{alias}' needs user and password", retry=False
                )
            login = (str(user), str(password))
        try:
            with smtplib.SMTP(host, port, timeout=self.timeout) as smtp:
                if smtp_cfg.get("starttls", True):
                    smtp.starttls(context=ssl.create_default_context())
                if login is not None:
                    smtp.login(*login)
                smtp.send_message(message, to_addrs=rcpts)
        except smtplib.SMTPResponseException as exc:
            return Attempt(
                False,
                status_code=exc.smtp_code,
                error=f"SMTP {exc.smtp_code}",
                retry=exc.smtp_code >= 400 and exc.smtp_code < 500,
            )
        except (OSError, smtplib.SMTPException) as exc:
            return Attempt(False, error=f"{type(exc).__name__}: {exc}")
        return Attempt(True, status_code=250)

    def _playbook(self, config: Mapping[str, Any], doc: Mapping[str, Any]) -> Attempt:
        if self.start_playbook is None:
            return Attempt(False, error="no runtime here starts playbooks", retry=False)
        version = config.get("version")
        try:
            started = self.start_playbook(
                str(config["path"]), int(version) if version is not None else None, dict(doc)
            )
        except FlowtideError as exc:
            return Attempt(False, error=f"{type(exc).__name__}: {exc}", retry=False)
        return Attempt(True, started_execution_id=started)
