package envoyrls

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rld/rld/config"
)

// yamlConfig is one file of envoyproxy/ratelimit's configuration.
type yamlConfig struct {
	Domain      string     `yaml:"domain"`
	Descriptors []yamlNode `yaml:"descriptors"`
}

// yamlNode is one descriptor of the tree, with the line it starts on.
type yamlNode struct {
	Key            string     `yaml:"key"`
	Value          string     `yaml:"value"`
	RateLimit      *yamlLimit `yaml:"rate_limit"`
	Descriptors    []yamlNode `yaml:"descriptors"`
	ShadowMode     bool       `yaml:"shadow_mode"`
	QuotaMode      bool       `yaml:"quota_mode"`
	DetailedMetric bool       `yaml:"detailed_metric"`
	ValueToMetric  bool       `yaml:"value_to_metric"`
	ShareThreshold bool       `yaml:"share_threshold"`
	line           int
}

// yamlLimit is a descriptor's rate_limit.
type yamlLimit struct {
	Unit            string `yaml:"unit"`
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	Unlimited       bool   `yaml:"unlimited"`
	Name            string `yaml:"name"`
	Replaces        []struct {
		Name string `yaml:"name"`
	} `yaml:"replaces"`
}

// UnmarshalYAML decodes a node strictly, keeping its line.
func (n *yamlNode) UnmarshalYAML(v *yaml.Node) error {
	type plain yamlNode
	var p plain
	if err := decodeStrict(v, &p, "key", "value", "rate_limit", "descriptors", "shadow_mode",
		"quota_mode", "detailed_metric", "value_to_metric", "share_threshold"); err != nil {
		return err
	}
	*n = yamlNode(p)
	n.line = v.Line
	return nil
}

// UnmarshalYAML decodes a rate_limit strictly.
func (l *yamlLimit) UnmarshalYAML(v *yaml.Node) error {
	type plain yamlLimit
	var p plain
	if err := decodeStrict(v, &p, "unit", "requests_per_unit", "unlimited", "name", "replaces"); err != nil {
		return err
	}
	*l = yamlLimit(p)
	return nil
}

// decodeStrict decodes the mapping v into out, refusing a key that is not
// one of known, with its line. v is the parsed document's own node, so
// the nodes below it keep their lines too.
func decodeStrict(v *yaml.Node, out any, known ...string) error {
	if v.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: want a mapping", v.Line)
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		if k := v.Content[i]; !slices.Contains(known, k.Value) {
			return fmt.Errorf("line %d: unknown field %q (known: %s)", k.Line, k.Value, strings.Join(known, ", "))
		}
	}
	return v.Decode(out)
}

// periods are the units a fixed window can hold exactly.
var periods = map[string]time.Duration{
	"second": time.Second, "minute": time.Minute, "hour": time.Hour,
	"day": 24 * time.Hour, "week": 7 * 24 * time.Hour,
	// The peer's month and year are fixed too: 30 and 365 days.
	"month": 30 * 24 * time.Hour, "year": 365 * 24 * time.Hour,
}

// File is one ratelimit YAML configuration to import: its name (for
// messages) and content.
type File struct {
	Name string
	Data []byte
}

// Import converts envoyproxy/ratelimit YAML configurations (one domain
// each) into an rld.toml: an [envoy] table listening on 127.0.0.1:8081 and
// one fixed_window rule per descriptor with a rate_limit (docs/envoy.md
// gives the mapping). What rld cannot express is refused with the file
// and line; the result parses as an rld configuration.
func Import(files []File) ([]byte, error) {
	var w importer
	w.names = map[string]bool{}
	domains := map[string]string{}
	for _, f := range files {
		var c yamlConfig
		var root yaml.Node
		if err := yaml.Unmarshal(f.Data, &root); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		if len(root.Content) == 0 {
			return nil, fmt.Errorf("%s: empty file", f.Name)
		}
		if err := decodeStrict(root.Content[0], &c, "domain", "descriptors"); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		if c.Domain == "" {
			return nil, fmt.Errorf("%s: line %d: domain must not be empty", f.Name, root.Content[0].Line)
		}
		if prev, ok := domains[c.Domain]; ok {
			return nil, fmt.Errorf("%s: domain %q is already defined in %s", f.Name, c.Domain, prev)
		}
		domains[c.Domain] = f.Name
		w.file, w.domain = f.Name, c.Domain
		fmt.Fprintf(&w.rules, "\n# domain %q (%s)\n", c.Domain, f.Name)
		if err := w.level(c.Descriptors, nil); err != nil {
			return nil, err
		}
	}
	var out bytes.Buffer
	out.WriteString("# Imported from envoyproxy/ratelimit YAML by `rld config import-envoy`.\n")
	out.WriteString("# docs/envoy.md describes the mapping: the Envoy face adds the descriptors\n")
	out.WriteString("# domain and envoy_keys (the entry keys joined by \".\") to each descriptor's entries.\n\n")
	out.WriteString("[envoy]\nlisten = \"127.0.0.1:8081\"   # gRPC, envoy.service.ratelimit.v3\n")
	out.Write(w.rules.Bytes())
	if _, err := config.Parse(out.Bytes(), "import"); err != nil {
		return nil, fmt.Errorf("the imported configuration does not validate: %w", err)
	}
	return out.Bytes(), nil
}

// importer writes the rules of one domain's descriptor tree.
type importer struct {
	file, domain string
	rules        bytes.Buffer
	names        map[string]bool
}

// step is one level of a path in the tree.
type step struct {
	key, glob string
	label     string // the key, or key_value as the YAML gives it
	inKey     bool   // the value is part of the counter key
}

// level writes the rules of the sibling nodes ns below path.
func (w *importer) level(ns []yamlNode, path []step) error {
	seen := map[string]int{}
	for i := range ns {
		n := &ns[i]
		if n.Key == "" {
			return w.errf(n, "descriptor key must not be empty")
		}
		id := n.Key + "_" + n.Value
		if l, dup := seen[id]; dup {
			return w.errf(n, "duplicate descriptor %s=%q (first on line %d)", n.Key, n.Value, l)
		}
		seen[id] = n.line
		st, err := w.stepOf(ns, i)
		if err != nil {
			return err
		}
		st.label = n.Key
		if n.Value != "" {
			st.label += "_" + n.Value
		}
		p := append(slices.Clip(path), st)
		if err := w.node(n, p); err != nil {
			return err
		}
		if err := w.level(n.Descriptors, p); err != nil {
			return err
		}
	}
	return nil
}

// stepOf returns the match of node i among its siblings ns, as
// envoyproxy/ratelimit selects it: an exact key_value first, then the
// wildcard values (value ending in *) in order, then the key alone.
func (w *importer) stepOf(ns []yamlNode, i int) (step, error) {
	n := &ns[i]
	if strings.ContainsAny(n.Key, KeySep) || n.Key == DomainDescriptor || n.Key == KeysDescriptor {
		return step{}, w.errf(n, "key %q: rld cannot tell it apart (it contains %q or is a name the Envoy face sets)", n.Key, KeySep)
	}
	if len(n.Key) > config.MaxDescriptorName {
		return step{}, w.errf(n, "key %q is longer than %d bytes", n.Key, config.MaxDescriptorName)
	}
	var exact, prefixes []string
	for j := range ns {
		if ns[j].Key != n.Key || ns[j].Value == "" {
			continue
		}
		if pre, ok := strings.CutSuffix(ns[j].Value, "*"); ok {
			if j < i || n.Value == "" {
				prefixes = append(prefixes, pre)
			}
		} else {
			exact = append(exact, ns[j].Value)
		}
	}
	switch pre, wild := strings.CutSuffix(n.Value, "*"); {
	case n.Value == "":
		g, err := complement(exact, prefixes)
		if err != nil {
			return step{}, w.errf(n, "key %q: %v", n.Key, err)
		}
		return step{key: n.Key, glob: g, inKey: true}, nil
	case wild:
		// The prefix, and none of the values tried before it: those that
		// start with the prefix, by what follows it.
		var ex, px []string
		for _, v := range exact {
			if rest, ok := strings.CutPrefix(v, pre); ok {
				ex = append(ex, rest)
			}
		}
		for _, v := range prefixes {
			if rest, ok := strings.CutPrefix(v, pre); ok {
				px = append(px, rest)
			} else if strings.HasPrefix(pre, v) {
				return step{}, w.errf(n, "key %q: value %q is never reached: the wildcard %q before it takes every such value", n.Key, n.Value, v+"*")
			}
		}
		g := literalGlob(pre) + "*"
		if len(ex)+len(px) > 0 || g != pre+"*" {
			rest, err := complement(ex, px)
			if err != nil {
				return step{}, w.errf(n, "key %q: %v", n.Key, err)
			}
			if rest == "*" {
				rest = "~(?s:.*)"
			}
			g = "~" + regexp.QuoteMeta(pre) + strings.TrimPrefix(rest, "~")
		}
		return step{key: n.Key, glob: g, inKey: !n.ShareThreshold}, nil
	default:
		return step{key: n.Key, glob: literalGlob(n.Value)}, nil
	}
}

// literalGlob returns a glob matching exactly v.
func literalGlob(v string) string {
	if strings.ContainsAny(v, "*?") || strings.HasPrefix(v, config.RegexpPrefix) {
		return "~" + regexp.QuoteMeta(v)
	}
	return v
}

// node writes the rule of node n at path p, if it has a limit.
func (w *importer) node(n *yamlNode, p []step) error {
	if n.QuotaMode {
		return w.errf(n, "quota_mode has no rld equivalent")
	}
	rl := n.RateLimit
	if rl == nil {
		return nil
	}
	if len(rl.Replaces) > 0 {
		return w.errf(n, "replaces has no rld equivalent: every matching rld rule applies")
	}
	if rl.Unlimited {
		fmt.Fprintf(&w.rules, "# line %d: %s is unlimited: no rule\n", n.line, pathString(p))
		return nil
	}
	period, ok := periods[strings.ToLower(rl.Unit)]
	if !ok {
		return w.errf(n, "unit %q: want second, minute, hour, day, week, month or year", rl.Unit)
	}
	if rl.RequestsPerUnit == 0 {
		v := n.Value
		if v == "" {
			v = "*"
		}
		return w.errf(n, "requests_per_unit 0 (always over limit) has no rld rule equivalent; the deny list blocks an entry's value in every domain (deny = [\"%s=%s\"])", n.Key, v)
	}
	name := w.ruleName(rl.Name, p)
	keys := make([]string, len(p))
	for i, s := range p {
		keys[i] = s.key
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n# line %d\n[[rule]]\nname = %s\n", n.line, tomlString(name))
	fmt.Fprintf(&b, "match = { %s = %s, %s = %s", DomainDescriptor, tomlString(literalGlob(w.domain)), KeysDescriptor, tomlString(literalGlob(joinKeys(keys))))
	var by []string
	for _, s := range p {
		fmt.Fprintf(&b, ", %s = %s", tomlKey(s.key), tomlString(s.glob))
		if s.inKey {
			by = append(by, tomlString(s.key))
		}
	}
	if len(by) == 0 {
		// Every value is fixed by the match: one counter for the rule.
		by = append(by, tomlString(KeysDescriptor))
	}
	fmt.Fprintf(&b, " }\nby = [%s]\nalgorithm = \"fixed_window\"\nlimit = %d\nperiod = %q\n",
		strings.Join(by, ", "), rl.RequestsPerUnit, config.Duration(period).String())
	if n.ShadowMode {
		b.WriteString("shadow = true\n")
	}
	w.rules.WriteString(b.String())
	return nil
}

// ruleName returns a unique rule name: the limit's name when given, else
// the domain and the path, with characters rule names refuse as '_'.
func (w *importer) ruleName(given string, p []step) string {
	base := given
	if base == "" {
		parts := []string{w.domain}
		for _, s := range p {
			parts = append(parts, s.label)
		}
		base = strings.Join(parts, ".")
	}
	clean := []byte(base)
	for i, c := range clean {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == ':' || c == '-') {
			clean[i] = '_'
		}
	}
	name := string(clean)
	if len(name) > config.MaxRuleName-8 {
		name = name[:config.MaxRuleName-8]
	}
	for i := 2; w.names[name] || config.CheckRuleName(name) != nil; i++ {
		name = fmt.Sprintf("%s-%d", string(clean[:min(len(clean), config.MaxRuleName-8)]), i)
	}
	w.names[name] = true
	return name
}

func (w *importer) errf(n *yamlNode, format string, args ...any) error {
	return fmt.Errorf("%s: line %d: domain %q: %s", w.file, n.line, w.domain, fmt.Sprintf(format, args...))
}

func pathString(p []step) string {
	var s []string
	for _, x := range p {
		s = append(s, x.key+"="+x.glob)
	}
	return strings.Join(s, ", ")
}

// complement returns a glob matching every value that is none of exact
// and starts with none of prefixes: "*" when both are empty, else an RE2
// expression built from their trie. The values must be ASCII.
func complement(exact, prefixes []string) (string, error) {
	if len(exact)+len(prefixes) == 0 {
		return "*", nil
	}
	root := &trie{}
	for _, v := range exact {
		if err := root.add(v, false); err != nil {
			return "", err
		}
	}
	for _, v := range prefixes {
		if err := root.add(v, true); err != nil {
			return "", err
		}
	}
	alts := root.complement()
	if len(alts) == 0 {
		return "", errors.New("no value is left for the key alone: the other values cover them all")
	}
	g := "~(?s:" + strings.Join(alts, "|") + ")"
	if len(g) > config.MaxGlob {
		return "", fmt.Errorf("the values of the key's siblings need a %d-byte expression to exclude, over rld's %d", len(g), config.MaxGlob)
	}
	return g, nil
}

type trie struct {
	next   map[byte]*trie
	end    bool // a word ends here
	prefix bool // every string from here on is in the language
}

func (t *trie) add(v string, prefix bool) error {
	for i := 0; i < len(v); i++ {
		if v[i] >= 0x80 {
			return fmt.Errorf("value %q: only ASCII values can be excluded from the key alone", v)
		}
		if t.next == nil {
			t.next = map[byte]*trie{}
		}
		c := t.next[v[i]]
		if c == nil {
			c = &trie{}
			t.next[v[i]] = c
		}
		t = c
	}
	if prefix {
		t.prefix = true
	} else {
		t.end = true
	}
	return nil
}

// complement returns the alternatives of an expression matching every
// continuation from t that the language does not hold.
func (t *trie) complement() []string {
	if t.prefix {
		return nil
	}
	var alts []string
	if !t.end {
		alts = append(alts, "")
	}
	if len(t.next) == 0 {
		return append(alts, ".+")
	}
	cs := make([]byte, 0, len(t.next))
	for c := range t.next {
		cs = append(cs, c)
	}
	slices.Sort(cs)
	var class strings.Builder
	for _, c := range cs {
		class.WriteString(reByte(c))
	}
	alts = append(alts, "[^"+class.String()+"].*")
	for _, c := range cs {
		if sub := t.next[c].complement(); len(sub) > 0 {
			alts = append(alts, reByte(c)+"(?:"+strings.Join(sub, "|")+")")
		}
	}
	return alts
}

// reByte writes c for a regular expression, in a class or out: itself
// when a letter or digit, else escaped as \xHH.
func reByte(c byte) string {
	if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
		return string(c)
	}
	return fmt.Sprintf(`\x%02x`, c)
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// tomlKey returns k as a TOML key: bare when it can be.
func tomlKey(k string) string {
	for _, c := range k {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return tomlString(k)
		}
	}
	return k
}

// ReadFiles reads the named files for Import.
func ReadFiles(names []string) ([]File, error) {
	fs := make([]File, 0, len(names))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("cannot read %w", err)
		}
		fs = append(fs, File{Name: n, Data: b})
	}
	return fs, nil
}
