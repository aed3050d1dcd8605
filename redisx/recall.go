package redisx

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/rld/rld/algo"
)

// recallChannel ends the name of the pub/sub channel of lease recalls,
// after the key prefix.
const recallChannel = "recall"

// Recalls is the fleet's channel of lease recalls: a daemon that Redis
// refuses while other daemons hold unused lease units of the key asks
// them, here, to give that key's lease back at once; a daemon that
// resets a key tells the others to drop what they know of it; a daemon
// that gave units of a key back (a settle's refund) tells the others to
// drop their denial and view of it (Recall.Refunded). Safe for
// concurrent use.
type Recalls struct {
	c       *Client
	channel string
}

// NewRecalls returns the Recalls on c, under c's key prefix.
func NewRecalls(c *Client) *Recalls {
	return &Recalls{c: c, channel: c.o.KeyPrefix + recallChannel}
}

// Recall is one message of the channel.
type Recall struct {
	// Kind and Key name the counter: its algorithm and counter key.
	Kind algo.Kind
	Key  []byte
	// From is the holder id of the daemon that sent it.
	From string
	// Refunded: the key's counter was given units back, which the
	// receivers' denials and views of it do not know of; their leases
	// stay theirs. Otherwise the key's leases are recalled.
	Refunded bool
}

// refundedMark starts the kind of a message of Recall.Refunded: a
// daemon that does not know it skips the message as one it cannot
// parse, rather than taking it for a recall.
const refundedMark = 'r'

// appendRecall appends r's message to dst: the kind (after refundedMark
// when r is Refunded), a space, From (no space in it), a space, the
// key's bytes.
func appendRecall(dst []byte, r Recall) []byte {
	if r.Refunded {
		dst = append(dst, refundedMark)
	}
	dst = strconv.AppendUint(dst, uint64(r.Kind), 10)
	dst = append(dst, ' ')
	dst = append(dst, r.From...)
	dst = append(dst, ' ')
	return append(dst, r.Key...)
}

// parseRecall parses a message that appendRecall wrote.
func parseRecall(msg string) (Recall, error) {
	k, rest, ok1 := strings.Cut(msg, " ")
	from, key, ok2 := strings.Cut(rest, " ")
	refunded := strings.HasPrefix(k, string(refundedMark))
	if refunded {
		k = k[1:]
	}
	kind, err := strconv.ParseUint(k, 10, 8)
	// Only the leases of an algorithm the cache leases are recalled.
	if !ok1 || !ok2 || err != nil || kind >= uint64(algo.NumKinds) || algo.Kind(kind).Info().Leases == algo.LeaseNone || key == "" {
		return Recall{}, fmt.Errorf("redisx: recalls: bad message %q", msg)
	}
	return Recall{Kind: algo.Kind(kind), Key: []byte(key), From: from, Refunded: refunded}, nil
}

// Publish announces r on the channel, as one call (through the circuit
// breaker of the node of the key r names, within the Client's Timeout or
// ctx's deadline when sooner). It returns how many subscribers got it.
func (s *Recalls) Publish(ctx context.Context, r Recall) (int64, error) {
	if strings.Contains(r.From, " ") {
		return 0, fmt.Errorf("redisx: recalls: holder id %q has a space", r.From)
	}
	msg := string(appendRecall(nil, r))
	rkey := string(AppendKey(nil, s.c.o.KeyPrefix, r.Key, r.Kind))
	var n int64
	b, node := s.c.g.route(rkey)
	err := s.c.call(ctx, b, node, false, func(ctx context.Context, rc rueidis.Client) error {
		var err error
		n, err = rc.Do(ctx, rc.B().Publish().Channel(s.channel).Message(msg).Build()).AsInt64()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("redisx: recalls: publish: %w", err)
	}
	return n, nil
}

// Subscribe listens on the channel and calls recalled with each message,
// and subscribed once the subscription is confirmed; messages it cannot
// parse are skipped. It returns when ctx is done (nil) or the
// subscription fails or is lost (its error): the caller subscribes
// again. A recall missed meanwhile costs a refused check at most one
// sync interval, when the holder's sync returns its idle lease.
func (s *Recalls) Subscribe(ctx context.Context, subscribed func(), recalled func(Recall)) error {
	return s.c.subscribe(ctx, s.channel, "recalls", subscribed, func(msg string) {
		if r, err := parseRecall(msg); err == nil {
			recalled(r)
		}
	})
}
