package daemon

// AnswerOf exposes answerOf to the external tests.
var AnswerOf = answerOf

// FillResponse exposes fillResponse to the external tests.
var FillResponse = fillResponse
