"""The local test bed: a real control plane (etcd, kube-apiserver, controller-manager, scheduler) with
emulated GPU nodes whose pods run as local processes. See docs/design.md §6 and ``trtforge cluster --help``.
"""
