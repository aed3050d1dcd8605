package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rld/rld/wire"
)

func TestTemplateExpand(t *testing.T) {
	tm, err := parseTemplate("api_key=k{n} endpoint=/v1/search tenant={n}-{n}x", 99999)
	if err != nil {
		t.Fatal(err)
	}
	var scratch []byte
	var descs []wire.Descriptor
	for _, n := range []int{0, 42, 99999} {
		scratch, descs = tm.expand(n, scratch, descs)
		var got []string
		for _, d := range descs {
			got = append(got, string(d.Name)+"="+string(d.Value))
		}
		want := fmt.Sprintf("api_key=k%d endpoint=/v1/search tenant=%d-%dx", n, n, n)
		if g := strings.Join(got, " "); g != want {
			t.Errorf("key %d: %q, want %q", n, g, want)
		}
		if k := string(tm.appendKey(nil, n)); k != fmt.Sprintf("k%d|/v1/search|%d-%dx", n, n, n) {
			t.Errorf("key %d: counter key %q", n, k)
		}
	}
	if s := tm.String(); s != "api_key=k{n} endpoint=/v1/search tenant={n}-{n}x" {
		t.Errorf("String() = %q", s)
	}
	if a := testing.AllocsPerRun(1000, func() { scratch, descs = tm.expand(12345, scratch, descs) }); a != 0 {
		t.Errorf("expand: %v allocations", a)
	}
}

func TestTemplateNames(t *testing.T) {
	tm, err := parseTemplate("  a=1   b={n}\ta=2 ", 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(tm.names(), ","); got != "a,b" {
		t.Errorf("names() = %s, want a,b", got)
	}
}

func TestTemplateErrors(t *testing.T) {
	for _, s := range []string{
		"api_key",                                // no =
		"=v",                                     // empty name
		"k{n}=v",                                 // {n} in a name
		strings.Repeat("x", 65) + "=v",           // name too long
		"a=" + strings.Repeat("v", 1025),         // value too long
		"a=" + strings.Repeat("v", 1020) + "{n}", // too long once expanded
		strings.Repeat("a=b ", wire.MaxDescriptors+1),
	} {
		if _, err := parseTemplate(s, 999999); err == nil {
			t.Errorf("parseTemplate(%.40q…): no error", s)
		}
	}
}
