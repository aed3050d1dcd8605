//go:build race

package policy

// raceEnabled: the race detector makes sync.Pool drop items at random,
// so a regexp, which keeps its matching machines in one, allocates now
// and then under -race.
const raceEnabled = true
