"""The Node Event reasons a drain records, and the server's instance status words it acts on.

Must not: hold logic.
"""

from __future__ import annotations

from typing import Final

STATUS_PENDING_DELETION: Final = "pending_deletion"
STATUS_DELETING: Final = "deleting"
STATUS_DELETED: Final = "deleted"

REASON_STARTED: Final = "NstanceDrainStarted"
REASON_SUCCEEDED: Final = "NstanceDrainSucceeded"
REASON_BLOCKED: Final = "NstanceDrainBlocked"
REASON_RETRYING: Final = "NstanceDrainRetrying"
REASON_TIMEOUT: Final = "NstanceDrainTimeout"
REASON_FAILED: Final = "NstanceDrainFailed"
