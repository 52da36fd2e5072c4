"""Shared API pieces: the base model, object metadata, conditions, references.

- :class:`ApiModel`: base of every wire model. Python names are snake_case, the wire is camelCase
  (``populate_by_name``, so both work on input); :meth:`ApiModel.to_wire` gives the JSON-ready dict
  (aliases, no ``None``). Unknown fields are ignored on input (the apiserver prunes them anyway).
- :class:`ObjectMeta`: the parts of ``metadata`` the operator reads; everything else is kept.
- :class:`Condition` and :func:`set_condition` / :func:`get_condition`: Kubernetes-style conditions.
  ``set_condition`` keeps ``lastTransitionTime`` unless the status really flips.
- Constants :data:`GROUP`, :data:`VERSION`, :data:`API_VERSION`.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, ValidationError
from pydantic.alias_generators import to_camel

GROUP: Final = "trtforge.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "trtforge.io/v1alpha1"

DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


def _rfc3339(value: dt.datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


Time = Annotated[dt.datetime, PlainSerializer(_rfc3339, return_type=str, when_used="json")]
"""A timestamp; written as RFC 3339 in UTC with whole seconds, like Kubernetes' metav1.Time."""


def now() -> dt.datetime:
    """The current time in UTC, whole seconds (what a status timestamp should hold)."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


class ApiModel(BaseModel):
    """Base of every wire model: camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        validate_assignment=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready dict with wire (camelCase) names, ``None`` fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ObjectMeta(BaseModel):
    """The parts of ``metadata`` the operator reads; other keys are kept as they are."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    finalizers: list[str] = Field(default_factory=list)


class LocalObjectReference(ApiModel):
    """A reference to an object of the same namespace."""

    name: str = Field(
        min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN, description="Name of the object."
    )


ConditionStatus = Literal["True", "False", "Unknown"]


def _no_schema_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class Condition(ApiModel):
    """One aspect of the resource's state, as in Kubernetes' metav1.Condition."""

    type: str = Field(
        min_length=1,
        max_length=316,
        pattern=r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$",
        description="Condition type, e.g. Ready.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON,
        description="One CamelCase word saying why, for machines.",
    )
    message: str = Field(
        default="",
        max_length=32768,
        description="What happened, for humans.",
        json_schema_extra=_no_schema_default,  # a 1.20 apiserver refuses `default: ""`
    )
    last_transition_time: Time = Field(description="When the status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this condition was computed from."
    )


def get_condition(conditions: list[Condition], type_: str) -> Condition | None:
    """The condition of that type, or None."""
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    at: dt.datetime | None = None,
) -> list[Condition]:
    """A new list with that condition set; ``lastTransitionTime`` moves only when ``status`` changes.

    Order is kept; a new type is appended. The input list is not modified.
    """
    old = get_condition(conditions, type_)
    when = old.last_transition_time if old is not None and old.status == status else (at or now())
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=when,
        observed_generation=observed_generation,
    )
    if old is None:
        return [*conditions, new]
    return [new if c.type == type_ else c for c in conditions]


def ready_text(ready: int, total: int) -> str:
    """``"2/3"``: what the Ready printer columns show."""
    return f"{ready}/{total}"


def field_error(e: ValidationError) -> str:
    """The first error of a refused object, naming its field (``spec.targets[0].gpu: ...``)."""
    err = e.errors()[0]
    path = ""
    for part in err.get("loc", ()):
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{path}: {err['msg']}" if path else str(err["msg"])
