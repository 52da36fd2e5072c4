"""The v2 gRPC protocol's messages and service stubs, generated from inference.proto and shipped."""
