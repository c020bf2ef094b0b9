"""How Nstance programs format their log lines: one JSON object per line, or a plain text layout.

``JsonFormatter`` is what the server writes (always) and the operator writes with ``--log-format json``:
``time`` (UTC, milliseconds), ``level`` (lower case), ``logger``, ``msg`` and, when the record carries an
exception, ``error`` with its traceback; ``suppressed`` when ``logthrottle`` dropped that many repeats
of the same line before it. ``TEXT_FORMAT`` is the ``logging.Formatter`` layout of the
plain-text logs (operator and agent). This module only turns records into text: it must not install
handlers, choose streams or levels, or do any other I/O (each program's command line does that).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Final

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The plain-text log line: time, level, logger, message."""


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str | int] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        suppressed = getattr(record, "suppressed", None)
        if isinstance(suppressed, int):
            entry["suppressed"] = suppressed
        return json.dumps(entry)
