"""Kubernetes resource quantities (`512Mi`, `2G`, `1.5Gi`, `100m`, `1e9`, or a plain number).

- :func:`parse_quantity` -> exact :class:`~decimal.Decimal` value.
- :func:`quantity_to_bytes` -> int, rounded up like Kubernetes' ``Quantity.Value()``.
- :data:`QUANTITY_PATTERN` / :data:`NONNEGATIVE_QUANTITY_PATTERN`: the regexes the CRD schema uses.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
_SUFFIX = rf"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?{_NUMBER}))?"
QUANTITY_PATTERN = rf"^[+-]?{_NUMBER}{_SUFFIX}$"
"""Any Kubernetes quantity, signed."""
NONNEGATIVE_QUANTITY_PATTERN = rf"^\+?{_NUMBER}{_SUFFIX}$"
"""A quantity without a minus sign (sizes, counts)."""

_RE = re.compile(rf"^(?P<num>[+-]?{_NUMBER})(?P<suffix>{_SUFFIX[:-1]})?$")

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Decimal:
    """The exact value of a Kubernetes quantity: ``parse_quantity("1Gi") == Decimal(1073741824)``."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity {value!r} must be a number or a string like '512Mi'")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"quantity {value!r} must be finite")
        return Decimal(repr(value))
    text = value.strip()
    m = _RE.match(text)
    if not m:
        raise QuantityError(
            f"{value!r} is not a Kubernetes quantity; expected a number with an optional suffix "
            "(Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent like e9), e.g. '4Gi'"
        )
    try:
        number = Decimal(m.group("num"))
    except InvalidOperation as e:  # pragma: no cover - the regex only admits valid numbers
        raise QuantityError(f"{value!r} has an invalid number") from e
    suffix = m.group("suffix") or ""
    if suffix in _BINARY:
        return number * (Decimal(1024) ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    # decimal exponent: e9, E+3, e-2
    return number * (Decimal(10) ** Decimal(suffix[1:]))


def quantity_to_bytes(value: str | int | float) -> int:
    """A non-negative quantity as a whole number, rounded up (``"0.5"`` -> 1, ``"1Ki"`` -> 1024)."""
    q = parse_quantity(value)
    if q < 0:
        raise QuantityError(f"quantity {value!r} must not be negative")
    return int(q.to_integral_value(rounding="ROUND_CEILING"))
