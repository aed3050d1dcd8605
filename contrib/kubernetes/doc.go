// Package kubernetes holds rld's Kubernetes manifests (sidecar.yaml: an app
// with rld as a native sidecar; daemonset.yaml: rld once per node) and
// their tests: the manifests decode strictly into the Kubernetes API
// types, and each pod's contract (uids and groups, the shared socket, the
// probe, the drain within the grace period) is exercised by running the
// binary `make build` stamps as the manifest says, without a container
// runtime.
// It is a module of its own so that the Kubernetes API stays out of rld's
// go.mod; `make test` runs it.
package kubernetes
