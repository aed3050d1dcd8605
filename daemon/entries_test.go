package daemon_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/change"
)

// TestOverrideEntryJSON: the admin API's override is the policy's
// change.Override with its period as a duration's text, written once,
// and it reads back the same.
func TestOverrideEntryJSON(t *testing.T) {
	at := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	e := admin.OverrideEntry{Override: change.Override{ID: "o-1", Rule: "r", Key: map[string]string{"api_key": "k"},
		Limit: 5, Period: time.Minute, Expires: at, Created: at}, Period: "1m", Orphaned: true}
	b, err := json.Marshal(e)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(b), `"period"`), "%s", b)
	assert.Contains(t, string(b), `"period":"1m"`)
	assert.Contains(t, string(b), `"key":{"api_key":"k"}`)
	assert.Contains(t, string(b), `"orphaned":true`)
	var back admin.OverrideEntry
	require.NoError(t, json.Unmarshal(b, &back))
	e.Override.Period = 0 // not in the JSON: Period stands for it
	assert.Equal(t, e, back)

	bl := admin.BlockEntry{Block: change.Block{ID: "b-1", Match: map[string]string{"ip": "10.*"}, Expires: at, Created: at}}
	b, err = json.Marshal(bl)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"b-1","match":{"ip":"10.*"},"expires":"2026-11-23T12:00:00Z","created":"2026-11-23T12:00:00Z"}`, string(b))
}
