"""NATS JetStream adapter of the KV port (`nats://`, `tls://`, `ws://`, `wss://` URLs).

A bucket is the stream `KV_<bucket>` listening on `$KV.<bucket>.>` (ADR-8): key `k` is
the subject `$KV.<bucket>.k` and a revision is a stream sequence. How the port maps
onto JetStream:

- put, create, update, delete and purge publish to the key's subject and wait for the
  stream's ack. Compare-and-set uses `Nats-Expected-Last-Subject-Sequence`; the server
  answers a lost race with error 10071 (`wrong last sequence: N`, single server) or
  10164 (`wrong last sequence`, clustered, no number). delete and purge are `DEL` /
  `PURGE` markers (`KV-Operation`), purge with `Nats-Rollup: sub`.
- get, history and get_last_many use Direct Get (`$JS.API.DIRECT.GET.KV_<bucket>`),
  including ADR-31 batch and multi-last requests, whose replies are a run of messages
  ended by a `204 EOB` status message. nats-py 2.16 has neither, so each connection keeps
  one wildcard reply inbox for these multi-message replies. A multi-last request may
  match at most 1024 subjects (413 otherwise); get_last_many then lists the subjects
  (`$JS.API.STREAM.INFO` with `subjects_filter`) and pages at one point in time.
- keys and watch use ordered push consumers (ephemeral, flow control, idle heartbeats)
  implemented here: nats-py's `kv.keys(filters=...)` raises NoKeysError with a filter,
  and its ordered consumer reports a failed re-creation only to the error callback.
  keys is ADR-8's headers-only consumer delivering the last message per subject.
- create_many sends its items' creates back to back on the handle's connection (at
  most 256 acks outstanding, gathered on the connection's reply inbox) instead of one
  request/reply each; an item refused with 10071/10164 is settled as create does (the
  stream leader's newest message of the key: a PUT means it exists, a marker means send
  it again expecting the marker's revision).
- purge_all is one `$JS.API.STREAM.PURGE.KV_<bucket>` request per filter.
- Settings beyond the basics (`flowtide.kv.options`): `max_bytes` is the stream's
  (discard new; a refused write, error 10077, is BucketFullError), `placement` and
  `republish` the stream's (republish `src` is `$KV.<bucket>.<filter>`). A mirror is the
  stream `KV_<name>` with `mirror: KV_<origin>`, `mirror_direct` and no subjects; its
  handle refuses writes (ReadOnlyBucketError), reads through the origin's Direct Get
  subject (answered by the origin and its mirrors) and watches its own stream under
  `$KV.<origin>.`. A sourced bucket's stream sources `KV_<origin>` with the subject
  transform `$KV.<origin>.>` -> `$KV.<bucket>.>`. `limit_marker_ttl` sets
  `allow_msg_ttl` and `subject_delete_marker_ttl` (checked against the server's API
  level first); create and purge with a TTL send `Nats-TTL`. `connect(apply=True)`
  changes the settings passed with `$JS.API.STREAM.UPDATE` on the stream's current
  configuration.

Connections: one NATS connection per (URL, event loop), shared by every handle opened
from that loop and closed with the last of them (or when the loop shuts down). A handle
must be used from the loop that opened it.

Server restarts and outages: once connected, the client reconnects forever (every
0.5 s). A request issued while the server is away is buffered and sent on reconnect; it
succeeds if the reply comes within the request timeout (5 s), else it fails with
KVError, as does a request lost with the dying socket. A write that timed out may still
have been applied. The handle itself needs nothing: it works again once the server is
back, and watchers re-create their consumer from the revision after the last one they
delivered (also after missed heartbeats). Nothing above this package sees a nats-py
exception.

Deviations from ADR-8, and why:

- Value size. JetStream counts headers in `max_msg_size`, so a stream created with
  `max_msg_size = max_value_size` (ADR-8) refuses a CAS write whose value is within ~70
  bytes of the limit, and even a delete marker when the limit is below ~90 bytes. The
  adapter creates the stream with `max_value_size + 128` and keeps the exact limit in the
  stream metadata (`flowtide.max_value_size`), which it enforces before sending. A bucket
  created by another client is bound with `max_value_size = max_msg_size`, headers
  included, as other clients do.
- Buckets without `allow_direct` (nats-py's `create_key_value` makes them by default)
  are bound too, but read through the stream leader and ordered consumers instead of
  Direct Get: get uses `$JS.API.STREAM.MSG.GET`; history and get_last_many use a
  consumer (no 1024-key cap, but a get_last_many at a past revision reads every stored
  message under the filters).
- Reads follow ADR-8's consistency: on a replicated bucket a Direct Get may be served by
  a replica that lags. Only the compare-and-set error paths (`current` of
  WrongRevisionError, create's check for a delete marker) read from the stream leader
  (`$JS.API.STREAM.MSG.GET`).
- `destroy()` ends the handles and watchers on that bucket that share its connection at
  once; handles elsewhere find out on their next call (BucketNotFoundError) and
  watchers elsewhere within a few heartbeats.
- get_last_many with `up_to_revision` also reads the headers of the messages written
  since that revision (an ordered consumer) to report `delta` exactly.

Needs nats-server 2.11 or newer (batch and multi-last Direct Get).

Modules, each importing only those listed before it:

- `protocol`: header names, API error codes, parsing of replies and deliveries, filter
  reduction, the request errors (no I/O).
- `connection`: the pooled NATS connection per (URL, credentials, event loop), requests
  and the multi-message reply inbox.
- `pipeline`: pipelined publishes with their replies gathered (create_many).
- `streams`: bucket <-> stream configuration, binding a bucket, changing its settings.
- `consumers`: what a handle shares with its watchers: state checks, stream API requests,
  ordered push consumers and snapshot scans.
- `watcher`: `NatsWatcher`.
- `reads`: a handle's reads (Direct Get, the stream leader, get_last_many's paging).
- `bucket`: `NatsKeyValue` (the writes and their compare-and-set errors, watch, status,
  destroy, close) and `open_nats`.
"""

# The public names, and (imported `as` themselves) the private ones that
# tests/kv/test_nats.py reaches through `flowtide.kv.nats`.
from flowtide.kv.nats.bucket import NatsKeyValue, open_nats
from flowtide.kv.nats.connection import _Connection as _Connection
from flowtide.kv.nats.connection import redact_url
from flowtide.kv.nats.protocol import DEFAULT_TIMEOUT
from flowtide.kv.nats.protocol import _ApiError as _ApiError
from flowtide.kv.nats.protocol import _idle_after as _idle_after
from flowtide.kv.nats.protocol import _parse_delivery as _parse_delivery
from flowtide.kv.nats.protocol import _parse_ts as _parse_ts
from flowtide.kv.nats.protocol import _reduce as _reduce
from flowtide.kv.nats.streams import _stream_config as _stream_config
from flowtide.kv.nats.watcher import NatsWatcher

__all__ = ["DEFAULT_TIMEOUT", "NatsKeyValue", "NatsWatcher", "open_nats", "redact_url"]
