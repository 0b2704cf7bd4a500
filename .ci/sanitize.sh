#!/usr/bin/env bash
# Sanitizer lane (native x86-64), run from a clone: `bash .ci/sanitize.sh`.
#   1. a fresh venv (.venv-san) with int8attn._cache built into it from a scratch copy of the
#      sources, with ASan + UBSan on top of setup.py's own flags; the .so is checked for the
#      instrumentation (asan/ubsan symbols and runtimes, and the flags each unit was built with);
#   2. the pytest suite against that build, from outside the source tree, with the ASan runtime
#      preloaded into the (uninstrumented) interpreter; the `tier` fixture runs the kernel tests
#      on every tier this CPU has;
#   3. the C cross-check of tiers (tests/c/tiers_agree.c) and of each kernel table entry
#      (tests/c/kernels_agree.c) built and run with the same sanitizers, and tiers_agree once more
#      with ThreadSanitizer (the pool's lock-free claims and wake-ups).
# Any sanitizer report or test failure fails the lane; the wall time of each phase is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$SECONDS
TIMES=() PHASE=
phase() {
  [[ -z $PHASE ]] || TIMES+=("$((SECONDS - LAST))s  $PHASE")
  LAST=$SECONDS PHASE=$*
  [[ -z $PHASE ]] || printf '\n=== %s (t=%ds)\n' "$*" $((SECONDS - START))
}
tmp=$(mktemp -d)
trap 'phase; printf "\nphase times:\n"; printf "  %s\n" "${TIMES[@]}"; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck disable=SC2054  # (the commas are gcc's)
SAN=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g)
VENV=$ROOT/.venv-san

phase "venv with the build and test dependencies"
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip numpy Cython setuptools wheel pytest hypothesis

phase "int8attn._cache built with ASan + UBSan"
# A scratch copy, so Cython runs afresh, no up-to-date build/ in the tree is installed as is, and
# no sanitized objects are left in build/ for the next ordinary build to reuse.
mkdir "$tmp/src"
cp -r setup.py pyproject.toml README.md LICENSE MANIFEST.in src "$tmp/src"
rm -f "$tmp/src/src/int8attn/_cache.c" "$tmp"/src/src/int8attn/*.so
# setuptools puts CFLAGS before setup.py's extra_compile_args, whose -g0 would cancel -g (no
# file:line in reports), so the compiler is wrapped to add -g last. CFLAGS also reach the link.
printf '#!/bin/sh\nexec gcc "$@" -g -DI8A_CHECK_PRECONDITIONS\n' >"$tmp/cc" && chmod +x "$tmp/cc"
CC=$tmp/cc CFLAGS="${SAN[*]}" LDFLAGS="${SAN[0]}" \
  "$VENV/bin/pip" install -q --no-build-isolation "$tmp/src"
so=$(echo "$VENV"/lib/python3*/site-packages/int8attn/_cache*.so)
syms=$(nm -D --undefined-only "$so") needed=$(readelf -d "$so")
has() { grep -q -- "$2" <<<"$1" || fail "$so: $3"; }
has "$syms" __asan_report_ "no ASan instrumentation"
has "$syms" '__ubsan_handle_.*_abort' "no (non-recovering) UBSan checks"
has "$needed" 'NEEDED.*libasan' "libasan not linked"
has "$needed" 'NEEDED.*libubsan' "libubsan not linked"
units=$(readelf --debug-dump=info --dwarf-depth=1 "$so" | grep DW_AT_producer | sed 's/.*: GNU/GNU/')
echo "$units"
n=$(grep -c -- '-O3 .*-fsanitize=address,undefined -fno-sanitize-recover=all .*-ffp-contract=off' <<<"$units" || true)
want=$(( $(grep -vc '^#' src/int8attn/csources.txt) + 1 ))   # the C sources, and Cython's _cache.c
((n == want)) || fail "$n of $want units carry debug info, the sanitizers and setup.py's flags"

phase "pytest under ASan + UBSan, every native tier"
# The interpreter is not instrumented: the ASan runtime must come first (libubsan then comes in
# as the .so's dependency). No leak checks: CPython and numpy keep memory until exit. Tests that
# ask for absurd sizes expect MemoryError: malloc returns NULL instead of aborting. ASan
# reports go to files, printed after the run, so one in a child process fails the lane even if
# its test would not; UBSan (in an ASan process) ignores log_path and writes to fd 2, so pytest
# captures sys.stderr only (its fd capture would swallow the report when the process dies).
# Both abort on a report, so pytest's faulthandler names the test (unbuffered: no output lost).
mkdir "$tmp/reports" "$tmp/run"
# INT8ATTN_SANITIZED: the one test that measures RSS skips that check (ASan's quarantine).
san() {
  INT8ATTN_SANITIZED=1 PYTHONUNBUFFERED=1 LD_PRELOAD=$(gcc -print-file-name=libasan.so) \
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1:log_path=$tmp/reports/asan \
  UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1 "$@"
}
cd "$tmp/run"                   # outside the source tree: `import int8attn` is the venv's build
info=$(san "$VENV/bin/python" -c 'import int8attn as ia; print(ia.__file__, *ia.supported_isas())')
echo "int8attn: $info"
[[ $info == "$VENV"/* ]] || fail "int8attn imported from outside $VENV"
rc=0
san "$VENV/bin/python" -m pytest -q -p no:cacheprovider --capture=sys "$ROOT/tests" || rc=$?
for f in "$tmp"/reports/*; do       # a report fails the lane; a warning alone (an allocation
  [[ -e $f ]] || continue            # refused with allocator_may_return_null) is only shown
  printf '\n--- %s\n' "${f##*/}"; cat "$f"
  if grep -q -e 'ERROR: ' -e 'SUMMARY: ' "$f"; then rc=1; fi
done
((rc == 0)) || fail "pytest under the sanitizers (status $rc)"
cd "$ROOT"

phase "C cross-check of tiers under ASan + UBSan (leak checks on: all of it is instrumented)"
mapfile -t lib < <(grep -v '^#' src/int8attn/csources.txt)        # the one list setup.py builds
csrc=(tests/c/tiers_agree.c "${lib[@]}")
cflags=(-O2 -std=c11 -ffp-contract=off -Wall -Wextra -Werror -DI8A_CHECK_PRECONDITIONS -Isrc/int8attn
        -DI8A_TILE_MODEL)
# the library's objects, compiled once for both checks (about 100 s a build on this VM's CPU),
# all sources at once
mkdir "$tmp/obj"
pids=()
for src in "${lib[@]}"; do
  gcc "${cflags[@]}" "${SAN[@]}" -c "$src" -o "$tmp/obj/$(tr / _ <<<"${src%.c}").o" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "the library under the sanitizers does not compile"; done
gcc "${cflags[@]}" "${SAN[@]}" tests/c/tiers_agree.c "$tmp"/obj/*.o -lm -pthread -o "$tmp/agree"
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$tmp/agree" || fail "tiers_agree under the sanitizers"
# each table entry called directly on inputs of the exact size of its preconditions: a read past
# them is an ASan report
gcc "${cflags[@]}" "${SAN[@]}" tests/c/kernels_agree.c "$tmp"/obj/*.o -lm -pthread \
  -o "$tmp/kernels-agree"
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$tmp/kernels-agree" \
  || fail "kernels_agree under the sanitizers"

phase "C cross-check under ThreadSanitizer: the pool's claims, steals and wake-ups"
gcc "${cflags[@]}" -fsanitize=thread -g "${csrc[@]}" -lm -pthread -o "$tmp/agree-tsan"
# the pool's code is the same under every tier: the scalar one's decodes exercise it (the
# whole table under TSan took 6 minutes of the lane's 19)
I8A_CHECK_TIERS=scalar TSAN_OPTIONS=halt_on_error=1 "$tmp/agree-tsan" \
  || fail "tiers_agree under ThreadSanitizer"

phase
echo "=== sanitizer lane passed (t=$((SECONDS - START))s)"
