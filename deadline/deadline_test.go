package deadline

import (
	"context"
	"errors"
	"testing"
	"time"
)

type key struct{}

func TestContext(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	defer cancel()
	dl := time.Now().Add(time.Hour)

	c := New(parent, dl)
	if d, ok := c.Deadline(); !ok || !d.Equal(dl) {
		t.Errorf("Deadline = %v %v, want %v", d, ok, dl)
	}
	if c.Err() != nil || c.Value(key{}) != "v" {
		t.Errorf("Err %v, Value %v", c.Err(), c.Value(key{}))
	}
	if c.armed.Load() {
		t.Error("Deadline, Err or Value armed a timer")
	}
	c.Stop()
	if !errors.Is(c.Err(), context.Canceled) {
		t.Errorf("after Stop: Err %v", c.Err())
	}
	select {
	case <-c.Done():
	default:
		t.Error("after Stop: Done not closed")
	}

	// The parent's earlier deadline wins.
	early, cancelEarly := context.WithDeadline(parent, time.Now().Add(time.Minute))
	defer cancelEarly()
	if d, _ := New(early, dl).Deadline(); !d.Before(dl) {
		t.Errorf("deadline %v, want the parent's", d)
	}

	// Past the deadline: Err without a timer, Done closes.
	past := New(parent, time.Now().Add(-time.Millisecond))
	if !errors.Is(past.Err(), context.DeadlineExceeded) {
		t.Errorf("past: Err %v", past.Err())
	}
	<-past.Done()
	if !errors.Is(past.Err(), context.DeadlineExceeded) {
		t.Errorf("past, armed: Err %v", past.Err())
	}
	past.Stop()

	// Done closes at the deadline.
	soon := Detached(parent, time.Now().Add(20*time.Millisecond))
	<-soon.Done()
	if !errors.Is(soon.Err(), context.DeadlineExceeded) {
		t.Errorf("soon: Err %v", soon.Err())
	}
	soon.Stop()
	soon.Stop()

	// The parent's cancellation: followed by New, not by Detached.
	follows, detached := New(parent, dl), Detached(parent, dl)
	armedBefore := Detached(parent, dl)
	done := armedBefore.Done()
	cancel()
	if !errors.Is(follows.Err(), context.Canceled) {
		t.Errorf("New after the parent's cancel: Err %v", follows.Err())
	}
	<-follows.Done()
	if detached.Err() != nil || armedBefore.Err() != nil {
		t.Errorf("Detached after the parent's cancel: Err %v, %v", detached.Err(), armedBefore.Err())
	}
	select {
	case <-done:
		t.Error("Detached: Done closed by the parent's cancel")
	case <-detached.Done():
		t.Error("Detached: Done closed by the parent's cancel")
	default:
	}
	for _, c := range []*Context{follows, detached, armedBefore} {
		c.Stop()
	}
	if !errors.Is(detached.Err(), context.Canceled) {
		t.Errorf("Detached after Stop: Err %v", detached.Err())
	}
}

// TestConcurrent: Done, Err and Stop from several goroutines (run with
// -race).
func TestConcurrent(t *testing.T) {
	for range 100 {
		c := New(context.Background(), time.Now().Add(time.Millisecond))
		ch := make(chan struct{})
		for range 3 {
			go func() { <-c.Done(); _ = c.Err(); ch <- struct{}{} }()
		}
		go c.Stop()
		for range 3 {
			<-ch
		}
	}
}

func BenchmarkDeadline(b *testing.B) {
	parent := context.Background()
	b.Run("context.WithDeadline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ctx, cancel := context.WithDeadline(parent, time.Now().Add(time.Second))
			_, _ = ctx.Deadline()
			cancel()
		}
	})
	b.Run("deadline.New", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c := New(parent, time.Now().Add(time.Second))
			_, _ = c.Deadline()
			c.Stop()
		}
	})
}
