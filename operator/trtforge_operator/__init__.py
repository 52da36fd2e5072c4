"""trtforge operator: API models, CRD generator, planning, kopf handlers, engine broker."""
