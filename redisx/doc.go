// Package redisx is rld's Redis client (standalone, Sentinel, Cluster): it
// loads the scripts of package lua, runs them with EVALSHA, and guards Redis
// with a circuit breaker.
//
// The Redis issue fills this package.
package redisx
