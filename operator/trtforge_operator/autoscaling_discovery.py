"""The autoscaling APIs the apiserver serves (HPA versions, KEDA's ScaledObject), looked up through
discovery and kept for a while; when to look again is decided by ``planning.autoscaling.rediscover``:
after a TTL, sooner when a pass wants an API the last look did not find (KEDA installed later), and
at once when a write in the kept API is refused with 404 (the cluster was upgraded past it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from kubernetes.client.rest import ApiException

from trtforge.logs import fields
from trtforge_operator.api import Autoscaling
from trtforge_operator.config import AutoscalingSettings
from trtforge_operator.kube import Kube
from trtforge_operator.planning.autoscaling import (
    KEDA_API,
    AutoscalingApis,
    Rediscover,
    hpa_api_version,
    keda_served,
    rediscover,
    wants_missing,
)

log = logging.getLogger(__name__)


@dataclass
class AutoscalingDiscovery:
    kube: Kube
    settings: AutoscalingSettings
    apis: AutoscalingApis = field(default_factory=AutoscalingApis)
    looked_at: float | None = None  # when the last look succeeded
    refused: bool = False  # a write in the kept API came back 404 since

    async def current(self, autos: Iterable[Autoscaling | None], now: float | None = None) -> AutoscalingApis:
        """What is served, looked up again when :func:`rediscover` says so (a failed look keeps what
        was known and is tried again on the next pass)."""
        now = time.time() if now is None else now
        why = rediscover(
            self.looked_at,
            now,
            ttl=self.settings.discovery_ttl_seconds,
            miss_retry=self.settings.miss_retry_seconds,
            wants_missing=wants_missing(autos, self.apis),
            refused=self.refused,
        )
        if why == Rediscover.NO:
            return self.apis
        try:
            hpa = hpa_api_version(await self.kube.served_versions("autoscaling"))
            keda = keda_served(await self.kube.served_resources(KEDA_API))
        except ApiException as e:
            log.warning("could not discover the autoscaling APIs: %s %s", e.status, e.reason)
            return self.apis
        new = AutoscalingApis(hpa=hpa, keda=keda)
        if new != self.apis or self.looked_at is None:
            log.info(
                "autoscaling APIs: HPA %s, KEDA ScaledObject %s (%s)",
                hpa.value if hpa else "none",
                "served" if keda else "not served",
                why.value,
                extra=fields(hpa=hpa.value if hpa else "", keda=keda, reason=why.value),
            )
        self.apis, self.looked_at, self.refused = new, now, False
        return new

    def write_refused(self) -> None:
        """A write of an autoscaler in the kept API came back 404: look again on the next pass."""
        self.refused = True
