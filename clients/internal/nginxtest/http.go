package nginxtest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Reply is an HTTP answer as the client tests read it.
type Reply struct {
	Status int
	Header http.Header
	Body   string
}

// Get sends GET url with the header fields hdr (name, value, name,
// value, …) and returns the answer.
func Get(t testing.TB, url string, hdr ...string) Reply {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return Reply{resp.StatusCode, resp.Header, string(b)}
}

// KillUnderLoad sends GET url from four workers while rld is killed and
// restarted three times (kill, then restart, each after every requests
// more answers), and asserts that every answer was wantBody with a status
// below 500: a client of rld never turns rld's death into a server error.
// progress bounds the wait for each batch of answers.
func KillUnderLoad(t *testing.T, url, wantBody string, every int64, progress time.Duration, kill func(), restart func() error) {
	t.Helper()
	var stop atomic.Bool
	var total, bad atomic.Int64
	var firstBad atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				resp, err := http.Get(url)
				if err != nil {
					firstBad.CompareAndSwap(nil, err.Error())
					bad.Add(1)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				total.Add(1)
				if resp.StatusCode >= 500 || string(b) != wantBody {
					firstBad.CompareAndSwap(nil, strconv.Itoa(resp.StatusCode)+" "+string(b))
					bad.Add(1)
				}
			}
		}()
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()
	waitFor := func(n int64) {
		deadline := time.Now().Add(progress)
		for start := total.Load(); total.Load() < start+n; {
			require.True(t, time.Now().Before(deadline), "no progress")
			time.Sleep(5 * time.Millisecond) // polling the request count
		}
	}
	for round := 0; round < 3; round++ {
		waitFor(every)
		kill()
		waitFor(every)
		require.NoError(t, restart())
	}
	waitFor(every)
	stop.Store(true)
	wg.Wait()
	assert.Zero(t, bad.Load(), "of %d requests; first: %v", total.Load(), firstBad.Load())
}

// RawFrom sends the raw request req (request line and header fields,
// without the final empty line) to addr from the loopback address src,
// as a client at src would, and returns the answer.
func RawFrom(t testing.TB, src, addr, req string) Reply {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(c, req+"\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "answer to %.80q", req)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return Reply{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
}
