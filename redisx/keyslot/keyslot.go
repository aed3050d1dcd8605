// Package keyslot computes Redis Cluster hash slots. It is a leaf, so that
// both the Redis client (redisx) and the test harness that starts
// clusters (redistest) can share one implementation.
package keyslot

import "strings"

// Count is the number of Redis Cluster hash slots.
const Count = 16384

// Of returns the Cluster hash slot of key, as Redis computes it: the
// CRC16 (XMODEM) of the key modulo 16384, where a key with a non-empty
// hash tag (the part between its first '{' and the next '}') hashes only
// the tag.
func Of(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return crc % Count
}

// crc16Table is the byte-wise table of CRC-16/XMODEM (polynomial 0x1021,
// initial value 0).
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
