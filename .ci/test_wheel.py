"""Run the test suite against the installed int8attn once per tier this CPU has.

    python .ci/test_wheel.py [--tiers=a,b | --one-run] TESTS_DIR [pytest args...]

Each run sets INT8ATTN_ISA to one supported tier (so that tier is the default one at import, and
the suite tests that tier only, against the scalar tier) and runs pytest from a directory
outside the source tree, so `import int8attn` finds the installed wheel, never the sources.
--tiers limits the runs to those tiers (each must be supported). --one-run runs the suite once
with no tier pinned: its tier fixture then tests every tier the CPU has in the one process, and
the tests without the fixture run once, on the default tier (a third of the time on a CPU with
three tiers). Used by cibuildwheel's test-command and by .ci/run.
"""

import os
import subprocess
import sys
import tempfile


def main(*argv):
    only = None
    if argv and argv[0].startswith("--tiers="):
        only, argv = argv[0].partition("=")[2].split(","), argv[1:]
    elif argv and argv[0] == "--one-run":
        tests, *args = argv[1:]
        env = {k: v for k, v in os.environ.items() if k != "INT8ATTN_ISA"}
        print("== one run, every tier this CPU has", flush=True)
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               os.path.abspath(tests), *args], env=env,
                              cwd=tempfile.gettempdir()).returncode
    tests, *args = argv
    tiers = subprocess.run([sys.executable, "-c", "import int8attn; print(*int8attn.supported_isas())"],
                           check=True, capture_output=True, text=True,
                           cwd=tempfile.gettempdir()).stdout.split()
    if only:
        lacking = [t for t in only if t not in tiers]
        if lacking:
            print(f"--tiers: {', '.join(lacking)} not supported here (supported: {', '.join(tiers)})")
            return 1
        tiers = only
    failed = []
    for tier in tiers:
        print(f"== INT8ATTN_ISA={tier}", flush=True)
        env = dict(os.environ, INT8ATTN_ISA=tier)
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            os.path.abspath(tests), *args], env=env, cwd=tempfile.gettempdir())
        if r.returncode != 0:
            failed.append(tier)
    if failed:
        print(f"tests failed with INT8ATTN_ISA={', '.join(failed)}")
        return 1
    print(f"tests passed with INT8ATTN_ISA={', '.join(tiers)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
