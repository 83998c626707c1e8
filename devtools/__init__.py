"""Developer tools that never ship in the wheel: the local control plane (etcd,
kube-apiserver, kube-controller-manager on loopback) and the CRD generator."""
