package daemon

// AnswerOf exposes answerOf to the external tests.
var AnswerOf = answerOf
