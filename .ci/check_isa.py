"""Check that ISA-specific instructions live only in their tier's functions.

    python .ci/check_isa.py OBJDUMP FILE.so ARCH        ARCH: x86_64 or aarch64
    python .ci/check_isa.py names SIMD_DIR              the naming rule the first check needs

The naming rule: every function defined in SIMD_DIR/<tier>.h ends in _<tier> (common.h and
dispatch.h hold the shared, baseline code). The objdump check finds a tier's functions by that
suffix, so a tier function named otherwise would escape it.

Disassembles FILE.so and fails when a function outside a tier holds an instruction beyond the
architecture's baseline: on x86-64 any VEX/EVEX instruction (v-prefixed, ymm/zmm/k registers)
outside *_avx2 / *_avx512_vnni; on aarch64 any sdot/udot outside *_neon_dotprod. It also fails
when the tier functions hold none of them, so the check cannot pass vacuously.
"""

import glob
import os
import re
import subprocess
import sys

TIERS = {
    "x86_64": (re.compile(r"_(avx2|avx512_vnni)$"), ("avx2", "avx512_vnni")),
    "aarch64": (re.compile(r"_neon_dotprod$"), ("neon_dotprod",)),
}


def beyond_baseline(arch, mnemonic, operands):
    if arch == "x86_64":
        return mnemonic.startswith("v") or re.search(r"%[yz]mm|%k[0-7]", operands) is not None
    return mnemonic in ("sdot", "udot")


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
        if t:
            seen[t.group(1) if t.groups() else tiers[0]] += 1
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


def check_names(simd_dir):
    bad, count = [], 0
    for path in sorted(glob.glob(os.path.join(simd_dir, "*.h"))):
        tier = os.path.basename(path)[:-2]
        if tier in ("common", "dispatch"):
            continue
        text = open(path).read()
        for m in DEFINITION.finditer(text):
            rest = text[m.end():]
            depth, i = 1, 0                  # skip the argument list, then see what follows
            while depth and i < len(rest):
                depth += {"(": 1, ")": -1}.get(rest[i], 0)
                i += 1
            if not rest[i:].lstrip().startswith("{"):
                continue                     # a declaration or a typedef, not a definition
            count += 1
            if not m.group(1).endswith("_" + tier):
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{path}:{line}: {m.group(1)} does not end in _{tier}")
    print(f"{simd_dir}: {count} tier function definitions checked")
    for b in bad:
        print("  " + b)
    return 1 if bad or not count else 0


if __name__ == "__main__":
    if sys.argv[1] == "names":
        sys.exit(check_names(sys.argv[2]))
    sys.exit(main(*sys.argv[1:4]))
