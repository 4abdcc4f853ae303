"""Kubernetes resource quantities ("500m", "1Gi", "1e3") as the scheduler counts them.

The pure core may not import `kubernetes` (whose `utils.parse_quantity` does this), and the
fitness rules must compare exactly what kube-scheduler compares: `Quantity.MilliValue()` for
CPU and `Quantity.Value()` for everything else, both rounded *up* to an integer (k8s.io/
apimachinery `pkg/api/resource/quantity.go`). So this small parser keeps the value as an exact
`Fraction` and rounds at the end. The grammar (same file, "Quantity" doc comment):

    <quantity> ::= <signedNumber><suffix>
    <suffix>   ::= Ki | Mi | Gi | Ti | Pi | Ei | n | u | m | "" | k | M | G | T | P | E
                 | e<signedNumber> | E<signedNumber>
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["QuantityError", "milli_value", "parse_quantity", "value"]

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_FORM = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)
# An exponent past this is no resource anyone has; refusing it keeps Fraction arithmetic small.
_MAX_EXPONENT = 64


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity."""


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a quantity; raises `QuantityError` for anything else."""
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"{text!r} is not a quantity")
        return Fraction(text)
    match = _FORM.match(str(text).strip())
    if match is None:
        raise QuantityError(f"{text!r} is not a quantity")
    number = Fraction(match["number"])
    if match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"{text!r}: exponent out of range")
        return number * Fraction(10) ** exponent
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * Fraction(1024) ** _BINARY[suffix]
    return number * Fraction(10) ** _DECIMAL[suffix]


def value(text: str | int | float) -> int:
    """`Quantity.Value()`: the value rounded up to an integer (bytes, pods, devices)."""
    return math.ceil(parse_quantity(text))


def milli_value(text: str | int | float) -> int:
    """`Quantity.MilliValue()`: thousandths rounded up (CPU is counted in millicores)."""
    return math.ceil(parse_quantity(text) * 1000)
