"""Fields the apiserver dropped without a word, as far as the operator can see them. Pure.

Kubernetes 1.20 prunes fields a CRD's structural schema does not know and has no strict field
validation, so ``spec.maxSizeBytes`` (meant as ``spec.model.maxSizeBytes``) vanishes and the user
believes a limit that does not exist. What ``kubectl apply`` sent survives in the
``kubectl.kubernetes.io/last-applied-configuration`` annotation: every path in it that the schema does
not know was pruned. The ``UnknownFields`` condition names each path and the known field it most
likely meant (the same name elsewhere in the schema). Objects written otherwise (``kubectl create``,
server-side apply, a client library) carry no such annotation, and nothing is reported for them.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import BaseModel

from trtforge_operator.api import Condition, set_condition

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
UNKNOWN_FIELDS = "UnknownFields"
PRUNED = "FieldsPruned"
NONE_PRUNED = "NoUnknownFields"
TOP_LEVEL = frozenset({"apiVersion", "kind", "metadata", "status"})
MAX_LISTED = 10
LIKELY_RATIO = 0.8  # difflib's ratio of a name to a known one, to be named as likely meant


@cache
def spec_schema(model: type[BaseModel]) -> Mapping[str, Any]:
    """The structural schema of `model`'s ``spec``, as its CRD carries it."""
    from trtforge_operator.crdgen import structural_schema

    schema: Mapping[str, Any] = structural_schema(model)["properties"]["spec"]
    return schema


def _unknown(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, Mapping):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out: list[str] = []
        for k, v in value.items():
            sub = f"{path}.{k}"
            if props is not None and k in props:
                out += _unknown(v, props[k], sub)
            elif isinstance(extra, Mapping):
                out += _unknown(v, extra, sub)
            elif props is not None:
                out.append(sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [p for i, v in enumerate(value) for p in _unknown(v, schema["items"], f"{path}[{i}]")]
    return []


def _known_paths(schema: Mapping[str, Any], path: str) -> list[str]:
    out: list[str] = []
    for k, sub in (schema.get("properties") or {}).items():
        out.append(f"{path}.{k}")
        out += _known_paths(sub, f"{path}.{k}")
    if isinstance(schema.get("items"), Mapping):
        out += _known_paths(schema["items"], f"{path}[]")
    return out


def likely_field(path: str, schema: Mapping[str, Any]) -> str | None:
    """The known field `path` most likely meant: one of the same name in any case (a misplaced field),
    else of a close name (a typo); under the same parent first, then the shallowest."""
    parent, _, name = path.rpartition(".")
    leaf = name.split("[", 1)[0].lower()
    parent = re.sub(r"\[\d+\]", "[]", parent)

    def score(p: str) -> float:
        known = p.rsplit(".", 1)[-1].lower()
        return 1.0 if known == leaf else difflib.SequenceMatcher(None, leaf, known).ratio()

    close = [(score(p), p) for p in _known_paths(schema, "spec")]
    close = [(r, p) for r, p in close if r >= LIKELY_RATIO]
    if not close:
        return None
    return min(close, key=lambda rp: (-rp[0], rp[1].rpartition(".")[0] != parent, rp[1].count("."), rp[1]))[1]


def pruned_fields(annotations: Mapping[str, str], schema: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(path, likely intended path) of each field the last ``kubectl apply`` sent that `schema` (the
    spec's) does not know; [] without the annotation or when it is not JSON."""
    try:
        applied = json.loads(annotations.get(LAST_APPLIED) or "null")
    except ValueError:
        return []
    if not isinstance(applied, Mapping):
        return []
    out: list[tuple[str, str | None]] = [
        (str(k), None) for k in applied if k not in TOP_LEVEL and k != "spec"
    ]
    spec = applied.get("spec")
    out += [(p, likely_field(p, schema)) for p in _unknown(spec, schema, "spec")] if spec is not None else []
    return sorted(out)


def pruned_condition(
    conditions: list[Condition], found: list[tuple[str, str | None]], generation: int, at: Any
) -> list[Condition]:
    """The UnknownFields condition: True naming what was pruned; False once nothing is (left out
    while it never was)."""
    if not found:
        if not any(c.type == UNKNOWN_FIELDS for c in conditions):
            return conditions
        return set_condition(
            conditions,
            UNKNOWN_FIELDS,
            "False",
            NONE_PRUNED,
            "the last kubectl apply set only fields the schema knows",
            observed_generation=generation,
            at=at,
        )
    parts = [f"{p} (did you mean {m}?)" if m else p for p, m in found[:MAX_LISTED]]
    more = f" and {len(found) - MAX_LISTED} more" if len(found) > MAX_LISTED else ""
    return set_condition(
        conditions,
        UNKNOWN_FIELDS,
        "True",
        PRUNED,
        f"the apiserver dropped fields this resource does not have, so they have no effect: "
        f"{', '.join(parts)}{more}",
        observed_generation=generation,
        at=at,
    )
