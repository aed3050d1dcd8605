package config

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// RegexpPrefix starts a glob that is a regular expression.
const RegexpPrefix = "~"

// CompileRegexp compiles a glob that starts with RegexpPrefix: the rest is
// an RE2 regular expression (Go's regexp syntax) that must match the
// whole value, so it is compiled as ^(?:re)$. It reports false, and
// compiles nothing, for any other glob.
func CompileRegexp(glob string) (*regexp.Regexp, bool, error) {
	src, ok := strings.CutPrefix(glob, RegexpPrefix)
	if !ok {
		return nil, false, nil
	}
	if src == "" {
		return nil, true, errors.New(`empty regular expression after "~"`)
	}
	// Compiled alone first: a source whose parentheses do not balance,
	// such as "a)|(b", would otherwise escape the anchors.
	if _, err := regexp.Compile(src); err != nil {
		return nil, true, fmt.Errorf("regular expression: %w", err)
	}
	re, err := regexp.Compile("^(?:" + src + ")$")
	if err != nil {
		return nil, true, fmt.Errorf("regular expression: %w", err)
	}
	return re, true, nil
}
