package daemon

import (
	"github.com/rld/rld/decisions"
	"github.com/rld/rld/policy"
)

// AnswerOf exposes answerOf to the external tests.
var AnswerOf = answerOf

// FillResponse exposes fillResponse to the external tests.
var FillResponse = fillResponse

// ConfigPolls returns how many times the config file was polled.
func (d *Daemon) ConfigPolls() int64 { return d.configPolls.Load() }

// DecisionLogLines returns rld_decision_log_lines_total of kind.
func DecisionLogLines(kind string) uint64 { return decisions.LinesWritten(kind) }

// StoreAutoBlock stores ab as the automatic blocks' goroutine does.
func (d *Daemon) StoreAutoBlock(ab policy.AutoBlock) {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	d.storeAutoBlocksLocked([]policy.AutoBlock{ab})
}

// LivePeers returns the live daemons this daemon counted at its last
// heartbeat (0 without Redis).
func (d *Daemon) LivePeers() int {
	if d.fleet == nil {
		return 0
	}
	return d.fleet.Peers()
}
