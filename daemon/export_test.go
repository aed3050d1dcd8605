package daemon

// AnswerOf exposes answerOf to the external tests.
var AnswerOf = answerOf

// FillResponse exposes fillResponse to the external tests.
var FillResponse = fillResponse

// ConfigPolls returns how many times the config file was polled.
func (d *Daemon) ConfigPolls() int64 { return d.configPolls.Load() }
