"""The one error importers raise: input that cannot become a topology, and where it went wrong.

Importers read text that users paste from tickets, chat and old reports. When such text cannot be
read, the user needs to know which line to look at and what was expected there, in one line that
fits a terminal: `line 4: expected 8 cells after GPU3, found 5`. Input that is merely incomplete
(a truncated paste) is not an error: the importers return a topology marked `partial` instead.
"""

from __future__ import annotations

__all__ = ["TopologyImportError"]


class TopologyImportError(ValueError):
    """Input that cannot be turned into a `NodeTopology`.

    `line` is the 1-based line of the input the problem is on (None when it is about the whole
    input); `reason` says what was expected and what was found. `str()` is one line.
    """

    def __init__(self, reason: str, *, line: int | None = None) -> None:
        self.reason = " ".join(reason.split())
        self.line = line
        super().__init__(self.reason if line is None else f"line {line}: {self.reason}")
