"""Kubernetes API clients for the test bed (admin credentials from its kubeconfig)."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client, config


def api_client(kubeconfig: Path) -> client.ApiClient:
    """A fresh ApiClient for `kubeconfig` (each caller owns its client; not shared across threads)."""
    return config.new_client_from_config(config_file=str(kubeconfig))
