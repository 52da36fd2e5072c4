"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics (docs/operations.md).

`lease` holds the pure decisions, `elector` the loop that applies them to the apiserver, and
`runner` wraps how the operator starts: a replica runs kopf only while it holds the Lease, and exits
as soon as it cannot renew within the renew deadline.
"""
