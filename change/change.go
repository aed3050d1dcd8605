// Package change holds the run-time changes that admin operations make
// to the limits in force — overrides and blocks — as plain data: policy
// compiles them, the daemon stores them, and the admin API answers with
// them. Override.Check and Block.Check are the one check of what in a
// change needs no rule to see. It depends on nothing of rld's.
package change

import "time"

// Override changes the limit of one rule for one counter key, or for the
// requests whose descriptors match globs. Precedence within a rule: a key
// override, then the first glob override that matches (in the order of
// the changes), then the tier or the rule's limit.
type Override struct {
	// ID names the override for delete.
	ID string `json:"id"`
	// Rule is the rule's name.
	Rule string `json:"rule"`
	// Key, for a key override: the value of each of the rule's by
	// descriptors, by name. Exactly one of Key and Match is set.
	Key map[string]string `json:"key,omitempty"`
	// Match, for a glob override: descriptor name → glob, with the
	// syntax of a rule's match; all must hold (as well as the rule's
	// own match).
	Match map[string]string `json:"match,omitempty"`
	// Limit, for an absolute override: the limit per Period (the rule's
	// period when Period is 0). Burst 0 keeps the rule's ratio of burst
	// to limit, if it has a burst.
	Limit int64 `json:"limit,omitempty"`
	// Period is stored as nanoseconds; the admin API writes it as a
	// duration's text.
	Period time.Duration `json:"period,omitempty"`
	Burst  int64         `json:"burst,omitempty"`
	// Multiplier, for a relative override: the limit and burst in force
	// (the tier's or the rule's) times Multiplier, rounded, at least 1.
	// Exactly one of Limit and Multiplier is set.
	Multiplier float64 `json:"multiplier,omitempty"`
	// Expires is when the override stops applying.
	Expires time.Time `json:"expires"`
	Reason  string    `json:"reason,omitempty"`
	Author  string    `json:"author,omitempty"`
	Created time.Time `json:"created"`
}

// Block refuses, with the status blocked as the deny list does, the
// requests whose descriptors match globs, or one counter key of one rule.
type Block struct {
	ID string `json:"id"`
	// Match: descriptor name → glob, all must hold. Or Rule and Key,
	// as in Override. Exactly one of Match and Rule is set.
	Match   map[string]string `json:"match,omitempty"`
	Rule    string            `json:"rule,omitempty"`
	Key     map[string]string `json:"key,omitempty"`
	Expires time.Time         `json:"expires"`
	Reason  string            `json:"reason,omitempty"`
	Author  string            `json:"author,omitempty"`
	Created time.Time         `json:"created"`
}
