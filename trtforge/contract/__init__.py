"""The contract shared by operator, builder and runtime: GPU identity, engine key, manifest, store layout.

Nothing here imports kopf or a Kubernetes client. The models a runtime imports before it can verify
an engine are declared with ``defer_build=True``: pydantic builds a model's validator at its first
use instead of at import, so a runtime that validates only the manifest and the GPU identity does not
build the rest (docs/design.md, "Runtime cold start").
"""
