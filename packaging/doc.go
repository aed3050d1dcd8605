// Package packaging holds the Debian package of rld (mkdeb.sh, debian/,
// rld.1) and its tests: they build the .deb with `make deb`, install it
// with dpkg on the test machine, run the installed daemon as the rld user
// the way its systemd unit would, drive the socket-activated path with
// systemd-socket-activate, check the units with systemd-analyze, and have
// a real Prometheus scrape rld and evaluate the alert rules and the
// Grafana dashboard's queries (contrib/). They need root, as CI has.
package packaging
