"""The worker's former module, kept for imports of it: the worker is `flowtide.worker`."""

from __future__ import annotations

from flowtide.errors import ServerError as ApiError
from flowtide.worker import Worker as RemoteWorker
from flowtide.worker._api import Reply as _Reply
from flowtide.worker._reports import Reporter as _Reporter

__all__ = ["ApiError", "RemoteWorker", "_Reply", "_Reporter"]
