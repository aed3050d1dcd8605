package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/rld/rld/envoyrls"
)

const importEnvoyHelp = `usage: rld config import-envoy FILE.yaml...

Print an rld.toml for envoyproxy/ratelimit YAML configurations (one domain
per file): an [envoy] table serving Envoy's rate limit service on
127.0.0.1:8081, and one fixed_window rule per descriptor with a rate_limit.
What rld cannot express is refused with its file and line, and nothing is
printed. docs/envoy.md describes the mapping.
`

// configHelp is the help of both config subcommands (rld help config).
const configHelp = configCheckHelp + "\n" + importEnvoyHelp

// importEnvoy runs rld config import-envoy.
func importEnvoy(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("config import-envoy", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), configHelp) }
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	args = fs.Args()
	if len(args) == 0 {
		fmt.Fprintln(stderr, "rld config import-envoy: want one or more FILE.yaml")
		fmt.Fprint(stderr, configHelp)
		return exitError
	}
	files, err := envoyrls.ReadFiles(args)
	if err != nil {
		fmt.Fprintln(stderr, "rld:", err)
		return exitError
	}
	out, err := envoyrls.Import(files)
	if err != nil {
		fmt.Fprintln(stderr, "rld:", err)
		return exitError
	}
	if _, err := stdout.Write(out); err != nil {
		fmt.Fprintln(stderr, "rld:", err)
		return exitError
	}
	return 0
}
