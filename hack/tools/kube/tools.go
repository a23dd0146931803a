//go:build tools

// Package tools pins the Kubernetes control-plane and node commands that the
// local cluster (hack/cluster-up.sh) runs. Nothing here is shipped: it only lets
// `go build` resolve the binaries from the k8s.io/kubernetes module.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
