package change

import (
	"errors"
	"fmt"
	"math"
)

// Limits of a change's text, so that every entry fits in a page of the
// admin op list with room to spare.
const (
	// MaxReason bounds a change's Reason, in bytes.
	MaxReason = 512
	// MaxAuthor bounds a change's Author, in bytes.
	MaxAuthor = 128
	// MaxPairsBytes bounds the names and values of a key, or of match
	// globs, together.
	MaxPairsBytes = 2048
)

// Check reports what is wrong with o that needs no rule to see: its text
// too long, both or neither of Limit and Multiplier, a negative or
// non-finite number, a period or burst with a multiplier. policy's
// Policy.ValidateOverride calls it before it holds o to its rule; the
// admin API calls it to refuse a bad request before it reaches the
// daemon.
func (o *Override) Check() error {
	if err := checkText(o.Key, o.Match, o.Reason, o.Author); err != nil {
		return err
	}
	switch {
	case o.Limit != 0 && o.Multiplier != 0:
		return errors.New("give a limit or a multiplier, not both")
	case o.Limit == 0 && o.Multiplier == 0:
		return errors.New("give a limit (absolute) or a multiplier (relative)")
	case o.Limit < 0:
		return fmt.Errorf("limit = %d: must be positive", o.Limit)
	case o.Multiplier < 0 || math.IsNaN(o.Multiplier) || math.IsInf(o.Multiplier, 0):
		return fmt.Errorf("multiplier = %v: must be positive", o.Multiplier)
	case o.Multiplier != 0 && (o.Period != 0 || o.Burst != 0):
		return errors.New("a multiplier scales limit and burst: period and burst go with an absolute limit")
	case o.Period < 0 || o.Burst < 0:
		return errors.New("period and burst must not be negative")
	}
	return nil
}

// Check reports what is wrong with b that needs no rule to see: its text
// too long, neither match globs nor a rule, a key without its rule, a
// rule's block with globs or without its key. It is called as
// Override.Check is.
func (b *Block) Check() error {
	if err := checkText(b.Key, b.Match, b.Reason, b.Author); err != nil {
		return err
	}
	switch {
	case b.Rule == "" && len(b.Match) == 0:
		return errors.New("give match globs, or a rule and its key")
	case b.Rule == "" && len(b.Key) > 0:
		return errors.New("a key needs its rule")
	case b.Rule != "" && (len(b.Match) > 0 || len(b.Key) == 0):
		return errors.New("a rule's block takes its key (each by descriptor's value), not globs")
	}
	return nil
}

// checkText checks the sizes of a change's key, match globs, reason and
// author.
func checkText(key, match map[string]string, reason, author string) error {
	for _, p := range []struct {
		what  string
		pairs map[string]string
	}{{"key", key}, {"match", match}} {
		n := 0
		for k, v := range p.pairs {
			n += len(k) + len(v)
		}
		if n > MaxPairsBytes {
			return fmt.Errorf("%s: %d bytes of names and values, at most %d", p.what, n, MaxPairsBytes)
		}
	}
	switch {
	case len(reason) > MaxReason:
		return fmt.Errorf("reason: %d bytes, at most %d", len(reason), MaxReason)
	case len(author) > MaxAuthor:
		return fmt.Errorf("author: %d bytes, at most %d", len(author), MaxAuthor)
	}
	return nil
}
