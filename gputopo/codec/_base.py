"""What every codec module shares: the error type, timestamps and open proto3 enums."""

from __future__ import annotations

import enum
from typing import TypeVar

from google.protobuf.timestamp_pb2 import Timestamp

__all__ = ["CodecError", "seconds", "timestamp"]


class CodecError(ValueError):
    """A message that is well-formed protobuf but not a valid value; `field` names where."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field = field_path
        self.reason = reason


_E = TypeVar("_E", bound=enum.IntEnum)


def timestamp(seconds: float) -> Timestamp:
    """A protobuf Timestamp from unix seconds."""
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def seconds(ts: Timestamp, path: str) -> float:
    """Unix seconds from a protobuf Timestamp; CodecError naming `path` when it is outside what
    a Timestamp may hold (years 1..9999, nanos 0..999999999), which protobuf only notices when
    it converts, so late (after something was applied) unless asked here."""
    try:
        return ts.ToNanoseconds() / 1e9
    except ValueError as err:
        raise CodecError(path, f"is not a valid timestamp ({err})") from None


def wire_enum(cls: type[_E], value: int, path: str) -> _E:
    """An enum member from a wire value; proto3 enums are open, so unknown numbers arrive."""
    try:
        return cls(value)
    except ValueError:
        known = ", ".join(m.name for m in cls)
        raise CodecError(path, f"unknown value {value} (known: {known})") from None
