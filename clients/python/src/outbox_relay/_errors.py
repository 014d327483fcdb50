"""The errors: every refusal by the database, whatever the driver, as one of these."""

from __future__ import annotations

import re
from collections.abc import Iterable

_CONFLICT = re.compile(r"key (.*) was already used for a different intent", re.DOTALL)


class OutboxError(Exception):
    """The database refused the enqueue: `sqlstate` says why (`22023` bad input,
    `OB413` payload too large, `40001`/`40P01` retry the transaction, ...) and
    `message` is the server's own words. The driver's exception is `__cause__`.

    The transaction is aborted: roll it back (a `with` block does) before
    using the connection again.
    """

    def __init__(
        self,
        sqlstate: str,
        message: str,
        *,
        detail: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(f"{message} (SQLSTATE {sqlstate})")
        self.sqlstate = sqlstate
        self.message = message
        self.detail = detail
        self.hint = hint


class Conflict(OutboxError):
    """SQLSTATE OB409: `key` was already used for another intent (another kind,
    destination or payload). Not worth retrying: use a new key for a new
    operation, or send the original payload."""

    def __init__(
        self,
        key: str,
        message: str,
        *,
        detail: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__("OB409", message, detail=detail, hint=hint)
        self.key = key


def conflict_key(message: str, candidates: Iterable[str]) -> str:
    """The key an OB409 message names: one of the keys sent, else as read from it."""
    for key in sorted(candidates, key=len, reverse=True):
        if f"key {key} was already used for a different intent" in message:
            return key
    m = _CONFLICT.search(message)
    return m.group(1) if m else ""
