"""What a deleted TRTEngine does to the build Jobs it requested. No I/O.

A build Job is shared: every TRTEngine that uses it (from any namespace) records itself in its own
requester annotation on the Job. So whether a Job is still needed is read from the Job itself, never
from other engines' status, which may not yet record a claim already made on the Job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from trtforge_operator.observe.views import JobView
from trtforge_operator.planning.engine_actions import DeleteJob, DeleteReason, DropRequester


@dataclass
class Release:
    delete: list[JobView] = field(default_factory=list)  # no requester but the leaving one
    leave: list[JobView] = field(default_factory=list)  # others still named: only drop our annotation


def release_jobs(requester: str, jobs: Iterable[JobView]) -> Release:
    """Split the Jobs `requester` (`namespace/name`) used into those to delete and those to leave."""
    out = Release()
    seen: set[str] = set()
    for j in jobs:
        if j.name in seen or requester not in j.requesters():
            continue
        seen.add(j.name)
        if set(j.requesters()) - {requester}:
            out.leave.append(j)
        else:
            out.delete.append(j)
    return out


def plan_release(requester: str, jobs: Iterable[JobView]) -> tuple[DeleteJob | DropRequester, ...]:
    """What leaving `jobs` takes: delete those no one else names, drop our annotation from the rest."""
    release = release_jobs(requester, jobs)
    return (
        *(DeleteJob(j.name, DeleteReason.RELEASED) for j in release.delete),
        *(DropRequester(j.name, requester) for j in release.leave),
    )
