package algo

// slidingLog decides for SlidingLog: the admissions in (now−P, now] plus
// cost must not exceed L. It is exact, and its state grows with the limit.
func slidingLog(p Params, s *State, now, cost int64, peek bool, r *Result) {
	per, limit := p.PeriodMicros(), p.Limit
	first := 0
	for first < len(s.Log) && s.Log[first].At <= now-per {
		first++
	}
	live := s.Log[first:]
	var sum int64
	for _, en := range live {
		sum += en.Cost
	}
	*r = Result{Limit: limit}
	var newest int64 // the newest live admission's time, if any
	if len(live) > 0 {
		newest = live[len(live)-1].At
	}
	switch {
	case cost > limit:
		r.RetryAfter = Never
	case sum+cost <= limit:
		sum += cost
		r.Allowed = true
		if len(live) == 0 || newest < now {
			newest = now
		}
		if !peek {
			s.Log = appendLog(s.Log[:copy(s.Log, live)], now, cost)
		}
	default:
		// Wait until the oldest entries whose costs free enough room
		// have left the window.
		need := sum + cost - limit
		for _, en := range live {
			if need -= en.Cost; need <= 0 {
				r.RetryAfter = micros(en.At + per - now)
				break
			}
		}
	}
	r.Remaining = max(limit-sum, 0)
	if sum > 0 {
		r.Reset = micros(newest + per - now)
	}
}

// appendLog records cost units at now. Admissions at the newest
// entry's microsecond (or before it, if the clock stepped back) join that
// microsecond's entry with no slot id (a Concurrency limit's acquired
// slots have entries of their own), which keeps the log sorted and short.
func appendLog(log []Entry, now, cost int64) []Entry {
	n := len(log)
	if n == 0 || log[n-1].At < now {
		return append(log, Entry{At: now, Cost: cost})
	}
	at, i := log[n-1].At, n-1
	for i > 0 && log[i-1].At == at {
		i--
	}
	if log[i].Slot == 0 {
		log[i].Cost += cost
		return log
	}
	log = append(log, Entry{})
	copy(log[i+1:], log[i:])
	log[i] = Entry{At: at, Cost: cost}
	return log
}

// refundSlidingLog takes cost units off the last entry at takenAt: the
// log's only one there, or the last slot of a Concurrency limit's.
func refundSlidingLog(s *State, takenAt, cost int64) {
	for i := len(s.Log) - 1; i >= 0 && s.Log[i].At >= takenAt; i-- {
		if s.Log[i].At != takenAt {
			continue
		}
		if s.Log[i].Cost -= cost; s.Log[i].Cost <= 0 {
			s.Log = append(s.Log[:i], s.Log[i+1:]...)
		}
		return
	}
}
