"""Kubernetes quantity parsing, and that the CRD's quantity pattern agrees with the parser."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from trtforge.contract.quantity import (
    NONNEGATIVE_QUANTITY_PATTERN,
    QUANTITY_PATTERN,
    QuantityError,
    parse_quantity,
    quantity_to_bytes,
)

GOOD = [
    ("4Gi", Decimal(4 * 1024**3)),
    ("1.5Gi", Decimal(1536 * 1024**2)),
    ("512Mi", Decimal(512 * 1024**2)),
    ("1Ki", Decimal(1024)),
    ("2Ei", Decimal(2 * 1024**6)),
    ("100m", Decimal("0.1")),
    ("250u", Decimal("0.00025")),
    ("3n", Decimal("0.000000003")),
    ("2k", Decimal(2000)),
    ("1M", Decimal(10**6)),
    ("8G", Decimal(8 * 10**9)),
    ("1e9", Decimal(10**9)),
    ("1E3", Decimal(1000)),
    ("5e-1", Decimal("0.5")),
    ("0.5", Decimal("0.5")),
    (".5", Decimal("0.5")),
    ("7", Decimal(7)),
    ("+1Ki", Decimal(1024)),
    ("-1Ki", Decimal(-1024)),
    (123, Decimal(123)),
]
BAD = ["4GB", "4gi", "Gi", "", "1.2.3", "1 Gi", "abc", "1e", "0x10", "1Kib"]


@pytest.mark.parametrize(("text", "value"), GOOD)
def test_parse(text: str | int, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", BAD)
def test_parse_rejects_with_a_clear_message(text: str) -> None:
    with pytest.raises(QuantityError, match="not a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("text", [t for t, _ in GOOD if isinstance(t, str)] + BAD)
def test_crd_pattern_agrees_with_parser(text: str) -> None:
    ok = True
    try:
        parse_quantity(text)
    except QuantityError:
        ok = False
    assert bool(re.match(QUANTITY_PATTERN, text)) == ok
    assert bool(re.match(NONNEGATIVE_QUANTITY_PATTERN, text)) == (ok and not text.startswith("-"))


def test_bytes_round_up_and_refuse_negative() -> None:
    assert quantity_to_bytes("4Gi") == 4294967296
    assert quantity_to_bytes("0.5") == 1
    assert quantity_to_bytes("100m") == 1
    assert quantity_to_bytes("1.5Ki") == 1536
    assert quantity_to_bytes(0) == 0
    with pytest.raises(QuantityError, match="must not be negative"):
        quantity_to_bytes("-1Gi")


def test_bool_is_not_a_quantity() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(True)
