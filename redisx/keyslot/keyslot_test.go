package keyslot

import (
	"math/rand/v2"
	"testing"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want uint16
	}{
		{"123456789", 0x31c3}, // the CRC-16/XMODEM check value
		{"", 0},
		{"foo", 12182},
		{"bar", 5061},
		{"{user1000}.following", Of("user1000")},
		{"{user1000}.followers", Of("user1000")},
		{"foo{}{bar}", crc16Bitwise("foo{}{bar}") % Count}, // an empty tag: the whole key
		{"foo{{bar}}zap", Of("{bar")},
		{"foo{bar}{zap}", Of("bar")},
		{"rl:{tenant-7}:tb", Of("tenant-7")},
		{"{", crc16Bitwise("{") % Count},
	} {
		if got := Of(tc.key); got != tc.want {
			t.Errorf("Of(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
}

// TestTableMatchesBitwise checks the table-driven CRC against the
// definition, bit by bit, on random keys without hash tags. (Slots are
// also checked against CLUSTER KEYSLOT of a real cluster in redisx and
// redistest.)
func TestTableMatchesBitwise(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		b := make([]byte, r.IntN(24))
		for i := range b {
			b[i] = byte(r.Uint32())
			if b[i] == '{' {
				b[i] = 'x'
			}
		}
		key := string(b)
		if got, want := Of(key), crc16Bitwise(key)%Count; got != want {
			t.Fatalf("Of(%q) = %d, bitwise CRC gives %d", key, got, want)
		}
	}
}

// crc16Bitwise is CRC-16/XMODEM computed from its definition.
func crc16Bitwise(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
