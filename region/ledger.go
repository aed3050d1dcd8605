package region

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

//go:embed renew.lua
var renewSource string

// renewSHA is the SHA1 of renewSource, as EVALSHA names it.
var renewSHA = func() string {
	h := sha1.Sum([]byte(renewSource))
	return hex.EncodeToString(h[:])
}()

// LedgerPrefix starts the key of every global key's ledger on the global
// store; the counter key follows in a hash tag, so that a ledger lives in
// one slot of a Cluster.
const LedgerPrefix = "rld:global:"

// LedgerKey returns the ledger's key of the global counter key key.
func LedgerKey(key string) string { return LedgerPrefix + "{" + key + "}" }

// Want is one key's renewal request.
type Want struct {
	// Key is the counter key.
	Key string
	// Demand is the units the region was asked for, per period of the
	// limit, over the last interval.
	Demand int64
	// Limit is the rule's limit L (the key's tier's).
	Limit int64
	// Fallback is the share f of a region that holds no lease.
	Fallback int64
	// Floor is the least share a busy region is targeted.
	Floor int64
}

// Grant is the global store's answer to one Want.
type Grant struct {
	// Share is the units of Limit the region may use until Expiry.
	Share int64
	// Expiry is the end of the lease on the caller's clock: the time the
	// call was sent plus the lease's length, never later than the global
	// store's own expiry.
	Expiry time.Time
	// Reclaimed is the units taken back from regions whose lease had
	// expired, by this renewal.
	Reclaimed int64
	// Target is the share the region was targeted before the cap by the
	// free units: above Share, the others held the difference.
	Target int64
	// Demand is the live regions' demand per period, this region's
	// included: above the limit, the regions contend for it.
	Demand int64
	// Stamp is the global store's time of the grant, in µs: of two
	// grants of one key to one region, the later stamp is the one the
	// ledger holds, whichever reply came first.
	Stamp int64
	// Err is this key's error; the other keys' grants stand.
	Err error
}

// Ledger renews a region's shares on the global store.
type Ledger struct {
	c       rueidis.Client
	region  string
	regions []string
	lease   time.Duration
}

// NewLedger returns the ledger of region, one of regions, with leases of
// length lease, on the global store c.
func NewLedger(c rueidis.Client, region string, regions []string, lease time.Duration) (*Ledger, error) {
	if c == nil {
		return nil, errors.New("region: ledger: nil global store client")
	}
	if err := checkRegions(region, regions); err != nil {
		return nil, fmt.Errorf("region: ledger: %w", err)
	}
	if lease < time.Millisecond {
		return nil, fmt.Errorf("region: ledger: lease %s shorter than 1ms", lease)
	}
	return &Ledger{c: c, region: region, regions: append([]string(nil), regions...), lease: lease}, nil
}

// checkRegions reports whether region is one of regions, which are
// distinct and non-empty.
func checkRegions(region string, regions []string) error {
	seen := make(map[string]bool, len(regions))
	for _, r := range regions {
		if r == "" {
			return errors.New("empty region name")
		}
		if seen[r] {
			return fmt.Errorf("region %q listed twice", r)
		}
		seen[r] = true
	}
	if !seen[region] {
		return fmt.Errorf("region %q is not one of the regions %q", region, regions)
	}
	return nil
}

// Renew renews every want in one pipelined round trip (two when the
// global store lost the script: the second sends it with EVAL) and returns one Grant per want, in
// order. It fails as a whole only when ctx is done before any answer.
func (l *Ledger) Renew(ctx context.Context, wants []Want) []Grant {
	sent := time.Now()
	cmds := make(rueidis.Commands, len(wants))
	for i := range wants {
		cmds[i] = l.command(&wants[i], true)
	}
	res := l.c.DoMulti(ctx, cmds...)
	var again []int
	for i, r := range res {
		if e, ok := rueidis.IsRedisErr(r.Error()); ok && e.IsNoScript() {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		// The global store lost the script (a restart): EVAL sends it
		// along, and caches it for the next EVALSHA, in one round trip.
		cmds = cmds[:0]
		for _, i := range again {
			cmds = append(cmds, l.command(&wants[i], false))
		}
		for j, r := range l.c.DoMulti(ctx, cmds...) {
			res[again[j]] = r
		}
	}
	grants := make([]Grant, len(wants))
	for i, r := range res {
		grants[i] = grant(r, sent)
		if grants[i].Err != nil {
			grants[i].Err = fmt.Errorf("region: renew %q: %w", wants[i].Key, grants[i].Err)
		}
	}
	return grants
}

// command is the EVALSHA of w, or its EVAL when sha is false.
func (l *Ledger) command(w *Want, sha bool) rueidis.Completed {
	ms := l.lease.Milliseconds()
	args := make([]string, 0, 7+len(l.regions))
	args = append(args, l.region, itoa(w.Demand), itoa(ms), itoa(w.Limit), itoa(w.Fallback), itoa(w.Floor), itoa(ledgerTTLLeases*ms))
	args = append(args, l.regions...)
	if !sha {
		return l.c.B().Eval().Script(renewSource).Numkeys(1).Key(LedgerKey(w.Key)).Arg(args...).Build()
	}
	return l.c.B().Evalsha().Sha1(renewSHA).Numkeys(1).Key(LedgerKey(w.Key)).Arg(args...).Build()
}

// ledgerTTLLeases is the TTL of a ledger, in leases: a key no region
// renews is forgotten after that long.
const ledgerTTLLeases = 4

// grant parses the script's reply.
func grant(r rueidis.RedisResult, sent time.Time) Grant {
	vals, err := r.AsIntSlice()
	if err != nil {
		return Grant{Err: err}
	}
	if len(vals) != 6 {
		return Grant{Err: fmt.Errorf("renew script replied %d values, want 6", len(vals))}
	}
	return Grant{Share: vals[0], Expiry: sent.Add(time.Duration(vals[1]) * time.Millisecond), Reclaimed: vals[2], Target: vals[3], Demand: vals[4], Stamp: vals[5]}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
