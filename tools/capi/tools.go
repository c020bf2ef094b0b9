//go:build tools

// Package tools pins the controller-gen and clusterctl commands and the Cluster API types package so that
// `go build` and controller-gen resolve them from this module's graph.
package tools

import (
	_ "sigs.k8s.io/cluster-api/api/core/v1beta2"
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
