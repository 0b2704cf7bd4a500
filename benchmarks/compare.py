"""Regression gate: compare two benchmark reports case by case on their minimum time.

    python benchmarks/compare.py OLD.json NEW.json [--tolerance 0.10]

Prints every case both reports have, with the ratio new/old of the minima, names each case that
got slower by more than the tolerance, and exits 1 when there is one (0 otherwise).
Minima are compared because they are the least disturbed by other load on a shared machine.
"""

import argparse
import json
import sys


def load(path):
    with open(path) as f:
        rep = json.load(f)
    return rep, {c["name"]: c for c in rep["cases"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--tolerance", type=float, default=0.10,
                    help="allowed slowdown of a case's minimum, as a fraction (default 0.10)")
    args = ap.parse_args(argv)
    old_rep, old = load(args.old)
    new_rep, new = load(args.new)
    print(f"old: {old_rep.get('commit')} ({old_rep.get('created')})")
    print(f"new: {new_rep.get('commit')} ({new_rep.get('created')})")
    slower = []
    for name in [n for n in new if n in old]:
        a, b = old[name]["time"]["min"], new[name]["time"]["min"]
        ratio = b / a
        flag = ""
        if ratio > 1 + args.tolerance:
            flag = "  SLOWER"
            slower.append((name, ratio))
        print(f"{name:<58} {a * 1e3:9.3f} ms -> {b * 1e3:9.3f} ms  x{ratio:5.2f}{flag}")
    only = sorted(set(old) ^ set(new))
    if only:
        print(f"\n{len(only)} case(s) in only one report: " + ", ".join(only))
    if slower:
        print(f"\n{len(slower)} case(s) slower than x{1 + args.tolerance:.2f}:")
        for name, ratio in slower:
            print(f"  {name}  x{ratio:.2f}")
        return 1
    print("\nno case slower than the tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
