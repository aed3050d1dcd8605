// Package bench will hold rld-bench, the open-loop latency benchmark that
// acts as an external client of the daemon over its socket.
//
// Until it lands, `make bench` runs the Go benchmarks of the packages
// (see docs/performance.md).
package bench
