"""Check that ISA-specific instructions live only in their tier's functions.

    python .ci/check_isa.py OBJDUMP FILE.so ARCH        ARCH: x86_64 or aarch64
    python .ci/check_isa.py names SIMD_DIR              the naming rule the first check needs

The layout: SIMD_DIR/<op>/scalar.h holds an op's scalar rule (baseline, shared by every tier)
and the scalar tier's entry; SIMD_DIR/<op>/<tier>.h that op's code of one ISA tier, included only
by SIMD_DIR/<tier>.h inside the tier's target region (neon.h: the aarch64 baseline, no region).
The naming rule: every function defined in SIMD_DIR/<op>/<tier>.h ends in _<tier>, and no
function of <op>/scalar.h ends in an ISA tier's suffix; each <op>/<tier>.h is included by
<tier>.h and by nothing else under SIMD_DIR, and the tier headers define no function themselves
(so that a tier's pragma applies to exactly its op files). The objdump check finds a tier's
functions by that suffix, so a tier function named otherwise would escape it.

Disassembles FILE.so and fails when a function outside a tier holds an instruction beyond the
architecture's baseline: on x86-64 any VEX/EVEX instruction (v-prefixed, ymm/zmm/k registers)
outside *_avx2 / *_avx512_vnni / *_amx and any AMX tile instruction outside *_amx; on aarch64
any sdot/udot outside *_neon_dotprod / *_neon_i8mm (the i8mm tier inlines the dotprod tier's
4-bit passes) and any smmla/ummla/usmmla outside *_neon_i8mm. It also fails when a tier's functions hold none of them, so the check cannot pass
vacuously.
"""

import glob
import os
import re
import subprocess
import sys

TIERS = {
    "x86_64": (re.compile(r"_(avx2|avx512_vnni|amx)$"), ("avx2", "avx512_vnni", "amx")),
    "aarch64": (re.compile(r"_(neon_dotprod|neon_i8mm)$"), ("neon_dotprod", "neon_i8mm")),
}
# the matrix instructions, each its tier's alone
MATRIX = {"aarch64": (re.compile(r"^(smmla|ummla|usmmla)$"), "neon_i8mm"),
          "x86_64": (re.compile(r"^(ldtilecfg|sttilecfg|tile\w+|tdpb\w+)$"), "amx")}


def beyond_baseline(arch, mnemonic, operands):
    if arch == "x86_64":
        return (mnemonic.startswith("v") or MATRIX[arch][0].match(mnemonic) is not None
                or re.search(r"%[yz]mm|%k[0-7]|%tmm", operands) is not None)
    return mnemonic in ("sdot", "udot") or MATRIX[arch][0].match(mnemonic) is not None


def main(objdump, path, arch):
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", path], check=True,
                          capture_output=True, text=True).stdout
    tier_name, tiers = TIERS[arch]
    func, bad, seen = None, {}, {t: 0 for t in tiers}
    for line in text.splitlines():
        m = re.match(r"^[0-9a-f]+ <([^>]+)>:$", line)
        if m:
            func = m.group(1).split("@")[0]
            base = func.split(".")[0]            # foo.constprop.0 -> foo
            continue
        m = re.match(r"^\s+[0-9a-f]+:\s+(\S+)\s*(.*)$", line)
        if not m or func is None or not beyond_baseline(arch, m.group(1), m.group(2)):
            continue
        t = tier_name.search(base)
        matrix, owner = MATRIX[arch]
        if t and not (matrix.match(m.group(1)) and t.group(1) != owner):
            seen[t.group(1)] += 1
        else:
            bad.setdefault(func, []).append(f"{m.group(1)} {m.group(2)}".strip())
    print(f"{path}: tier instructions per tier: {seen}")
    for f, insns in bad.items():
        print(f"  outside a tier: {f}: {len(insns)} instruction(s), e.g. {insns[0]}")
    missing = [t for t, n in seen.items() if n == 0]
    if missing:
        print(f"  no tier instructions found for {missing}: the check would be vacuous")
    return 1 if bad or missing else 0


# a definition: a line starting with static/I8A_INLINE (qualifiers and return type may wrap to
# the next line) whose name is followed by "(" and, after the arguments, by a body
DEFINITION = re.compile(r"^(?:static|I8A_INLINE)\b[^;{(]*?\b(i8a_\w+|\w+)\s*\(", re.M)


ISA_TIERS = ("avx2", "avx512_vnni", "amx", "neon", "neon_dotprod", "neon_i8mm")
INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def definitions(text):
    """(name, line) of every function defined in text."""
    for m in DEFINITION.finditer(text):
        rest = text[m.end():]
        depth, i = 1, 0                      # skip the argument list, then see what follows
        while depth and i < len(rest):
            depth += {"(": 1, ")": -1}.get(rest[i], 0)
            i += 1
        if rest[i:].lstrip().startswith("{"):  # else a declaration or a typedef
            yield m.group(1), text.count("\n", 0, m.start()) + 1


def check_names(simd_dir):
    bad, count = [], 0
    includers = {}                           # op file -> the headers that include it
    for path in sorted(glob.glob(os.path.join(simd_dir, "*.[ch]"))
                       + glob.glob(os.path.join(simd_dir, "*", "*.h"))):
        rel = os.path.relpath(path, simd_dir)
        text = open(path).read()
        for inc in INCLUDE.findall(text):
            target = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
            includers.setdefault(target, []).append(rel)
        parts = rel.split(os.sep)
        if len(parts) == 1:                  # a tier header, common.h, dispatch.h, kernels.c
            if parts[0][:-2] in ISA_TIERS + ("scalar",):
                for name, line in definitions(text):
                    bad.append(f"{path}:{line}: {name} defined in a tier header, not an op file")
            continue
        tier = parts[1][:-2]
        for name, line in definitions(text):
            count += 1
            if tier == "scalar":
                if any(name.endswith("_" + t) for t in ISA_TIERS):
                    bad.append(f"{path}:{line}: {name} (an ISA tier's name) in a scalar rule")
            elif tier in ISA_TIERS:
                if not name.endswith("_" + tier):
                    bad.append(f"{path}:{line}: {name} does not end in _{tier}")
            else:
                bad.append(f"{path}:{line}: {name} in {parts[1]}, not a tier's file")
    for path in sorted(glob.glob(os.path.join(simd_dir, "*", "*.h"))):
        rel = os.path.relpath(path, simd_dir)
        tier = os.path.basename(rel)[:-2]
        if tier in ISA_TIERS and includers.get(rel, []) != [tier + ".h"]:
            bad.append(f"{path}: included by {includers.get(rel, [])}, not by {tier}.h alone")
    print(f"{simd_dir}: {count} function definitions checked")
    for b in bad:
        print("  " + b)
    return 1 if bad or not count else 0


if __name__ == "__main__":
    if sys.argv[1] == "names":
        sys.exit(check_names(sys.argv[2]))
    sys.exit(main(*sys.argv[1:4]))
