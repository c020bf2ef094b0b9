//go:build tools

// Package tools pins the etcd server command so that `go build` resolves it from this module's graph.
package tools

import _ "go.etcd.io/etcd/server/v3"
