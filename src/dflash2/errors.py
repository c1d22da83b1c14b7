"""User-facing errors.

Contract: every mistake a user can make (bad config field, bad CLI argument, unknown target,
mismatched draft/target) raises `DFlash2Error` with a one-line message that names the offending
field or value. The CLI prints that line and exits with status 2, without a traceback.
"""


class DFlash2Error(ValueError):
    """A one-line, user-facing error naming what is wrong."""


def require(condition: bool, message: str) -> None:
    """Raise `DFlash2Error(message)` unless `condition` holds."""
    if not condition:
        raise DFlash2Error(message)
