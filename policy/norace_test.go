//go:build !race

package policy

// raceEnabled: see race_test.go.
const raceEnabled = false
