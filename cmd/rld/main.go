// Command rld is the rate-limit daemon and its command-line tool.
//
//	rld [serve] [-config F] [-socket P] [-http A]
//	rld check [-socket P] [-cost N] [-peek] [-json] name=value…
//	rld acquire [-socket P] [-cost N] [-json] name=value…
//	rld release [-socket P] [-json] LEASE
//	rld settle [-socket P] [-json] LEASE COST
//	rld config check F
//	rld config import-envoy F.yaml…
//	rld admin [-socket P | -http URL -token-file F] [-json] OP [args…]
//	rld version
//
// `rld help` and `rld COMMAND -h` describe each command; man rld(1) is the
// same text, installed by the Debian package.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rld/rld/buildinfo"
	"github.com/rld/rld/client"
	"github.com/rld/rld/config"
	"github.com/rld/rld/daemon"
	"github.com/rld/rld/derive"
	"github.com/rld/rld/header"
	"github.com/rld/rld/wire"
)

// Exit codes of rld check: 0 allowed, 1 limited or blocked, 2 error.
const (
	exitAllowed = 0
	exitDenied  = 1
	exitError   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && (!strings.HasPrefix(args[0], "-") || isHelp(args[0])) {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(args, stdout, stderr)
	case "check":
		return check(args, stdout, stderr)
	case "acquire":
		return decideCmd("acquire", args, stdout, stderr)
	case "release":
		return release(args, stdout, stderr)
	case "settle":
		return settle(args, stdout, stderr)
	case "config":
		if len(args) > 0 && isHelp(args[0]) {
			fmt.Fprint(stdout, configHelp)
			return 0
		}
		if len(args) == 0 {
			fmt.Fprintln(stderr, "rld config: want a subcommand: check FILE, or import-envoy FILE.yaml...")
			fmt.Fprint(stderr, configHelp)
			return exitError
		}
		if args[0] == "import-envoy" {
			return importEnvoy(args[1:], stdout, stderr)
		}
		if args[0] != "check" {
			fmt.Fprintf(stderr, "rld config: unknown subcommand %q: want check FILE, or import-envoy FILE.yaml...\n", args[0])
			fmt.Fprint(stderr, configHelp)
			return exitError
		}
		return configCheck(args[1:], stdout, stderr)
	case "admin":
		return adminCmd(args, stdout, stderr)
	case "version":
		return versionCmd(args, stdout, stderr)
	case "help", "-h", "-help", "--help":
		if len(args) > 0 && !isHelp(args[0]) {
			// rld help COMMAND is rld COMMAND -h; rld help -h, rld -h
			// help and the like are rld help.
			return run(append(args[:1:1], "-h"), stdout, stderr)
		}
		usage(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "rld: unknown command %q\n", cmd)
		usage(stderr)
		return exitError
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `rld: the rate-limit daemon and its command-line tool

usage:
  rld [serve] [-config FILE] [-socket PATH] [-http ADDR] [-admin-http ADDR]
                                     run the daemon (the default command)
  rld check [-socket PATH] [-cost N] [-peek] [-json] [-timeout D] name=value...
                                     ask the daemon; exit 0 allowed, 1 limited or blocked, 2 error
  rld acquire [-socket PATH] [-cost N] [-json] [-timeout D] name=value...
                                     as check, holding concurrency slots; prints the lease
  rld release [-socket PATH] [-json] [-timeout D] LEASE
                                     give an acquire's slots back; exit 0 released, 1 unknown lease, 2 error
  rld settle [-socket PATH] [-json] [-timeout D] LEASE COST
                                     charge or refund an acquire to its actual COST, release it; exit as release
  rld config check FILE              validate a configuration file; exit 0 valid, 2 invalid
  rld config import-envoy FILE.yaml...
                                     print an rld.toml for envoyproxy/ratelimit YAML (docs/envoy.md)
  rld admin [-socket PATH | -http URL -token-file FILE] [-json] [-timeout D] OP [ARGS...]
                                     run an admin op: explain, top, config, reset, grant, override,
                                     block, unblock, list; exit 0 ok, 1 refused or not found, 2 error
  rld version [-json]                print the version, commit and Go version
  rld help [COMMAND]                 this text, or a command's (same as rld COMMAND -h)

An unknown command or flag prints the usage on stderr and exits 2. The
socket is $RLD_SOCKET when set, else /run/rld/rld.sock. The daemon reloads
its configuration on SIGHUP and drains on SIGTERM.
Documentation: /usr/share/doc/rld (installed) or docs/ in the source; man rld.
`)
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// flagUsage returns a FlagSet.Usage that prints synopsis and about, then
// the flags.
func flagUsage(fs *flag.FlagSet, synopsis, about string) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s\n\n%s\n", synopsis, about)
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(w, "\nflags:")
			fs.PrintDefaults()
		}
	}
}

// parseFlags parses args into fs: the help (-h) goes to stdout, an error
// and the help to stderr. It returns the exit code to leave with, or -1 to
// go on.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) int {
	var out bytes.Buffer
	fs.SetOutput(&out)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	switch {
	case err == nil:
		return -1
	case errors.Is(err, flag.ErrHelp):
		_, _ = stdout.Write(out.Bytes())
		return 0
	default:
		_, _ = stderr.Write(out.Bytes())
		return exitError
	}
}

const configCheckHelp = `usage: rld config check FILE

Parse and validate the configuration FILE as the daemon would on start or
reload, without starting anything. Prints "FILE: ok, N rules" and one line
per rule, or every problem found, each naming the file, line and field; exit 0 when
the file is valid, 2 otherwise. A running daemon keeps its rules in force
when a reload finds an invalid file: check before 'systemctl reload rld'.
`

func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.Usage = flagUsage(fs, "rld version [-json]",
		"Print the version (the release tag without its v, or git describe of the\nsource it was built from), the commit "+
			"and the Go version. /healthz and the metric rld_build_info say the same.")
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rld version: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	bi := buildinfo.Get()
	if *asJSON {
		b, _ := json.Marshal(bi)
		fmt.Fprintln(stdout, string(b))
		return 0
	}
	fmt.Fprintf(stdout, "rld %s (commit %s, %s)\n", bi.Version, bi.Commit, bi.GoVersion)
	return 0
}

func serve(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "rld.toml", "configuration `file`")
	socket := fs.String("socket", "", "Unix socket `path` (overrides server.socket)")
	httpAddr := fs.String("http", "", "HTTP listen `address` (overrides server.http; \"off\" disables)")
	adminAddr := fs.String("admin-http", "", "admin HTTP listen `address` (overrides admin.http; \"off\" disables)")
	fs.Usage = flagUsage(fs, "rld [serve] [-config FILE] [-socket PATH] [-http ADDR] [-admin-http ADDR]",
		"Run the daemon: answer checks on the Unix socket (binary protocol) and on\n"+
			"HTTP (/v1/check, /v1/auth, /v1/acquire, /v1/release, /v1/settle, /metrics,\n"+
			"/healthz). Under systemd socket activation it serves the socket it is\n"+
			"handed (rld.socket) instead of -socket. SIGHUP\n"+
			"reloads the rules (an invalid file is rejected, the rules in force stay);\n"+
			"SIGTERM stops accepting, answers what was read, and exits 0. With\n"+
			"Type=notify it sends READY=1, and WATCHDOG=1 when WatchdogSec= is set.\n"+
			"Exit status: 0 after SIGTERM or SIGINT, 2 when it cannot start (an\n"+
			"invalid configuration, a socket in use, an address that cannot be bound).")
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		// A command after flags (rld -socket S admin …) would otherwise
		// start a daemon: the command comes first.
		fmt.Fprintf(stderr, "rld serve: unexpected argument %q (a command comes first: rld COMMAND [flags])\n", fs.Arg(0))
		fs.Usage()
		return exitError
	}
	opts := daemon.Options{ConfigPath: *cfgPath, Socket: *socket}
	if *httpAddr != "" {
		a := *httpAddr
		if a == "off" {
			a = ""
		}
		opts.HTTP = &a
	}
	if *adminAddr != "" {
		a := *adminAddr
		if a == "off" {
			a = ""
		}
		opts.AdminHTTP = &a
	}
	// Catch SIGHUP before the first load, so a reload sent during start-up
	// is not fatal.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	opts.Reload = hup
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d, err := daemon.New(opts)
	if err != nil {
		fmt.Fprintln(stderr, "rld:", err)
		return exitError
	}
	if err := d.Run(ctx); err != nil {
		// Run fails only before it serves: a socket or an address that
		// cannot be listened on.
		fmt.Fprintln(stderr, "rld:", err)
		return exitError
	}
	return 0
}

// socketUsage describes the -socket flag of the commands that talk to the
// daemon.
const socketUsage = "daemon's Unix socket `path` ($RLD_SOCKET when set)"

func defaultSocket() string {
	if s := os.Getenv("RLD_SOCKET"); s != "" {
		return s
	}
	return client.DefaultSocket
}

func check(args []string, stdout, stderr io.Writer) int {
	return decideCmd("check", args, stdout, stderr)
}

// decideCmd is rld check, and rld acquire (cmd "acquire"): the same
// request, which holds concurrency slots and prints their lease.
func decideCmd(cmd string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", defaultSocket(), socketUsage)
	cost := fs.Uint("cost", 1, "units to take")
	peek := new(bool)
	if cmd == "check" {
		peek = fs.Bool("peek", false, "decide without consuming")
	}
	asJSON := fs.Bool("json", false, "print one JSON object")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long")
	if cmd == "check" {
		fs.Usage = flagUsage(fs, "rld check [-socket PATH] [-cost N] [-peek] [-json] [-timeout D] name=value...",
			"Ask the daemon whether a request with these descriptors may go through,\n"+
				"e.g. rld check api_key=sk_123 endpoint=/v1/search. Prints the decision, the\n"+
				"rule that decided, and the HTTP headers a client would send. Exit status:\n"+
				"0 allowed, 1 limited or blocked, 2 error. The caller needs write access to\n"+
				"the socket: be root or a member of the rld group.")
	} else {
		fs.Usage = flagUsage(fs, "rld acquire [-socket PATH] [-cost N] [-json] [-timeout D] name=value...",
			"Ask as rld check does (the rate rules take -cost units); each concurrency\n"+
				"rule that applies also holds one slot, whatever the cost, until\n"+
				"'rld release LEASE' or 'rld settle LEASE COST', or until its timeout. Prints\n"+
				"the answer and the line lease=LEASE. Exit status: 0 allowed, 1 limited or\n"+
				"blocked, 2 error.")
	}
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if *cost == 0 || *cost > 1<<32-1 {
		fmt.Fprintf(stderr, "rld %s: -cost must be from 1 to 4294967295, got %d\n", cmd, *cost)
		return exitError
	}
	var descs []client.Descriptor
	for _, a := range fs.Args() {
		name, value, ok := strings.Cut(a, "=")
		if !ok || name == "" {
			fmt.Fprintf(stderr, "rld %s: descriptor %q is not name=value\n", cmd, a)
			return exitError
		}
		descs = append(descs, client.Descriptor{Name: name, Value: value})
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c := client.New(*socket)
	defer c.Close()
	var res client.Result
	var err error
	switch {
	case cmd == "acquire":
		res, err = c.Acquire(ctx, descs, uint32(*cost))
	case *peek:
		res, err = c.Peek(ctx, descs, uint32(*cost))
	default:
		res, err = c.Check(ctx, descs, uint32(*cost))
	}
	return printResult(cmd, res, err, *asJSON, stdout, stderr)
}

// printResult prints the answer of rld check, acquire or release (cmd)
// and returns the exit status.
func printResult(cmd string, res client.Result, err error, asJSON bool, stdout, stderr io.Writer) int {
	var rerr *client.ResponseError
	if err != nil && !errors.As(err, &rerr) {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer from rld within -timeout (%w): is the daemon stopped or overloaded?", err)
		}
		fmt.Fprintf(stderr, "rld %s: %v\n", cmd, err)
		return exitError
	}
	decision := res.Status.String()
	if asJSON {
		out := map[string]any{
			"decision":        decision,
			"limit":           res.Limit,
			"remaining":       res.Remaining,
			"reset_ms":        res.Reset.Milliseconds(),
			"retry_after_ms":  res.RetryAfter.Milliseconds(),
			"window_ms":       res.Window.Milliseconds(),
			"quota":           res.Quota,
			"quota_window_ms": res.QuotaWindow.Milliseconds(),
			"next_ms":         nil, // unknown
			"rule":            res.Rule,
		}
		if res.Next >= 0 {
			out["next_ms"] = res.Next.Milliseconds()
		}
		if rerr != nil {
			out["error"] = map[string]any{"code": rerr.Code.String(), "message": rerr.Message}
		}
		if cmd == "acquire" {
			out["lease"] = res.Lease
		}
		if res.Degraded {
			// Decided by the rule's fail mode while Redis fails.
			out["degraded"] = true
		}
		b, _ := json.Marshal(out)
		fmt.Fprintln(stdout, string(b))
	} else {
		// Whole seconds, rounded up as the HTTP fields are (-json gives
		// milliseconds): the same checks print the same line.
		fmt.Fprintf(stdout, "%s rule=%q limit=%d remaining=%d reset=%ds retry_after=%ds\n",
			decision, res.Rule, res.Limit, res.Remaining, header.Seconds(res.Reset), header.Seconds(res.RetryAfter))
		if rerr != nil {
			// The error of the answer goes with the other errors.
			fmt.Fprintf(stderr, "rld %s: %s: %s\n", cmd, rerr.Code, rerr.Message)
		}
		if res.Lease != "" {
			fmt.Fprintf(stdout, "lease=%s\n", res.Lease)
		}
		// The fields the HTTP endpoint renders for the same decision:
		// the frame carries what it renders them from.
		fields, _ := header.AppendFields(nil, nil, res.Answer(), time.Now())
		for _, f := range fields {
			fmt.Fprintf(stdout, "%s: %s\n", f.Name, f.Value)
		}
		if res.Degraded {
			// As the HTTP endpoint marks an answer of a fail mode.
			fmt.Fprintln(stdout, "X-RateLimit-Policy: degraded")
		}
	}
	switch {
	case (cmd == "release" || cmd == "settle") && rerr != nil && rerr.Code == wire.CodeNotFound:
		return exitDenied
	case rerr != nil:
		return exitError
	case res.Status == wire.StatusLimited || res.Status == wire.StatusBlocked:
		return exitDenied
	default:
		return exitAllowed
	}
}

func configCheck(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && isHelp(args[0]) {
		fmt.Fprint(stdout, configHelp)
		return 0
	}
	if len(args) != 1 {
		fmt.Fprintf(stderr, "rld config check: want one FILE, got %d arguments\n", len(args))
		fmt.Fprint(stderr, configHelp)
		return exitError
	}
	cfg, err := config.Load(args[0])
	if err != nil {
		fmt.Fprintln(stderr, "rld:", err)
		return exitError
	}
	dv, err := derive.New(cfg.Request)
	if err != nil {
		fmt.Fprintf(stderr, "rld: %s: %v\n", args[0], err)
		return exitError
	}
	fmt.Fprintf(stdout, "%s: ok, %d rules\n", args[0], len(cfg.Rules))
	fmt.Fprintf(stdout, "request: clients send the header fields %s\n", strings.Join(dv.Headers(), ", "))
	for i := range cfg.Rules {
		fmt.Fprintln(stdout, cfg.Rules[i].Summary())
	}
	return 0
}

// release is rld release: it gives back the concurrency slots of a lease
// that rld acquire (or any client's acquire) printed.
func release(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", defaultSocket(), socketUsage)
	asJSON := fs.Bool("json", false, "print one JSON object")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long")
	fs.Usage = flagUsage(fs, "rld release [-socket PATH] [-json] [-timeout D] LEASE",
		"Give back the concurrency slots of LEASE, which rld acquire printed. Any\n"+
			"daemon sharing the store releases it. Exit status: 0 released (or a lease\n"+
			"that held no slot: only rate rules counted its acquire, nothing to give back),\n"+
			"1 its slots are gone (released already, or their timeout passed: nothing\n"+
			"changed), 2 error.")
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if fs.NArg() != 1 || fs.Arg(0) == "" {
		fmt.Fprintln(stderr, "rld release: want one LEASE")
		return exitError
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c := client.New(*socket)
	defer c.Close()
	res, err := c.Release(ctx, fs.Arg(0))
	return printResult("release", res, err, *asJSON, stdout, stderr)
}

// settle is rld settle: it corrects the cost of an acquire (its lease)
// to the request's actual cost, and releases its slots.
func settle(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("settle", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", defaultSocket(), socketUsage)
	asJSON := fs.Bool("json", false, "print one JSON object")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long")
	fs.Usage = flagUsage(fs, "rld settle [-socket PATH] [-json] [-timeout D] LEASE COST",
		"End the request that LEASE (printed by rld acquire -cost ESTIMATE) names, at its\n"+
			"actual COST: the rate rules are charged the part above the estimate (a key may\n"+
			"go into debt) or refunded the part below, and its concurrency slots go back.\n"+
			"COST is 0 to 4294967295; 0 means 1, as on the wire. A release does not settle:\n"+
			"a settle after it still corrects the rate rules once. Exit status: 0 settled,\n"+
			"1 unknown lease (settled already, older than 10 minutes, or, holding no rate\n"+
			"rule, released already: nothing changed), 2 error.")
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if fs.NArg() != 2 || fs.Arg(0) == "" {
		fmt.Fprintln(stderr, "rld settle: want LEASE COST")
		return exitError
	}
	cost, err := strconv.ParseUint(fs.Arg(1), 10, 32)
	if err != nil {
		fmt.Fprintf(stderr, "rld settle: COST must be from 0 to 4294967295, got %q\n", fs.Arg(1))
		return exitError
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c := client.New(*socket)
	defer c.Close()
	res, err := c.Settle(ctx, fs.Arg(0), uint32(cost))
	return printResult("settle", res, err, *asJSON, stdout, stderr)
}
