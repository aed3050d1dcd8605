#!/usr/bin/env bash
# mkdeb.sh builds rld's Debian package from a built binary with dpkg-deb:
#
#   packaging/mkdeb.sh BINARY VERSION OUTDIR   -> OUTDIR/rld_VERSION_ARCH.deb
#
# `make deb` calls it after `make build`. The tree is laid out here by hand
# (the package has one static binary, a conffile, two units and docs), and
# dpkg-deb --root-owner-group makes every file root's. The architecture is
# the binary's (GOARCH, mapped to Debian's names). DEB_COMPRESS picks
# dpkg-deb's compressor (xz by default; the tests use the faster gzip).
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 BINARY VERSION OUTDIR" >&2
  exit 2
fi
bin=$1 version=$2 out=$3
top=$(cd "$(dirname "$0")/.." && pwd)
pkg=$top/packaging

goarch=$(go env GOARCH 2>/dev/null || dpkg --print-architecture)
case $goarch in
  386) arch=i386 ;;
  arm) arch=armhf ;;
  *) arch=$goarch ;;
esac

tree=$(mktemp -d)
chmod 0755 "$tree"
trap 'rm -rf "$tree"' EXIT
umask 022

install -D -m 0755 "$bin" "$tree/usr/bin/rld"
install -D -m 0640 "$top/rld.toml" "$tree/etc/rld/rld.toml"
install -D -m 0644 "$top/systemd/rld.service" "$tree/usr/lib/systemd/system/rld.service"
install -D -m 0644 "$top/systemd/rld.socket" "$tree/usr/lib/systemd/system/rld.socket"

doc=$tree/usr/share/doc/rld
install -D -m 0644 "$pkg/debian/copyright" "$doc/copyright"
install -m 0644 "$top/README.md" "$top"/docs/*.md "$doc/"
# The units' Documentation= points at operations.md: keep it readable as is.
install -d -m 0755 "$doc/examples"
install -m 0644 "$top/contrib/grafana/rld.json" "$doc/examples/grafana-rld.json"
install -m 0644 "$top/contrib/prometheus/rld-alerts.yml" "$doc/examples/rld-alerts.yml"
when=$(date -u -R -d "@${SOURCE_DATE_EPOCH:-$(git -C "$top" log -1 --format=%ct 2>/dev/null || date +%s)}")
commit=$("$top/scripts/version.sh" commit)
# The package's own changelog (Debian's format), and the project's
# CHANGELOG.md, what changed for users, as the upstream changelog.
cat >"$tree/changelog" <<CHANGES
rld ($version) unstable; urgency=medium

  * Built from commit $commit.
    What changed for users is in /usr/share/doc/rld/changelog.gz.

 -- rld developers <rld@example.org>  $when
CHANGES
gzip -9n -c "$tree/changelog" >"$doc/changelog.Debian.gz"
rm "$tree/changelog"
gzip -9n -c "$top/CHANGELOG.md" >"$doc/changelog.gz"
chmod 0644 "$doc/changelog.Debian.gz" "$doc/changelog.gz"

install -d -m 0755 "$tree/usr/share/man/man1"
gzip -9n -c "$pkg/rld.1" >"$tree/usr/share/man/man1/rld.1.gz"
chmod 0644 "$tree/usr/share/man/man1/rld.1.gz"
install -D -m 0644 "$pkg/debian/lintian-overrides" "$tree/usr/share/lintian/overrides/rld"

install -d -m 0755 "$tree/DEBIAN"
for f in postinst prerm postrm; do
  install -m 0755 "$pkg/debian/$f" "$tree/DEBIAN/$f"
done
install -m 0644 "$pkg/debian/conffiles" "$tree/DEBIAN/conffiles"
(cd "$tree" && find . -path ./DEBIAN -prune -o -type f -printf '%P\n' | LC_ALL=C sort |
  xargs md5sum >DEBIAN/md5sums)
chmod 0644 "$tree/DEBIAN/md5sums"
size=$(du -sk --exclude=DEBIAN "$tree" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" \
  "$pkg/debian/control" >"$tree/DEBIAN/control"

mkdir -p "$out"
deb=$out/rld_${version}_${arch}.deb
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$tree" "$deb" >/dev/null
echo "$deb"
