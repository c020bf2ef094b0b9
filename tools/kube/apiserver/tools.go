//go:build tools

// Package tools pins the kube-apiserver and kube-controller-manager commands so that `go build` resolves them from this module's graph.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
