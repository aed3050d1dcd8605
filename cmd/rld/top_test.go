package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/rld/rld/admin"
)

// TestPrintTopFleet: the fleet's top names the daemons heard from, with
// their report's age, and after each key the daemons that denied it.
func TestPrintTopFleet(t *testing.T) {
	var b strings.Builder
	printTop(&b, &admin.TopResult{
		Fleet: true,
		Daemons: []admin.DaemonSeen{
			{Daemon: "web1/1/aa", Self: true},
			{Daemon: "web2/2/bb", AgeMs: 1200},
		},
		Rules: []admin.RuleTop{{Rule: "search", Denied: 9, Keys: []admin.KeyCount{
			{Key: "api_key=k", Count: 9, By: []admin.DaemonCount{{Daemon: "web2/2/bb", Count: 6}, {Daemon: "web1/1/aa", Count: 3}}},
		}}},
	})
	assert.Equal(t, "denials of the fleet: 2 daemons heard from\n"+
		"  web1/1/aa (this daemon)\n"+
		"  web2/2/bb (report 1200ms old)\n"+
		"search: 9 denied\n"+
		"  9\t(±0)\tapi_key=k\t[web2/2/bb=6 web1/1/aa=3]\n", b.String())

	b.Reset()
	printTop(&b, &admin.TopResult{Warning: "this daemon's denials only: cannot read the fleet's from redis: timeout",
		Daemons: []admin.DaemonSeen{{Daemon: "web1/1/aa", Self: true}}})
	assert.Equal(t, "warning: this daemon's denials only: cannot read the fleet's from redis: timeout\n"+
		"denials of this daemon\n  web1/1/aa (this daemon)\nno denials yet\n", b.String())
}
