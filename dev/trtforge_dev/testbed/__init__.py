"""The local test bed: a real control plane (etcd, kube-apiserver, controller-manager, scheduler) with
emulated GPU nodes whose pods run as local processes. See docs/design.md §"The test bed" and
``trtforge cluster --help``.
"""
