"""Kubernetes API clients for the test bed (admin credentials from its kubeconfig), and the one
list-then-watch loop that follows a collection."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def api_client(kubeconfig: Path) -> client.ApiClient:
    """A fresh ApiClient for `kubeconfig` (each caller owns its client; not shared across threads)."""
    return config.new_client_from_config(config_file=str(kubeconfig))


def list_then_watch(
    relist: Callable[[], str],
    list_call: Callable[..., Any],
    on_event: Callable[[str, dict[str, Any]], None],
    stopping: Callable[[], bool],
    on_error: Callable[[BaseException], None],
    *args: Any,
    timeout_seconds: int = 120,
    **kwargs: Any,
) -> None:
    """Follow a collection until `stopping()`: `relist()` reads it whole and returns its
    resourceVersion, then one watch (`list_call(*args, **kwargs)`) from there hands each event's type
    and object to `on_event`. A watch that times out starts again from the last version seen; an
    expired version (410) or an ERROR event lists again at once; any other failure is passed to
    `on_error`, then lists again a second later."""
    rv = ""
    while not stopping():
        try:
            if not rv:
                rv = relist()
            w = watch.Watch()
            for ev in w.stream(
                list_call,
                *args,
                resource_version=rv,
                timeout_seconds=timeout_seconds,
                _request_timeout=timeout_seconds + 30,
                **kwargs,
            ):
                if stopping():
                    w.stop()
                    break
                obj = ev["raw_object"]
                if ev["type"] == "ERROR":
                    rv = ""
                    break
                rv = obj["metadata"]["resourceVersion"]
                on_event(ev["type"], obj)
        except Exception as e:
            rv = ""
            if stopping() or (isinstance(e, ApiException) and e.status == 410):
                continue
            on_error(e)
            time.sleep(1)
