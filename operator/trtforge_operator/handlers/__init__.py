"""The kopf layer: thin handlers that gather observed state and apply what the pure planners decide.

One level-based path per resource: a daemon per TRTEngine / InferenceDeployment loops "observe → plan →
apply → wait", woken by events on the resource and its children (Jobs, Pods, Deployments, Nodes) or by
a resync timer. Observed children come from kopf indices, looked up by key (a pass touches only its
own targets' Jobs and its own pods), so a pass costs what its own work costs, not what the cluster
holds (docs/design.md §"Scale"). An event wakes only the owners it names (workqueue.py). Build
capacity is admitted in one synchronous step (build_slots.py); no lock is held across an API call.
Status is patched only when it differs from what is there (status_cache.py). Deletion handlers (with
our finalizer) clean up children.

One module per concern: engine.py and deployment.py (a pass of each kind, and its deletion: observe/,
planning/, apply/), finished_jobs.py and gc.py (the timers that delete finished build Jobs and
unreferenced engines), wakeups.py (which loops an event wakes), loop.py (the per-resource loop),
registration.py (kopf's settings, indices, daemons and deletion handlers).
"""

from __future__ import annotations

from trtforge_operator.handlers.registration import register

__all__ = ["register"]
