"""The runtime's life: start-up (pre-hash, pre-load, fetch, staging, identity, warm start, canary),
the worker processes of ``serve --workers N``, GPU faults and drain (:mod:`.runtime`)."""
