package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/rld/rld/envoyrls"
	"github.com/rld/rld/policy"
)

// envoyFace is the Envoy rate limit service ([envoy]): a gRPC server on
// envoy.listen and/or envoy.socket, checking with the policy in force.
type envoyFace struct {
	srv   *envoyrls.Server
	lns   []net.Listener
	wg    sync.WaitGroup
	once  sync.Once
	addrs []string
}

// startEnvoy listens on the [envoy] addresses, if any, and serves them.
func (d *Daemon) startEnvoy() error {
	cfg := d.cfg()
	e := cfg.Envoy
	if e.Listen == "" && e.Socket == "" {
		return nil
	}
	srv, err := envoyrls.New(envoyrls.Options{Policy: func() *policy.Policy { return d.pol() }})
	if err != nil {
		return err
	}
	f := &envoyFace{srv: srv}
	if e.Listen != "" {
		ln, err := net.Listen("tcp", e.Listen)
		if err != nil {
			return fmt.Errorf("cannot listen on envoy.listen=%q: %w", e.Listen, err)
		}
		f.lns = append(f.lns, ln)
	}
	if e.Socket != "" {
		ln, err := listenUnix(e.Socket, cfg.Server.SocketFileMode())
		if err != nil {
			for _, l := range f.lns {
				l.Close()
			}
			return fmt.Errorf("envoy.socket: %w", err)
		}
		f.lns = append(f.lns, ln)
	}
	for _, ln := range f.lns {
		f.addrs = append(f.addrs, ln.Addr().String())
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := srv.Serve(ln); err != nil {
				d.log.Error("envoy rls stopped", slog.Any("error", err))
			}
		}()
	}
	d.envoy = f
	d.log.Info("envoy rls serving", slog.Any("addrs", f.addrs))
	return nil
}

// EnvoyAddrs returns the addresses the Envoy face listens on (TCP first,
// then the socket), none when it is off.
func (d *Daemon) EnvoyAddrs() []string {
	if d.envoy == nil {
		return nil
	}
	return d.envoy.addrs
}

// stopEnvoy drains the Envoy face: no new calls, the calls in flight
// answered within drain_timeout. It may be called more than once.
func (d *Daemon) stopEnvoy() {
	f := d.envoy
	if f == nil {
		return
	}
	f.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(d.cfg().Server.DrainTimeout))
		defer cancel()
		f.srv.Drain(ctx)
		for _, ln := range f.lns {
			ln.Close() // a Unix listener removes its socket file
		}
		f.wg.Wait()
	})
}
