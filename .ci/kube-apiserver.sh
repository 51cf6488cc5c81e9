#!/usr/bin/env bash
# Builds a real Kubernetes API server (v1.20.2) for the Kubernetes backend's tests, offline, from
# Debian bookworm's `kubernetes` source package (Debian ships only the client binary). Prints the
# binary's path on its last line. Cached: a second run returns at once.
#
#   bin=$(bash .ci/kube-apiserver.sh | tail -1)
#
# Needs root (apt-get) and Debian's archive (deb-src entries are added for the machine's own suites
# when missing). 5–10 minutes on 2 cores the first time. Upstream v1.20 vendors
# github.com/modern-go/reflect2 v1.0.1, which crashes under Go >= 1.18 (a SIGSEGV in map iteration
# on the first JSON write); Debian's Go is 1.19, so Debian's reflect2 v1.0.2 replaces it.
set -euo pipefail
work=${KUBE_APISERVER_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/idalloc-kube-apiserver}
bin="$work/bin/kube-apiserver"
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q 'v1\.20'; then
  echo "$bin"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
if ! apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes'; then
  sources=/etc/apt/sources.list.d/debian.sources
  if [ ! -f "$sources" ]; then
    echo "kube-apiserver: no $sources to derive deb-src entries from" >&2
    exit 1
  fi
  sed -n '/^Types:/,/^$/p' "$sources" | sed 's/^Types:.*/Types: deb-src/' \
    >/etc/apt/sources.list.d/idalloc-deb-src.sources
  apt-get update -qq
fi
apt-get install -y -qq golang-go rsync golang-github-modern-go-reflect2-dev >/dev/null

mkdir -p "$work/src" "$work/bin"
cd "$work/src"
ls kubernetes_*.orig.tar.gz >/dev/null 2>&1 || apt-get source --download-only kubernetes >/dev/null 2>&1
tree="$work/src/tree"
rm -rf "$tree"
mkdir -p "$tree"
tar xzf kubernetes_*.orig.tar.gz -C "$tree" --strip-components=1
cd "$tree"
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
rm -rf vendor/github.com/modern-go/reflect2/debian vendor/github.com/modern-go/reflect2/.git*
# `providerless` leaves out the in-tree cloud providers (AWS, Azure, GCE, OpenStack, vSphere SDKs
# and their volume plugins), which the tests never use and which are a large part of the compile.
if ! GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-tags=providerless CGO_ENABLED=0 make WHAT=cmd/kube-apiserver \
  >"$work/build.log" 2>&1; then
  tail -20 "$work/build.log" >&2
  exit 1
fi
cp _output/bin/kube-apiserver "$bin"
# The tree with its build outputs is about 2 GB; the source tarball stays for a rebuild.
cd "$work/src" && rm -rf "$tree"
"$bin" --version >&2
echo "$bin"
