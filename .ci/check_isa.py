"""Check that ISA-specific instructions live only in their tier's functions.

    python .ci/check_isa.py OBJDUMP FILE.so ARCH        ARCH: x86_64 or aarch64

Disassembles FILE.so and fails when a function outside a tier holds an instruction beyond the
architecture's baseline: on x86-64 any VEX/EVEX instruction (v-prefixed, ymm/zmm/k registers)
outside *_avx2 / *_avx512_vnni; on aarch64 any sdot/udot outside *_neon_dotprod. It also fails
when the tier functions hold none of them, so the check cannot pass vacuously.
"""

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


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
