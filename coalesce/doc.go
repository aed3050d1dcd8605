// Package coalesce batches concurrent checks of one key into one call: at
// most one call is in flight per key, and checks that arrive meanwhile join
// the next batch, each getting its own answer.
//
// The hot-path issue fills this package.
package coalesce
