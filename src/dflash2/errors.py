"""User-facing errors.

Contract: every mistake a user can make (bad config field, bad CLI argument, unknown target,
mismatched draft/target) raises `DFlash2Error` with a one-line message that names the offending
field or value. The CLI prints that line and exits with status 2, without a traceback.
Mistakes a caller must tell apart by kind have their own subclass, so callers map them by type,
never by their text: `ContextLimitError` (a request that does not fit in the target's context,
with the numbers of the sum it broke), `SettingError` (a setting's bad value: its `name` as the API
spells it and the `problem`, so a caller that spells it otherwise, e.g. as a flag, can say so).
"""


class DFlash2Error(ValueError):
    """A one-line, user-facing error naming what is wrong."""


class ContextLimitError(DFlash2Error):
    """prompt + max_new_tokens + block size exceeds the target's context (the numbers as fields)."""

    def __init__(self, prompt_tokens: int, max_new_tokens: int, block: int, limit: int):
        self.prompt_tokens, self.max_new_tokens, self.block, self.limit = prompt_tokens, max_new_tokens, block, limit
        super().__init__(f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} + block size {block} = "
                         f"{self.total} exceeds the target's context limit of {limit} tokens")

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.max_new_tokens + self.block


class SettingError(DFlash2Error):
    """`name` (as the API spells it) and what is wrong with its value (`problem`)."""

    def __init__(self, name: str, problem: str):
        self.name, self.problem = name, problem
        super().__init__(f"{name} {problem}")


def require(condition: bool, message: str) -> None:
    """Raise `DFlash2Error(message)` unless `condition` holds."""
    if not condition:
        raise DFlash2Error(message)
