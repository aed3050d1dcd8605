// Package lua holds the Redis scripts of rld's algorithms, embedded with
// go:embed; each computes exactly what package algo computes.
//
// The Redis issue fills this package.
package lua
