"""Pure planners: observed state in, desired children and status out (no I/O, no kopf)."""
