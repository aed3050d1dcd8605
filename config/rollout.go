package config

import (
	"errors"
	"fmt"
	"strings"
)

// FullShare is the enforce share of a rule that enforces every key: 100%
// in basis points.
const FullShare = 10_000

// ParseShare parses an enforce share, "0%" to "100%" with at most two
// decimals ("12.5%", "0.01%"), into basis points: 0 to FullShare. The
// empty string is "100%".
func ParseShare(s string) (int, error) {
	if s == "" {
		return FullShare, nil
	}
	num, ok := strings.CutSuffix(s, "%")
	if !ok {
		return 0, errors.New(`want a percentage such as "25%" or "12.5%"`)
	}
	whole, frac, dot := strings.Cut(num, ".")
	if whole == "" || len(whole) > 3 || !digits(whole) || dot && (frac == "" || !digits(frac)) {
		return 0, errors.New(`want a percentage such as "25%" or "12.5%"`)
	}
	if len(frac) > 2 {
		return 0, errors.New("at most two decimals: the share is kept in steps of 0.01%")
	}
	bp := 0
	for _, c := range whole {
		bp = bp*10 + int(c-'0')
	}
	bp *= 100
	for i, c := range frac {
		bp += int(c-'0') * []int{10, 1}[i]
	}
	if bp > FullShare {
		return 0, errors.New("more than 100%")
	}
	return bp, nil
}

func digits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// EnforceShare returns the rule's enforce share in basis points (see
// Enforce and ParseShare). It is valid once the Config has been parsed.
func (r *Rule) EnforceShare() int {
	bp, err := ParseShare(r.Enforce)
	if err != nil {
		return FullShare
	}
	return bp
}

// validateEnforce checks the rule's enforce share.
func (r *Rule) validateEnforce(p *problems, at string) {
	bp, err := ParseShare(r.Enforce)
	if err != nil {
		p.add("%s: enforce = %q: %v", at, r.Enforce, err)
		return
	}
	if r.Shadow && bp != FullShare {
		p.add("%s: enforce = %q: a shadow rule enforces no key; set shadow = false to roll it out", at, r.Enforce)
	}
}

// FormatShare formats an enforce share in basis points as a percentage,
// as ParseShare reads it: 2500 is "25%", 1250 "12.5%".
func FormatShare(bp int) string {
	s := fmt.Sprintf("%d.%02d", bp/100, bp%100)
	s = strings.TrimSuffix(strings.TrimSuffix(s, "0"), ".0")
	return strings.TrimSuffix(s, ".") + "%"
}
