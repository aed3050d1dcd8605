package lua

import (
	"embed"
	"slices"
)

//go:embed *.lua
var files embed.FS

// names lists the algorithms in the order of algo.Kind.
var names = []string{"token_bucket", "gcra", "sliding_log", "sliding_counter", "fixed_window", "concurrency"}

// shared names the file an algorithm's file builds on, after lib.lua.
var shared = map[string]string{"sliding_log": "log.lua", "concurrency": "log.lua"}

// sources maps an algorithm's name to its complete script: lib.lua, the
// file it shares with others if any, then the algorithm's file.
var sources = func() map[string]string {
	lib := mustRead("lib.lua")
	m := make(map[string]string, len(names))
	for _, name := range names {
		src := lib + "\n"
		if f, ok := shared[name]; ok {
			src += mustRead(f) + "\n"
		}
		m[name] = src + mustRead(name+".lua")
	}
	return m
}()

func mustRead(name string) string {
	b, err := files.ReadFile(name)
	if err != nil {
		panic("BUG: lua: " + err.Error())
	}
	return string(b)
}

// onceSources maps an algorithm's name to its once script: once.lua,
// the algorithm's script as the body of a function, once_end.lua.
var onceSources = func() map[string]string {
	head, end := mustRead("once.lua"), mustRead("once_end.lua")
	m := make(map[string]string, len(names))
	for name, src := range sources {
		m[name] = head + src + "\n" + end
	}
	return m
}()

// OnceSource returns the algorithm's script behind a guard that applies
// each op at most once (algo.Op.Once), and whether there is one. Its
// calling convention is Source's with three more: KEYS[2], a key in
// KEYS[1]'s hash slot, records the op, and two more ARGV after the op's
// own are the mark to record (an integer) and how long to keep the
// record, in ms (>= 1). When KEYS[2] exists the script replies the error
// "RLDAPPLIED …" (it holds the same mark) or "RLDCONFLICT …" (another)
// and changes nothing; else it runs the op as Source's script does and,
// when the op replied without an error, sets KEYS[2]: an op that failed
// is not recorded, and may be sent again. (The op's own arguments are
// read by position, so the two more do not disturb them; takelease,
// which reads all of ARGV, is not sent so.)
func OnceSource(algorithm string) (string, bool) {
	src, ok := onceSources[algorithm]
	return src, ok
}

// Source returns the script of the algorithm with the given configuration
// name ("token_bucket", "gcra", "sliding_log", "sliding_counter",
// "fixed_window", "concurrency"), and whether there is one. The package doc describes its
// calling convention.
func Source(algorithm string) (string, bool) {
	src, ok := sources[algorithm]
	return src, ok
}

// heartbeat is heartbeat.lua, whole.
var heartbeat = mustRead("heartbeat.lua")

// HeartbeatSource returns the script of the registry of live daemons,
// ready for SCRIPT LOAD, EVALSHA or EVAL:
//
//	KEYS[1]  a sorted set of daemon ids, each scored by the Redis TIME
//	         (unix ms) until which that daemon counts as live
//	ARGV[1]  op: "beat" or "leave"
//	ARGV[2]  the daemon's id (not empty)
//	beat     ARGV[3] = ttl in ms (>= 1): record the daemon as live until
//	         now + ttl, remove the members whose time has passed, keep
//	         the key for at least ttl ms, and reply how many daemons are
//	         live (this one included)
//	leave    remove the daemon; reply 1 if it was there, else 0
//
// It touches KEYS[1] only, so it runs on Cluster.
func HeartbeatSource() string { return heartbeat }

// Names lists the algorithm names in a fixed order, that of algo.Kind. The
// caller may modify the returned slice.
func Names() []string { return slices.Clone(names) }
