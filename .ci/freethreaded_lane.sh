#!/usr/bin/env bash
# Free-threaded lane, run as root from the repo root: `bash .ci/freethreaded_lane.sh`.
#
# Builds int8attn's wheel on a free-threaded CPython (3.14t, else 3.13t), installs it in a fresh
# venv, checks that importing it keeps the GIL disabled (the extension must declare free-threading
# support, or the import re-enables the GIL with a RuntimeWarning), and runs the test suite from
# outside the source tree with PYTHON_GIL=0, checking the GIL is still off when it ends.
#
# Why CPython is built from source: no Debian suite ships a free-threaded interpreter, and only
# PyPI and Debian's mirror are reachable (no python.org). So the upstream tarball of Debian's own
# python3.14 / python3.13 source package (the newest one the mirror serves, sha256-checked against
# sid's Sources index) is configured with --disable-gil (no PGO/LTO: a few minutes on 2 cores)
# and installed to $FT_CACHE/cpython-<version>t, which later runs reuse.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${FT_CACHE:-/var/cache/int8attn-ci}
MIRROR=${FT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
START=$SECONDS T=$SECONDS P=""
phase() {  # ends the running phase with its timing line, starts the next
  [[ -z $P ]] || printf '[ft-lane] phase %-26s %4d s\n' "'$P'" $((SECONDS - T))
  P=$1 T=$SECONDS
  [[ -z $P ]] || echo "[ft-lane] === $P"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

phase "apt packages"
export DEBIAN_FRONTEND=noninteractive
need=(gcc make libc6-dev pkg-config curl ca-certificates xz-utils libssl-dev zlib1g-dev libffi-dev)
missing=()
for p in "${need[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; fi

phase "pick CPython"
# "<tarball> <sha256>" for every python3.14/python3.13 upstream tarball in sid, newest first
curl -fsS "$MIRROR/dists/sid/main/source/Sources.xz" | xz -dc | awk 'BEGIN { RS = ""; FS = "\n" }
  $1 ~ /^Package: python3\.1[34]$/ { for (i = 2; i <= NF; i++) { n = split($i, f, " ")
    if (n == 3 && length(f[1]) == 64 && f[3] ~ /\.orig\.tar\.xz$/) print f[3], f[1] } }' \
  | sort -urV >"$tmp/candidates"
tarball="" sha=""
while read -r t s; do     # the mirror may not serve every version the index lists yet
  url=$MIRROR/pool/main/p/${t%%_*}/$t
  if curl -fsSI "$url" >/dev/null 2>&1; then tarball=$t sha=$s; break; fi
  echo "not served by the mirror: $t"
done <"$tmp/candidates"
[[ -n $tarball ]] || { echo "no python3.14/3.13 upstream tarball reachable"; exit 1; }
ver=${tarball#*_} ver=${ver%.orig.tar.xz}       # e.g. 3.14.10
series=${ver%.*}
PREFIX=$CACHE/cpython-${ver}t
PY=$PREFIX/bin/python${series}t
conf=(--disable-gil --disable-test-modules)   # no PGO/LTO; the stdlib's tests are not installed
key="$ver ${conf[*]}"
echo "CPython $ver from $tarball -> $PREFIX"

phase "CPython ${ver}t (cached or built)"
if [[ -x $PY && $(cat "$PREFIX/.ok" 2>/dev/null) == "$key" ]]; then
  echo "cached: $PREFIX"
else
  rm -rf "$PREFIX" && mkdir -p "$CACHE" "$tmp/cpython"
  curl -fsS "$url" -o "$tmp/$tarball"
  echo "$sha  $tmp/$tarball" | sha256sum -c --quiet -
  tar -C "$tmp/cpython" --strip-components=1 -xJf "$tmp/$tarball"
  log=$CACHE/cpython-${ver}t-build.log
  if ! (cd "$tmp/cpython" && ./configure -q --prefix="$PREFIX" "${conf[@]}" \
        && make -s -j"$(nproc)" && make -s install) >"$log" 2>&1; then
    tail -n 40 "$log"; echo "CPython build failed (log: $log)"; exit 1
  fi
  grep -m1 -B4 '^Checked .* modules' "$log" || true
  # pip needs ssl and zlib; venv (ensurepip) and ctypes must work too
  "$PY" -c 'import ssl, zlib, ctypes, venv, ensurepip, sys, sysconfig
assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1 and not sys._is_gil_enabled()'
  echo "$key" >"$PREFIX/.ok"
  find "$CACHE" -maxdepth 1 -name 'cpython-*t' ! -name "cpython-${ver}t" -exec rm -rf {} +  # older builds
fi
"$PY" -VV

phase "venv"
"$PY" -m venv "$tmp/venv"
VPY=$tmp/venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
"$VPY" -m pip install -q --upgrade pip
# wheels only: the newest numpy with a wheel for this interpreter (numpy 2.5 has no cp313t ones)
"$VPY" -m pip install -q --only-binary=:all: numpy 'cython>=3.1' 'setuptools>=77' wheel pytest hypothesis
"$VPY" -m pip list

phase "wheel"
# built from a copy, so no build/ or generated _cache.c of another interpreter is reused
mkdir "$tmp/src"
tar -C . --exclude=.git --exclude=./build --exclude=./dist --exclude='*.egg-info' --exclude='*.so' \
  --exclude=__pycache__ --exclude='.venv*' --exclude=./src/int8attn/_cache.c -cf - . | tar -C "$tmp/src" -xf -
"$VPY" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$tmp/src"
whl=$(ls "$tmp"/dist/int8attn-*.whl)
tag=cp${series/./}
echo "$(basename "$whl")"
[[ $(basename "$whl") == *-$tag-${tag}t-* ]] || { echo "wheel tag is not ${tag}t"; exit 1; }
"$VPY" -m pip install -q "$whl"

phase "GIL after import"
cd "$tmp"            # outside the source tree: import the installed wheel
# PYTHON_GIL unset: a module without free-threading support would turn the GIL back on (warning)
declared=1
env -u PYTHON_GIL "$VPY" -W error::RuntimeWarning -c 'import sys, int8attn
print("imported", int8attn.__file__, "tiers:", *int8attn.supported_isas())
assert not sys._is_gil_enabled(), "importing int8attn enabled the GIL"
print("GIL disabled after import")' || declared=0

phase "tests (PYTHON_GIL=0)"
cp -r "$ROOT/tests" "$ROOT/examples" "$tmp/"     # test_kv_formats needs examples/ beside tests/
PYTHON_GIL=0 "$VPY" -c 'import sys, pytest
rc = pytest.main(sys.argv[1:])
assert not sys._is_gil_enabled(), "the GIL was enabled during the tests"
print("GIL still disabled after the tests")
sys.exit(rc)' -q -ra -p no:cacheprovider "$tmp/tests"

phase ""
((declared)) || { echo "[ft-lane] FAILED: int8attn._cache does not declare free-threading support"; exit 1; }
echo "[ft-lane] free-threaded lane passed: CPython ${ver}t, total $((SECONDS - START)) s"
