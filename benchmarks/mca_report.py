"""The aarch64 kernels' static cost: llvm-mca on the inner loops of the shipped build.

    python benchmarks/mca_report.py            # needs aarch64-linux-gnu-gcc and llvm-mca-19
    python benchmarks/mca_report.py --asm DIR  # also keep each loop's assembly in DIR

There is no Arm hardware behind the project's CI, so aarch64 speed is estimated: each pass of a
decode (the K dots, the V sums, the logits and the softmax) is compiled for aarch64 exactly as a
wheel compiles it (the tier headers, setup.py's flags), each from a small wrapper that calls the
tier's own inline function, so the loop in the object file is the shipped loop. Its innermost loop
(the one with the most dot or multiply-add instructions) goes through llvm-mca for three cores:
Neoverse-N1 standing in for the Cortex-A76 of a Raspberry Pi 5 (LLVM models the A76 itself with an
A57 schedule), the Cortex-A72 of a Pi 4, and Neoverse-N2 for the cores with i8mm (Cortex-A710,
Graviton 3 and 4), where the neon_i8mm tier's SMMLA passes stand beside the neon_dotprod tier's. The loop's cycles per iteration, from llvm-mca's
steady state (200 iterations, every load an L1 hit), become cycles per K/V row of D = 128 for a
kv head read by one query head (H = Hkv) or by four (GQA 4):

    K dots      4 rows, both q planes, 16 dims per iteration: cycles * 128/16 / 4 per row and head
                i8mm: 8 rows, both planes, 16 dims, 1 or 4 heads per iteration
    V sums      the P planes (two with V at 8 bits, three at 4); dotprod: 4 tiles (16 tokens), 1 head x 32 dims or 4 heads x
                4 per iteration; neon: 2 tiles (8 tokens), 1 head x 8 dims or 2 heads x 4;
                i8mm: 2 tiles (8 tokens), 1 head x 16 dims or 4 heads x 8
    P planes    16 weights per iteration, per query head (V at 8 bits' two planes)
    logits      4 tokens per iteration, per query head
    softmax     16 tokens per iteration, per query head

The loops' bookkeeping outside the innermost loop (the row and head loops, the chunk's setup, the
scaling of the weights by V's scales) is not counted: a lower bound of a decode's arithmetic with
its data in L1, for comparing kernels, not a prediction of wall time.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src", "int8attn")
D = 128

# Each wrapper: one pass of one tier, its arguments at run time as in the shipped attend.
WRAPPERS = r"""
#include "_simd/dispatch.h"
#include "_simd/neon_i8mm.h"

#define DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))

I8MM void mca_k1_neon_i8mm(const int8_t *const *rows8, const int8_t *qp, size_t d, int32_t *dh,
                           int32_t *dl)
{
    i8a_kmm_block_neon_i8mm(rows8, qp, 1, 1, d, dh, dl);
}

I8MM void mca_k4_neon_i8mm(const int8_t *const *rows8, const int8_t *qp, size_t d, int32_t *dh,
                           int32_t *dl)
{
    i8a_kmm_block_neon_i8mm(rows8, qp, 4, 1, d, dh, dl);
}

I8MM void mca_v1_neon_i8mm(const uint8_t *wp, size_t pairs, const i8a_span *kv,
                           const int8_t *const *tile, const uint8_t *const *planes, float *o)
{
    i8a_vmm_block_neon_i8mm(wp, pairs, 1, 4, kv, tile, 128, 0, planes, o, 0, 0);
}

I8MM void mca_v4_neon_i8mm(const uint8_t *wp, size_t pairs, const i8a_span *kv,
                           const int8_t *const *tile, const uint8_t *const *planes, float *o)
{
    i8a_vmm_block_neon_i8mm(wp, pairs, 4, 2, kv, tile, 128, 0, planes, o, 0, 0);
}

void mca_k_neon(const i8a_query *q, const i8a_span *kv, int32_t *dh, int32_t *dl)
{
    i8a_kdots_with_neon(i8a_dot16_neon, q, kv, dh, dl);
}

DOTPROD void mca_k_neon_dotprod(const i8a_query *q, const i8a_span *kv, int32_t *dh, int32_t *dl)
{
    i8a_kdots_with_neon(i8a_dot16_neon_dotprod, q, kv, dh, dl);
}

void mca_v1_neon(float *scratch, const i8a_span *kv, float *o)
{
    i8a_vpass_neon(scratch, 1, kv, 128, o);
}

void mca_v4_neon(float *scratch, const i8a_span *kv, float *o)
{
    i8a_vpass_neon(scratch, 4, kv, 128, o);
}

DOTPROD void mca_v1_neon_dotprod(float *scratch, const i8a_span *kv, float *o)
{
    i8a_vpass_neon_dotprod(scratch, 1, kv, 128, o);
}

DOTPROD void mca_v4_neon_dotprod(float *scratch, const i8a_span *kv, float *o)
{
    i8a_vpass_neon_dotprod(scratch, 4, kv, 128, o);
}

void mca_k4_neon(const uint8_t *k4, const uint8_t *wide, size_t n, const int8_t *planes,
                 const int8_t *pw, int32_t *dot)
{
    i8a_k4dots_with_neon(i8a_dot16_neon, k4, wide, n, 128, planes, pw, 3, dot);
}

DOTPROD void mca_k4_neon_dotprod(const uint8_t *k4, const uint8_t *wide, size_t n,
                                 const int8_t *planes, const int8_t *pw, int32_t *dot)
{
    i8a_k4dots_with_neon(i8a_dot16_neon_dotprod, k4, wide, n, 128, planes, pw, 3, dot);
}

void mca_v4_1_neon(float *scratch, const i8a_span *kv, float *o)
{
    i8a_v4pass_neon(scratch, 1, kv, 128, o);
}

void mca_v4_4_neon(float *scratch, const i8a_span *kv, float *o)
{
    i8a_v4pass_neon(scratch, 4, kv, 128, o);
}

DOTPROD void mca_v4_1_neon_dotprod(float *scratch, const i8a_span *kv, float *o)
{
    i8a_v4pass_neon_dotprod(scratch, 1, kv, 128, o);
}

DOTPROD void mca_v4_4_neon_dotprod(float *scratch, const i8a_span *kv, float *o)
{
    i8a_v4pass_neon_dotprod(scratch, 4, kv, 128, o);
}

void mca_planes(float *w, size_t n, size_t lead, uint8_t *slot)
{
    i8a_planes_neon(w, n, lead, slot, I8A_WPLANES8);
}

float mca_logits(const int32_t *dh, const int32_t *dl, float c_hi, float c_lo, float bias,
                 const float *ks, size_t n, float *p)
{
    return i8a_logits_neon(dh, dl, c_hi, c_lo, 1, bias, 0.0f, 0.0f, ks, n, p);
}

float mca_softmax(float *p, size_t n, float m)
{
    return i8a_softmax_neon(p, n, m);
}
"""

# (pass, wrapper(s) for 1 and 4 query heads, the instruction that marks the loop's work and how
#  many of it an iteration holds (one count, or one per wrapper) (which says what the iteration covers: anything else means the
#  loop changed shape and the conversion below no longer holds), cycles per iteration -> cycles
#  per K/V row for 1 query head per kv head and for 4)
PASSES = {
    "neon": [
        ("K dots", "mca_k_neon", "sadalp", 8,            # 4 rows x 2 planes, 16 dims
         lambda c: c * D / 16 / 4, lambda c: 4 * c * D / 16 / 4),
        ("V sums", ("mca_v1_neon", "mca_v4_neon"), "sadalp", 8,    # 2 tiles (8 tokens) x 2
         lambda c: c * D / 8 / 8, lambda c: 2 * c * D / 4 / 8),    # planes: 1 head x 8 dims,
    ],                                                             # 2 heads x 4 dims
    "neon_dotprod": [
        ("K dots", "mca_k_neon_dotprod", "sdot", 8,
         lambda c: c * D / 16 / 4, lambda c: 4 * c * D / 16 / 4),
        ("V sums", ("mca_v1_neon_dotprod", "mca_v4_neon_dotprod"), "sdot", (64, 32),  # 4 tiles
         lambda c: c * D / 32 / 16, lambda c: c * D / 4 / 16),     # (16 tokens) x 2 planes:
    ],                                                             # 1 head x 32 dims, 4 heads x 4
    # SMMLA: K dots of 8 rows x 16 dims, both planes, per head (1 or 4 heads); V sums of 8 tokens
    # x 16 dims for 1 head, x 8 dims for 4 heads, both planes
    "neon_i8mm": [
        ("K dots", ("mca_k1_neon_i8mm", "mca_k4_neon_i8mm"), "smmla", (8, 32),
         lambda c: c * D / 16 / 8, lambda c: c * D / 16 / 8),
        ("V sums", ("mca_v1_neon_i8mm", "mca_v4_neon_i8mm"), "smmla", (8, 16),
         lambda c: c * D / 16 / 8, lambda c: c * D / 8 / 8),
    ],
    # the sides at 4 bits (KVCache): K dots of 4 rows x 3 planes x 32 channels, and 16 of the
    # wide channels' fifth bits (the loop with 36 dot steps; 24: a group without them); V sums
    # of 3 planes, neon 2 tiles x 16 dims of one head (the same loop for each head), dotprod 4
    # tiles, 1 head x 16 dims or 2 heads x 8 (twice for 4 heads)
    "neon 4-bit": [
        ("K4 dots", "mca_k4_neon", "sadalp", 36,
         lambda c: c * D / 32 / 4, lambda c: 4 * c * D / 32 / 4),
        ("V4 sums", ("mca_v4_1_neon", "mca_v4_4_neon"), "sadalp", 24,
         lambda c: c * D / 16 / 8, lambda c: 4 * c * D / 16 / 8),
    ],
    "neon_dotprod 4-bit": [
        ("K4 dots", "mca_k4_neon_dotprod", "sdot", 36,
         lambda c: c * D / 32 / 4, lambda c: 4 * c * D / 32 / 4),
        ("V4 sums", ("mca_v4_1_neon_dotprod", "mca_v4_4_neon_dotprod"), "sdot", 48,
         lambda c: c * D / 16 / 16, lambda c: 2 * c * D / 8 / 16),
    ],
    "shared": [
        ("P planes", "mca_planes", "frintm", 4,          # 16 weights x 1 floor, per query head
         lambda c: c / 16, lambda c: 4 * c / 16),
        ("logits", "mca_logits", "scvtf", 2,             # 4 tokens, both planes
         lambda c: c / 4, lambda c: 4 * c / 4),
        ("softmax", "mca_softmax", "fmla", 36,           # 16 tokens, 9 per 4-lane exp
         lambda c: c / 16, lambda c: 4 * c / 16),
    ],
}
CPUS = [("A76 (neoverse-n1)", "neoverse-n1",
         ("neon_dotprod", "neon", "neon_dotprod 4-bit", "neon 4-bit")),
        ("A72 (cortex-a72)", "cortex-a72", ("neon", "neon 4-bit")),
        ("N2 (neoverse-n2: i8mm, as Cortex-A710 and Graviton's V cores)", "neoverse-n2",
         ("neon_i8mm", "neon_dotprod"))]
MATTR = {"cortex-a72": "+neon", "neoverse-n1": "+dotprod", "neoverse-n2": "+dotprod,+i8mm"}


def cflags():
    """setup.py's compile flags (the wheel's), read from the file so the two cannot part."""
    text = open(os.path.join(HERE, "..", "setup.py")).read()
    m = re.search(r"else:\s*(?:#[^\n]*\n\s*)*cflags = \[([^\]]*)\]", text)   # the GCC/clang branch
    if not m:
        raise SystemExit("setup.py: no `cflags = [...]` to read the compile flags from")
    return re.findall(r'"([^"]+)"', m.group(1))


def tool(*names):
    for name in names:
        if shutil.which(name):
            return name
    raise SystemExit(f"needs {' or '.join(names)} (Debian: gcc-aarch64-linux-gnu, llvm-19)")


def functions(asm):
    """name -> the lines of each function in GCC's assembly output."""
    out, cur = {}, None
    for line in asm.splitlines():
        m = re.match(r"^([A-Za-z_]\w*):\s*$", line)
        if m:
            cur = out.setdefault(m.group(1), [])
        elif cur is not None:
            if line.startswith("\t.size"):
                cur = None
            else:
                cur.append(line)
    return out


BRANCH = re.compile(r"^(b(?:\.\w+)?|b\w\w|cbn?z|tbn?z)\s+(.*)$")


def innermost_loops(lines):
    """The function's innermost loops as lists of source lines (labels kept): a backward branch
    and its target bound a loop; it is innermost when no other backward branch inside it jumps
    to a target inside it."""
    items, labels = [], {}
    for line in lines:
        s = line.strip()
        m = re.match(r"^(\.L\w+):", s)
        if m:
            labels[m.group(1)] = len(items)
            items.append(s)
        elif s and not s.startswith((".", "//", "#")):
            items.append(s)
    back = []
    for i, s in enumerate(items):
        m = BRANCH.match(s)
        if m:
            target = m.group(2).split(",")[-1].strip()
            if target in labels and labels[target] <= i:
                back.append((labels[target], i))
    inner = [(a, b) for a, b in back
             if not any(a <= a2 and b2 < b and (a2, b2) != (a, b) for a2, b2 in back)]
    return [items[a:b + 1] for a, b in inner]


def count(loop, mnemonic):
    return sum(1 for s in loop if s.split()[0] == mnemonic)


def mca(llvm_mca, cpu, loop, keep=None):
    """llvm-mca's steady-state cycles per iteration of the loop's instructions."""
    defined = {s[:-1] for s in loop if s.endswith(":")}
    used = set(re.findall(r"\.L\w+", " ".join(s for s in loop if not s.endswith(":"))))
    text = "\n".join(loop + [f"{name}:" for name in sorted(used - defined)]) + "\n"
    if keep:
        with open(keep, "w") as f:
            f.write(text)
    r = subprocess.run([llvm_mca, "-mtriple=aarch64-linux-gnu", f"-mcpu={cpu}",
                        f"-mattr={MATTR[cpu]}",
                        "-iterations=200"], input=text, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llvm-mca failed on {cpu}:\n{r.stderr}")
    total = int(re.search(r"Total Cycles:\s+(\d+)", r.stdout).group(1))
    iters = int(re.search(r"Iterations:\s+(\d+)", r.stdout).group(1))
    return total / iters


def the_loop(fns, name, marker, expect):
    """The innermost loop of wrapper `name` with the most `marker` instructions; it must hold
    `expect` of them."""
    loops = innermost_loops(fns[name])
    best = max(loops, key=lambda lp: count(lp, marker), default=None)
    got = count(best, marker) if best else 0
    if got != expect:
        raise SystemExit(f"{name}: its main loop holds {got} {marker}, expected {expect}: the "
                         "kernel's loop changed shape; update PASSES in this script")
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cc", default=None, help="aarch64 C compiler (aarch64-linux-gnu-gcc)")
    ap.add_argument("--asm", metavar="DIR", help="keep each analysed loop's assembly here")
    args = ap.parse_args(argv)
    cc = args.cc or tool("aarch64-linux-gnu-gcc")
    llvm_mca = tool("llvm-mca-19", "llvm-mca")
    with tempfile.TemporaryDirectory() as tmp:
        c = os.path.join(tmp, "wrappers.c")
        with open(c, "w") as f:
            f.write(WRAPPERS)
        s = os.path.join(tmp, "wrappers.s")
        subprocess.run([cc, *cflags(), "-I", SRC, "-S", c, "-o", s], check=True)
        fns = functions(open(s).read())
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    mca_version = subprocess.run([llvm_mca, "--version"], capture_output=True,
                                 text=True).stdout.strip().split("\n")
    print(f"{version}; {next((v.strip() for v in mca_version if 'version' in v), llvm_mca)}")
    print(f"flags: {' '.join(cflags())}; cycles per K/V row of D = {D}, loops in L1, steady state")
    if args.asm:
        os.makedirs(args.asm, exist_ok=True)
    for label, cpu, tiers in CPUS:
        print(f"\n{label}")
        print(f"  {'tier':<13} {'pass':<9} {'cycles/iter':>12} {'H = Hkv':>9} {'GQA 4':>9}")
        for tier in tiers:
            total_one = total_four = 0.0
            for name, fn, marker, expect, one, four in PASSES[tier] + PASSES["shared"]:
                fn1, fn4 = fn if isinstance(fn, tuple) else (fn, fn)
                expects = expect if isinstance(expect, tuple) else (expect, expect)
                cycles = []
                for f, want in zip((fn1, fn4), expects):
                    keep = os.path.join(args.asm, f"{cpu}-{f}.s") if args.asm else None
                    cycles.append(mca(llvm_mca, cpu, the_loop(fns, f, marker, want), keep))
                row = (one(cycles[0]), four(cycles[1]))
                total_one, total_four = total_one + row[0], total_four + row[1]
                per_iter = (f"{cycles[0]:.1f}" if fn1 == fn4
                            else f"{cycles[0]:.1f} / {cycles[1]:.1f}")
                print(f"  {tier:<13} {name:<9} {per_iter:>12} {row[0]:>9.1f} {row[1]:>9.1f}")
            print(f"  {tier:<13} {'total':<9} {'':>12} {total_one:>9.1f} {total_four:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
