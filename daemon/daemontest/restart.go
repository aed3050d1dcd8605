package daemontest

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"time"
)

// Restart runs the rld binary again on the process's directory, config and
// socket, once the previous run has exited (after Kill or Term), as a
// supervisor restarting a crashed daemon would, and waits until it answers
// a PING. Its logs follow the previous run's in Logs.
func (p *Process) Restart() error {
	select {
	case <-p.exited:
	default:
		return fmt.Errorf("daemontest: Restart: rld is still running")
	}
	bin, err := binary()
	if err != nil {
		return err
	}
	w := p.cmd.Stderr
	p.cmd = exec.Command(bin, "serve", "-config", filepath.Join(p.Dir, "rld.toml"), "-socket", p.Socket, "-http", "off")
	p.cmd.Stderr = w
	p.exited = make(chan struct{})
	if err := p.cmd.Start(); err != nil {
		close(p.exited)
		return fmt.Errorf("daemontest: restart rld: %w", err)
	}
	exited := p.exited
	go func() {
		p.err = p.cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !ping(p.Socket) {
		select {
		case <-exited:
			return fmt.Errorf("daemontest: restarted rld exited before serving: %v\n%s", p.err, p.Logs())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("daemontest: restarted rld not serving after 10s\n%s", p.Logs())
		}
		time.Sleep(10 * time.Millisecond) // polling readiness
	}
	return nil
}
