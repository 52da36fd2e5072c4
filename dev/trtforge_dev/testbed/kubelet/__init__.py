"""The emulated kubelet: registers the emulated nodes, heartbeats, and runs their pods as processes."""
