package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// doTimeout bounds one Do call; pollTimeout bounds one call made by a
// readiness poll, which simply tries again.
const (
	doTimeout   = 5 * time.Second
	pollTimeout = 2 * time.Second
)

// Do sends one command to addr and returns the reply as text: simple and
// bulk strings as they are, integers in decimal, arrays one element a
// line. Each call uses a new connection, so connection state (WAIT, which
// waits for the connection's own writes, READONLY, SELECT, MULTI) does not
// carry over from one call to the next. It is for test set-up and
// inspection, not for the code under test.
func Do(addr string, args ...string) (string, error) {
	v, err := call(addr, doTimeout, args...)
	if err != nil {
		return "", err
	}
	return text(v), nil
}

// call sends one command to addr on a new connection and returns the reply
// decoded: string for simple and bulk strings, int64 for integers, nil for
// a null, []any for arrays. An error reply is returned as an error.
func call(addr string, timeout time.Duration, args ...string) (any, error) {
	vs, err := pipeline(addr, timeout, args)
	if err != nil {
		return nil, err
	}
	return vs[0], nil
}

// pipeline sends cmds to addr on one new connection and returns their
// decoded replies, or the first error.
func pipeline(addr string, timeout time.Duration, cmds ...[]string) ([]any, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	var b strings.Builder
	for _, args := range cmds {
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	vs := make([]any, len(cmds))
	for i := range vs {
		if vs[i], err = readValue(r); err != nil {
			return nil, err
		}
	}
	return vs, nil
}

// readValue decodes one RESP2 value.
func readValue(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, fmt.Errorf("redistest: empty reply line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, fmt.Errorf("redis: %s", line[1:])
	case ':':
		n, err := strconv.ParseInt(line[1:], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("redistest: bad integer reply %q", line)
		}
		return n, nil
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, fmt.Errorf("redistest: bad bulk length %q", line)
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, fmt.Errorf("redistest: bad array length %q", line)
		}
		if n < 0 {
			return nil, nil
		}
		vs := make([]any, 0, n)
		for range n {
			v, err := readValue(r)
			if err != nil {
				return nil, err
			}
			vs = append(vs, v)
		}
		return vs, nil
	}
	return nil, fmt.Errorf("redistest: unexpected reply %q", line)
}

// text renders a decoded reply the way Do returns it.
func text(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = text(e)
		}
		return strings.Join(parts, "\n")
	}
	return ""
}

// fields decodes a flat field/value array (CLUSTER SHARDS entries,
// SENTINEL MASTER) into a map.
func fields(v any) (map[string]any, error) {
	a, ok := v.([]any)
	if !ok || len(a)%2 != 0 {
		return nil, fmt.Errorf("redistest: want a field/value array, got %T of %v", v, v)
	}
	m := make(map[string]any, len(a)/2)
	for i := 0; i < len(a); i += 2 {
		k, ok := a[i].(string)
		if !ok {
			return nil, fmt.Errorf("redistest: field name %v is not a string", a[i])
		}
		m[k] = a[i+1]
	}
	return m, nil
}

// integer reads an integer reply element, which some commands send as a
// string.
func integer(v any) (int, error) {
	switch v := v.(type) {
	case int64:
		return int(v), nil
	case string:
		return strconv.Atoi(v)
	}
	return 0, fmt.Errorf("redistest: want an integer, got %T of %v", v, v)
}

// infoField returns the value of key in an INFO or CLUSTER INFO reply, or
// "" when it is missing.
func infoField(info, key string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), key+":"); ok {
			return v
		}
	}
	return ""
}

// slowlogLen is how many commands RecordCommands keeps: more than any
// test here sends while it counts.
const slowlogLen = 200_000

// RecordCommands makes the server at addr keep every command it runs
// from now on in its SLOWLOG (a threshold of 0 µs), emptied first, so
// that ScriptCallsOn can count script calls by key.
func RecordCommands(addr string) error {
	for _, cmd := range [][]string{
		{"CONFIG", "SET", "slowlog-log-slower-than", "0"},
		{"CONFIG", "SET", "slowlog-max-len", strconv.Itoa(slowlogLen)},
		{"SLOWLOG", "RESET"},
	} {
		if _, err := call(addr, doTimeout, cmd...); err != nil {
			return fmt.Errorf("redistest: %s: %w", strings.Join(cmd, " "), err)
		}
	}
	return nil
}

// ScriptCallsOn returns how many EVAL and EVALSHA calls the server at
// addr ran since RecordCommands with a key that contains part. Unlike
// INFO commandstats it leaves out the calls that name other keys, such
// as a daemon's heartbeat.
func ScriptCallsOn(addr, part string) (int, error) {
	v, err := call(addr, doTimeout, "SLOWLOG", "GET", strconv.Itoa(slowlogLen))
	if err != nil {
		return 0, err
	}
	entries, ok := v.([]any)
	if !ok {
		return 0, fmt.Errorf("redistest: SLOWLOG GET answered %T", v)
	}
	if len(entries) >= slowlogLen {
		return 0, fmt.Errorf("redistest: the SLOWLOG filled up (%d commands): the count would be short", len(entries))
	}
	n := 0
	for _, e := range entries {
		fields, _ := e.([]any)
		if len(fields) < 4 {
			return 0, fmt.Errorf("redistest: a SLOWLOG entry of %d fields", len(fields))
		}
		args, _ := fields[3].([]any)
		if scriptCallOn(args, part) {
			n++
		}
	}
	return n, nil
}

// scriptCallOn reports whether args, a command as SLOWLOG gives it, is
// EVAL or EVALSHA with a key that contains part.
func scriptCallOn(args []any, part string) bool {
	if len(args) < 3 {
		return false
	}
	if name, _ := args[0].(string); !strings.EqualFold(name, "evalsha") && !strings.EqualFold(name, "eval") {
		return false
	}
	numKeys, _ := args[2].(string)
	n, err := strconv.Atoi(numKeys)
	if err != nil {
		return false
	}
	for i := 3; i < 3+n && i < len(args); i++ {
		if key, _ := args[i].(string); strings.Contains(key, part) {
			return true
		}
	}
	return false
}
