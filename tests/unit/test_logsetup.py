"""Log lines of the long-running processes: ISO time with offset, level, logger."""

from __future__ import annotations

import io
import logging
import re

from flowtide.logsetup import FORMAT, IsoFormatter


def test_a_line_has_an_iso_time_its_level_and_logger() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(IsoFormatter(FORMAT))
    logger = logging.getLogger("flowtide.test_logsetup")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("report for execution %s refused", 7)
    finally:
        logger.removeHandler(handler)
    line = stream.getvalue().strip()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d WARNING "
        r"flowtide\.test_logsetup: report for execution 7 refused",
        line,
    ), line
