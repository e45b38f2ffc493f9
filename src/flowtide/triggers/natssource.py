"""The `nats` source of subscriptions: a JetStream stream through a durable pull
consumer that every listener of the subscription shares (`stream`, `consumer`, a
`subject` filter), or a core NATS `subject` (in a queue group of the subscription's
name, so each message goes to one listener).

Which server and credentials: `auth` names a credential of the listening process (its
body: `url`, `user`/`password`, `token`, `creds`, `tls_ca`, NoETL's names too), `url`
overrides its URL; read as the `kind: nats` tool reads them (`tools.nats_conn.target_of`).

Keys: JetStream `<stream>:<stream sequence>` (a redelivery has the same); core NATS
`id:<Nats-Msg-Id>` when the publisher set one, else a fresh `core:<uuid>` (core NATS
never redelivers: a message whose run cannot start, or that a listener held when it
stopped, is lost). Every nats-py error becomes a TriggerError here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flowtide.errors import CredentialError, FlowtideError, ToolError, TriggerError
from flowtide.triggers.source import Delivery
from flowtide.triggers.subscription import SubscriptionSpec, consumer_name

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = ["NatsSource", "message_data"]

#: Messages delivered to the listeners and not yet acked, at most (the consumer's limit).
MAX_ACK_PENDING = 1000


def message_data(raw: bytes) -> Any:
    """A payload as the workload sees it: its JSON value, else (not JSON, or nested
    deeper than a workload may be) its text."""
    from flowtide.jsonvalues import nested_deeper

    try:
        parsed = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return raw.decode("utf-8", errors="replace")
    return raw.decode("utf-8", errors="replace") if nested_deeper(parsed) else parsed


class _Ctx:
    """What `target_of` asks of a tool context: the listening process's credentials."""

    def __init__(self, credentials: Callable[[str], dict[str, Any]]) -> None:
        self.credentials = credentials
        self.secrets: set[str] = set()

    def resolve_credential(self, alias: str) -> dict[str, Any]:
        try:
            return dict(self.credentials(alias))
        except CredentialError as exc:
            raise ToolError(str(exc), kind="credential") from None

    def add_secret(self, value: Any) -> None:
        self.secrets.add(str(value))


class NatsSource:
    """See the module docstring."""

    def __init__(
        self, spec: SubscriptionSpec, credentials: Callable[[str], dict[str, Any]]
    ) -> None:
        self.spec = spec
        self.credentials = credentials
        self.nc: Client | None = None
        self.sub: Any = None
        self.queue: asyncio.Queue[Any] | None = None
        self.shown = "NATS"
        #: What `shown` stands for in messages (a credential's URL), longest first.
        self._hidden: list[str] = []

    def _fail(self, message: str, field: str = "source") -> TriggerError:
        for text in self._hidden:
            message = message.replace(text, self.shown)
        return TriggerError(message, name=self.spec.name, field=field, kind="subscription")

    async def open(self) -> None:
        from flowtide.natsauth import connect_nats
        from flowtide.tools.nats_conn import target_of

        spec = self.spec
        config: dict[str, Any] = {"auth": spec.auth}
        if spec.url:
            config["nats_url"] = spec.url
        try:
            # A credential is read from the store: not on the event loop.
            target = await asyncio.to_thread(
                target_of,
                config,
                _Ctx(self.credentials),  # type: ignore[arg-type]
            )
        except ToolError as exc:
            raise self._fail(str(exc), "auth") from None
        # A server named by a credential is the credential's secret: readers of the
        # subscription see the alias, never its URL (errors included).
        self.shown = target.shown if spec.url else f"the server of credential {spec.auth!r}"
        self._hidden = [] if spec.url else _spellings(target.url, target.shown)
        try:
            self.nc = await connect_nats(
                target.url, target.auth, name=f"flowtide-sub-{spec.name}", wait=False
            )
        except FlowtideError as exc:
            raise self._fail(str(exc), "auth") from None
        try:
            if spec.stream is not None:
                await self._bind()
            else:
                await self._subscribe()
        except TriggerError:
            await self.close()
            raise
        except Exception as exc:  # noqa: BLE001 - nats-py's errors stop here
            await self.close()
            raise self._fail(f"NATS at {self.shown}: {type(exc).__name__}: {exc}") from None

    async def _bind(self) -> None:
        import nats.js.errors
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        assert self.nc is not None and self.spec.stream is not None
        js = self.nc.jetstream()
        stream, durable = self.spec.stream, consumer_name(self.spec)
        try:
            await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            raise self._fail(f"NATS at {self.shown} has no stream {stream!r}", "stream") from None
        try:
            await js.consumer_info(stream, durable)
        except nats.js.errors.NotFoundError:
            # Every listener of the subscription creates the same consumer: the server
            # answers a second creation of one config with the consumer that exists.
            await js.add_consumer(
                stream,
                config=ConsumerConfig(
                    name=durable,
                    durable_name=durable,
                    ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=DeliverPolicy.ALL,
                    ack_wait=self.spec.ack_wait,
                    filter_subject=self.spec.subject,
                    max_ack_pending=MAX_ACK_PENDING,
                ),
            )
        self.sub = await js.pull_subscribe_bind(durable=durable, stream=stream)

    async def _subscribe(self) -> None:
        assert self.nc is not None and self.spec.subject is not None
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=10_000)
        self.queue = queue

        async def on_message(msg: Any) -> None:
            await queue.put(msg)

        self.sub = await self.nc.subscribe(
            self.spec.subject, queue=consumer_name(self.spec), cb=on_message
        )

    async def fetch(self, limit: int, timeout: float) -> list[Delivery]:
        try:
            if self.queue is not None:
                return await self._fetch_core(limit, timeout)
            return await self._fetch_js(limit, timeout)
        except TriggerError:
            raise
        except Exception as exc:  # noqa: BLE001 - nats-py's errors stop here
            raise self._fail(f"NATS at {self.shown}: {type(exc).__name__}: {exc}") from None

    async def _fetch_js(self, limit: int, timeout: float) -> list[Delivery]:
        import nats.errors

        try:
            msgs = await self.sub.fetch(batch=limit, timeout=max(timeout, 0.05))
        except nats.errors.TimeoutError:
            return []
        return [self._js_delivery(m) for m in msgs]

    def _js_delivery(self, msg: Any) -> Delivery:
        meta = msg.metadata
        seq = int(meta.sequence.stream)
        headers = dict(msg.headers or {})

        async def ack() -> None:
            await msg.ack()

        async def nak(delay: float) -> None:
            await msg.nak(delay=delay)

        async def term() -> None:
            await msg.term()

        return Delivery(
            key=f"{meta.stream}:{seq}",
            message={
                "data": message_data(msg.data),
                "subject": msg.subject,
                "headers": headers,
                "seq": seq,
                "id": headers.get("Nats-Msg-Id"),
            },
            attempt=int(meta.num_delivered or 1),
            ack=ack,
            nak=nak,
            term=term,
        )

    async def _fetch_core(self, limit: int, timeout: float) -> list[Delivery]:
        assert self.queue is not None
        try:
            first = await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return []
        msgs = [first]
        while len(msgs) < limit and not self.queue.empty():
            msgs.append(self.queue.get_nowait())
        out = []
        for msg in msgs:
            headers = dict(msg.headers or {})
            msg_id = headers.get("Nats-Msg-Id")
            out.append(
                Delivery(
                    key=f"id:{msg_id}" if msg_id else f"core:{uuid.uuid4().hex}",
                    message={
                        "data": message_data(msg.data),
                        "subject": msg.subject,
                        "headers": headers,
                        "seq": None,
                        "id": msg_id,
                    },
                )
            )
        return out

    async def close(self) -> None:
        nc, self.nc = self.nc, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 5.0)


def _spellings(*urls: str) -> list[str]:
    """How the server of `urls` may be written in an error (the URLs, `host:port`, an
    address tuple, the host), longest first: what a message must not show."""
    from urllib.parse import urlsplit

    out: set[str] = set()
    for url in urls:
        for one in url.split(","):
            one = one.strip()
            if not one:
                continue
            out.add(one)
            try:
                parts = urlsplit(one if "://" in one else f"nats://{one}")
                host, port = parts.hostname, parts.port
            except ValueError:
                continue
            if host:
                out.add(host)
                if port is not None:
                    out.update({f"{host}:{port}", f"('{host}', {port})", f"[{host}]:{port}"})
    return sorted(out, key=len, reverse=True)
