package derive_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rld/rld/config"
	"github.com/rld/rld/derive"
	"github.com/rld/rld/internal/reqcorpus"
)

// corpusDeriver compiles requests.toml's [request] table.
func corpusDeriver(t testing.TB) *derive.Deriver {
	t.Helper()
	text, err := reqcorpus.Config("")
	require.NoError(t, err)
	cfg, err := config.Parse([]byte(text), "requests.toml")
	require.NoError(t, err)
	d, err := derive.New(cfg.Request)
	require.NoError(t, err)
	return d
}

func TestCorpus(t *testing.T) {
	d := corpusDeriver(t)
	cases, err := reqcorpus.Load()
	require.NoError(t, err)
	require.NotEmpty(t, cases)
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	var s derive.Scratch
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			res := d.Derive(c.Attributes(), now, &s)
			require.True(t, res.Derived)
			require.Equal(t, c.Oversize, res.Oversize, "line %d", c.Line)
			var got []reqcorpus.Desc
			for _, ds := range res.Descs {
				got = append(got, reqcorpus.Desc{Name: string(ds.Name), Value: string(ds.Value)})
			}
			require.Equal(t, reqcorpus.Lines(c.Want), reqcorpus.Lines(got), "line %d", c.Line)
		})
	}
}
