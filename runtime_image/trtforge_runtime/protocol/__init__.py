"""The Open Inference Protocol (v2) on the wire: the HTTP adapter on aiohttp and its JSON/binary codec,
the gRPC adapter on grpc.aio and its messages, and the connection cap in front of HTTP."""
