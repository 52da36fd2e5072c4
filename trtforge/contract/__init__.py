"""The contract shared by operator, builder and runtime: GPU identity, engine key, manifest, store layout.

Nothing here imports kopf or a Kubernetes client.
"""
