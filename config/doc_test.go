package config_test

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/breaker"
	"github.com/rld/rld/config"
	"github.com/rld/rld/derive"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/redisx"
	"github.com/rld/rld/shardcache"
)

// engineDefaults are the defaults of the keys that an engine reads: config
// leaves them zero (Default) and the engine's constructor fills them in,
// so configuration.md states the engine's. Only this test imports the
// engines (an external test: derive imports config), to hold the
// documentation to them.
var engineDefaults = map[string]any{
	"store.max_keys":             memstore.DefaultMaxKeys,
	"store.sweep_interval":       config.Duration(memstore.DefaultSweepInterval),
	"store.timeout":              config.Duration(redisx.DefaultTimeout),
	"store.sync_interval":        config.Duration(shardcache.DefaultSyncInterval),
	"store.breaker_failure_rate": breaker.DefaultFailureRate,
	"store.breaker_min_calls":    breaker.DefaultMinCalls,
	"store.breaker_failures":     breaker.DefaultFailures,
	"store.breaker_window":       config.Duration(breaker.DefaultWindow),
	"store.breaker_cooldown":     config.Duration(breaker.DefaultCooldown),
	"request.client_ip_header":   derive.DefaultIPHeader,
	"request.ipv4_prefix":        derive.DefaultIPv4Prefix,
	"request.ipv6_prefix":        derive.DefaultIPv6Prefix,
}

// docTables reads the key tables of docs/configuration.md: section ("",
// "server", "store", "admin", "log", "rule") → key → the row's default
// and meaning cells.
func docTables(t *testing.T) map[string]map[string][2]string {
	t.Helper()
	b, err := os.ReadFile("../docs/configuration.md")
	require.NoError(t, err)
	heading := regexp.MustCompile(`^## (?:Top level|\[\[?([a-z.]+)\]\]?)`)
	row := regexp.MustCompile("^\\| `([a-z0-9_]+)` \\| (.*?) \\| (.*) \\|$")
	tables := map[string]map[string][2]string{}
	section := "-" // not a key table
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "## ") {
			section = "-"
			if m := heading.FindStringSubmatch(line); m != nil {
				section = m[1]
			}
			continue
		}
		if m := row.FindStringSubmatch(line); m != nil && section != "-" {
			if tables[section] == nil {
				tables[section] = map[string][2]string{}
			}
			_, dup := tables[section][m[1]]
			assert.False(t, dup, "configuration.md documents %s.%s twice", section, m[1])
			tables[section][m[1]] = [2]string{m[2], m[3]}
		}
	}
	return tables
}

// tomlKeys returns the toml keys of struct type typ, each with its field.
func tomlKeys(typ reflect.Type) map[string]reflect.StructField {
	keys := map[string]reflect.StructField{}
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			// An embedded struct's keys are the table's own (as the TOML
			// decoder takes them), at the index path through it.
			for k, inner := range tomlKeys(f.Type) {
				inner.Index = append([]int{i}, inner.Index...)
				keys[k] = inner
			}
			continue
		}
		if tag, ok := f.Tag.Lookup("toml"); ok && tag != "-" {
			keys[strings.Split(tag, ",")[0]] = f
		}
	}
	return keys
}

// docDefault renders v as the default column of configuration.md writes
// it: `"text"`, `"30s"`, `100`, `0.01`, `[0]`, `[]`.
func docDefault(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case config.Duration:
		return strconv.Quote(x.String())
	case config.RedisMode:
		return strconv.Quote(string(x))
	case string:
		return strconv.Quote(x)
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	switch v.Kind() {
	case reflect.Map:
		return "{}"
	case reflect.Int, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10)
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = docDefault(v.Index(i))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return fmt.Sprintf("%v", v.Interface())
}

// TestConfigurationDocumented: every key the config accepts — the toml
// tags of Config and of its tables, which are all it accepts — has its
// row in docs/configuration.md, under its table's section, with the
// default that Default() gives it, or for a key an engine reads (Default
// leaves it zero), the engine's default; every row names a key that exists;
// and the inline tables of a rule (penalty, block_after) name each of
// their keys and bounds in their row.
func TestConfigurationDocumented(t *testing.T) {
	docs := docTables(t)
	def := reflect.ValueOf(config.Default()).Elem()
	seen := map[string]bool{}
	check := func(section string, typ reflect.Type, defaults reflect.Value) {
		seen[section] = true
		rows := docs[section]
		for key, f := range tomlKeys(typ) {
			ft := f.Type
			if section == "" && (ft.Kind() == reflect.Struct || ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct) {
				continue // a table: its own section
			}
			if section != "" && ft.Kind() == reflect.Struct && ft != reflect.TypeOf(config.Duration(0)) && ft != reflect.TypeOf(config.Jitter{}) {
				continue // a sub-table ([request.jwt]): checked as its own section below
			}
			cells, ok := rows[key]
			if !assert.True(t, ok, "docs/configuration.md documents %s (section %q, a row | `%s` | default | meaning |)", joinKey(section, key), section, key) {
				continue
			}
			assert.NotEmpty(t, strings.TrimSpace(cells[0]), "%s: a default", joinKey(section, key))
			if defaults.IsValid() {
				v := defaults.FieldByIndex(f.Index)
				if ev, ok := engineDefaults[joinKey(section, key)]; ok {
					assert.True(t, v.IsZero(), "%s: an engine's setting, which config.Default() leaves zero, has %v", joinKey(section, key), v)
					v = reflect.ValueOf(ev)
				}
				want := "`" + docDefault(v) + "`"
				assert.True(t, strings.HasPrefix(cells[0], want),
					"%s: configuration.md gives the default %s, config.Default() has %s", joinKey(section, key), cells[0], want)
			}
			if ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct {
				for sub := range tomlKeys(ft.Elem()) {
					assert.Contains(t, cells[1], sub+" =", "%s: the row names its key %s", joinKey(section, key), sub)
					assert.Contains(t, cells[1], "`"+sub+"`", "%s: the row gives the bounds of %s", joinKey(section, key), sub)
				}
			}
		}
		for key := range rows {
			_, ok := tomlKeys(typ)[key]
			assert.True(t, ok, "docs/configuration.md documents %s, which the config does not accept", joinKey(section, key))
		}
	}
	check("", reflect.TypeOf(config.Config{}), def)
	for key, f := range tomlKeys(reflect.TypeOf(config.Config{})) {
		switch {
		case f.Type.Kind() == reflect.Struct:
			check(key, f.Type, def.FieldByIndex(f.Index))
			for sub, sf := range tomlKeys(f.Type) {
				if sf.Type.Kind() == reflect.Struct && sf.Type != reflect.TypeOf(config.Duration(0)) && sf.Type != reflect.TypeOf(config.Jitter{}) {
					check(key+"."+sub, sf.Type, def.FieldByIndex(f.Index).FieldByIndex(sf.Index))
				}
			}
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			check(key, f.Type.Elem(), reflect.Value{}) // [[rule]]: defaults depend on the rule
		}
	}
	for section := range docs {
		assert.True(t, seen[section], "docs/configuration.md has a key table for [%s], which the config does not have", section)
	}
	require.Contains(t, docs, "rule")
	require.Contains(t, docs, "store")
}

func joinKey(section, key string) string {
	if section == "" {
		return key
	}
	return section + "." + key
}

// TestShippedConfigKeys: every key the shipped rld.toml sets or shows in
// a comment (`# key = value`, under `[table]` or `# [table]`) is one the
// config accepts in that table, so that uncommenting a line never gives
// an unknown key.
func TestShippedConfigKeys(t *testing.T) {
	b, err := os.ReadFile("../rld.toml")
	require.NoError(t, err)
	tables := map[string]map[string]reflect.StructField{"": tomlKeys(reflect.TypeOf(config.Config{}))}
	free := map[string]bool{} // tables of names the user chooses ([request.descriptors])
	for key, f := range tomlKeys(reflect.TypeOf(config.Config{})) {
		switch {
		case f.Type.Kind() == reflect.Struct:
			tables[key] = tomlKeys(f.Type)
			for sub, sf := range tomlKeys(f.Type) {
				switch sf.Type.Kind() {
				case reflect.Struct:
					tables[key+"."+sub] = tomlKeys(sf.Type)
				case reflect.Map:
					tables[key+"."+sub], free[key+"."+sub] = nil, true
				}
			}
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			tables[key] = tomlKeys(f.Type.Elem())
		}
	}
	header := regexp.MustCompile(`^(?:# ?)?\[\[?([a-z.]+)\]\]?\s*(?:#.*)?$`)
	setting := regexp.MustCompile(`^(?:# ?)?([a-z0-9_]+) = \S`)
	table, n := "", 0
	for i, line := range strings.Split(string(b), "\n") {
		if m := header.FindStringSubmatch(line); m != nil {
			table = m[1]
			require.Contains(t, tables, table, "rld.toml:%d: no table [%s]", i+1, table)
			continue
		}
		if m := setting.FindStringSubmatch(line); m != nil {
			_, ok := tables[table][m[1]]
			ok = ok || free[table]
			assert.True(t, ok, "rld.toml:%d: %q: the config has no key %s", i+1, line, joinKey(table, m[1]))
			n++
		}
	}
	assert.Greater(t, n, 40, "rld.toml's settings were read")
}
