"""How flowtide's long-running processes (server, worker, ui, scheduler) write their log
lines: one line each, `2026-11-29T04:55:01.123+00:00 WARNING flowtide.worker: text`,
the time in ISO 8601 with the machine's offset, then the level and the logger.

    configure()              # in `flowtide worker` / `flowtide scheduler`
    uvicorn.run(..., log_config=config_dict())   # the server's processes, uvicorn's too
"""

from __future__ import annotations

import datetime
import logging
import logging.config
from typing import Any

__all__ = ["IsoFormatter", "config_dict", "configure"]

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class IsoFormatter(logging.Formatter):
    """`%(asctime)s` as ISO 8601 with milliseconds and the UTC offset."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        stamp = datetime.datetime.fromtimestamp(record.created).astimezone()
        return stamp.isoformat(timespec="milliseconds")


def config_dict(level: str = "INFO") -> dict[str, Any]:
    """A `logging.config.dictConfig` document: every logger to stderr in FORMAT; flowtide's
    at `level`, uvicorn's errors at WARNING and its access lines off."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"iso": {"()": IsoFormatter, "format": FORMAT}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "iso",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": "WARNING"},
        "loggers": {
            "flowtide": {"level": level},
            "uvicorn": {"level": "WARNING"},
            "uvicorn.error": {"level": "WARNING"},
            "uvicorn.access": {"level": "WARNING", "propagate": False},
        },
    }


def configure(level: str = "INFO") -> None:
    """Apply `config_dict(level)` to this process."""
    logging.config.dictConfig(config_dict(level))
