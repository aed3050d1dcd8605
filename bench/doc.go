// Command rld-bench measures the latency of rate-limit checks the way a
// user of rld sees it: an external client of the daemon over its Unix
// socket, speaking rld's protocol (package wire), with the same load put
// on every target of a run and the results printed side by side.
//
//	go build -o rld-bench ./bench
//	rld-bench -spawn -targets echo,redis,rld -rate 20000 -plot bench.svg
//	rld-bench -socket /run/rld/rld.sock -targets echo,rld   # your own rld
//
// Targets (-targets, measured in the order given; ratios are to the
// first):
//
//   - echo: a bare Unix-socket server, started by rld-bench as a process
//     of its own (`rld-bench echo -socket PATH`), that reads request
//     frames as rld does and answers each with a frame of the size of
//     rld's answer: the physical floor of this machine.
//   - redis: rld's token-bucket script (package lua) called directly on a
//     Redis with rueidis EVALSHA, as a service would without rld.
//   - rld: the daemon, checking every request against one rule (a token
//     bucket unless -algorithm says otherwise) keyed by all the
//     descriptors.
//
// With -spawn, rld-bench starts the daemon (bin/rld, or -rld) on a
// configuration it writes to a temporary directory, on the embedded store
// or (-store redis) on a redis-server it starts on a free loopback port
// without persistence; -store embedded,redis gives one table per store.
// It waits for each to answer PING and stops them all when it ends, also
// on SIGINT. Without -spawn it uses the daemon at -socket and the Redis at
// -redis. Only Unix sockets and loopback TCP are used.
//
// Load. In open loop (-mode open, the default), each connection sends its
// share of -rate on a fixed schedule, whatever the target does, and each
// latency is measured from when its request was due, not from when it
// was sent: a target that stalls delays the requests queued behind the
// stall, and they count (the correction for coordinated omission, as in
// wrk2). In closed loop (-mode closed), each connection keeps -depth
// requests in flight and sends the next as soon as an answer comes, as
// fast as the target allows; latencies are from when each request was
// sent, so a stall shows up as a few slow requests only. Keys are drawn
// from one hot key, a uniform or a Zipf distribution over -keys keys, and
// -descriptors is the template of every check's descriptors, with {n}
// replaced by the key number. Every run has a warm-up, a measurement of
// -duration, and at most two seconds more for the last answers: it always
// stops by itself.
//
// Output: the achieved rate; allowed, limited, degraded and error counts
// (errors include timeouts); latency min, p50, p90, p99, p99.9, p99.99
// and max; in open loop, how late the client itself sent; and what each
// decision cost, read at the start and the end of the measurement: the
// CPU time of the process serving the target (/proc/PID/stat of the
// daemon or echo server rld-bench spawned, or -pid), and the script calls
// (INFO commandstats: EVALSHA, EVAL) and CPU time (INFO cpu) of the
// Redis nodes behind it, with each node's share of the calls when there
// are several.
//
// Where rld-bench knows the rule (a daemon it spawned: -limit per second
// under -algorithm; the redis target's token bucket), it also counts each
// key's allowed answers over the whole run and checks the most against
// what the exact algorithm may admit on one key over the run: no key
// may be over it.
//
// -rule-mode cached,strict gives the Redis store one table per rule
// mode, each with a daemon of its own. -redis-cluster runs the spawned
// daemon and the redis target on a Redis Cluster, given by its
// primaries, instead of a spawned redis-server; BenchmarkCluster in this
// package starts a Cluster of three primaries (package redistest) and
// runs rld-bench on it:
//
//	make build && go test -run '^$' -bench Cluster -benchtime 1x ./bench
//
// -json prints the same as JSON, with each latency histogram in HdrHistogram's
// encoding, and -plot draws every target's latency-by-percentile curve on
// one SVG chart. Latencies are recorded in HDR histograms of
// github.com/HdrHistogram/hdrhistogram-go, the reference Go port of Gil
// Tene's HdrHistogram, well kept and free of further dependencies at run
// time.
//
// The client's hot loop does not allocate: requests are encoded with
// wire.AppendRequest into a reused buffer, answers decoded from a reused
// one. (The redis target's rueidis calls allocate, as in any service.)
package main
