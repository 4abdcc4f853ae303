"""Test infrastructure: a real kube-apiserver and etcd on loopback for tests marked `kube`."""
