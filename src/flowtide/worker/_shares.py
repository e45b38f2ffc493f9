"""The execution shares a worker holds between requests (`ShareCache`), and what a
request says it holds (`known_revisions`): the protocol's part that lives in a worker."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import replace

from flowtide.wire import ExecutionShare

__all__ = ["ShareCache", "known_revisions"]


class ShareCache:
    """The execution shares a worker holds, the latest revision of each (at most `size`
    executions, the least recently used dropped first).

    `known` names what a request may say it holds, and keeps those shares for the reply;
    `resolve` turns a reply's shares into whole ones (a `held` one from what `known`
    kept) and remembers them. Used from the worker's event loop only (not thread-safe)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._shares: OrderedDict[int, ExecutionShare] = OrderedDict()

    def known(self, execution_ids: Iterable[int]) -> dict[int, ExecutionShare]:
        """The shares held of these executions (what a request's `known` names)."""
        out: dict[int, ExecutionShare] = {}
        for eid in execution_ids:
            share = self._shares.get(eid)
            if share is not None and share.revision:
                out[eid] = share
        return out

    def resolve(
        self, shares: Mapping[int, ExecutionShare], kept: Mapping[int, ExecutionShare]
    ) -> dict[int, ExecutionShare]:
        """Whole shares for a reply's `shares` (`kept`: what `known` gave for its
        request). Raises ValueError for a `held` share of a revision not kept (a server
        that does not keep to the protocol)."""
        out: dict[int, ExecutionShare] = {}
        for eid, share in shares.items():
            if share.held:
                base = kept.get(eid)
                if base is None or base.revision != share.revision:
                    raise ValueError(
                        f"execution {eid}: the server left out revision {share.revision}"
                        " of its context, which this worker does not hold"
                    )
                share = replace(base, cancelled=share.cancelled)
            out[eid] = share
            self._shares[eid] = share
            self._shares.move_to_end(eid)
        while len(self._shares) > self.size:
            self._shares.popitem(last=False)
        return out


def known_revisions(kept: Mapping[int, ExecutionShare]) -> dict[str, str]:
    """A request's `known`: execution id -> the revision of its share the worker holds."""
    return {str(eid): str(share.revision) for eid, share in kept.items()}
