// Package buildinfo holds the version and commit stamped into the rld
// binary at build time.
//
// `make build` sets them with the linker:
//
//	go build -ldflags "-X github.com/rld/rld/buildinfo.Version=1.2.0 \
//	  -X github.com/rld/rld/buildinfo.Commit=0123abc"
//
// A plain `go build` leaves Version "dev" and Commit "unknown", or takes
// them from the module and VCS information Go records, when it has any.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Version and Commit are set with -ldflags -X at build time; read them
// through Get.
var (
	Version = ""
	Commit  = ""
)

// Info is what the binary knows about its build.
type Info struct {
	// Version is the release, from `git describe --tags --always --dirty`
	// without the tag's "v" ("1.2.0" for the tag v1.2.0,
	// "1.2.0-3-g0123abc-dirty" after it), or "dev".
	Version string `json:"version"`
	// Commit is the full commit hash, or "unknown".
	Commit string `json:"commit"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"goversion"`
}

// Get returns the build's Info. It is safe for concurrent use.
func Get() Info {
	i := Info{Version: Version, Commit: Commit, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && i.Commit == "" {
				i.Commit = s.Value
			}
		}
	}
	if i.Version == "" {
		i.Version = "dev"
	}
	if i.Commit == "" {
		i.Commit = "unknown"
	}
	return i
}
