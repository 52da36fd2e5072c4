"""The request pipeline both protocols share: admission, bodies within limits, the model's checks,
dynamic batching onto the execution instances, and the request metrics (:mod:`.service`)."""
