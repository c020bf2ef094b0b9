"""``ObjectLogger``: log lines that start with the Kubernetes object they are about.

Every controller and the drain coordinator log through one, so an operator's log reads
``Kind namespace/name: what happened``. Must not: decide what is logged or at which level.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any


class ObjectLogger(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every message with ``Kind namespace/name`` (the ``object`` of its ``extra``)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return f"{(self.extra or {}).get('object', '')}: {msg}", kwargs
