"""Extension build: one compiled module, int8attn._cache (Cython front end + C kernels).

Everything is compiled at the target's baseline. ISA code is switched on per function by the
pragmas inside src/int8attn/_simd/<tier>.h, never by compiler flags, so the module imports on any
CPU of the architecture and the tier is picked at run time.
"""
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

if sys.platform == "win32":
    # MSVC never contracts a * b + c into an FMA under /fp:precise (its default).
    cflags = ["/O2", "/fp:precise"]
    libraries = []
else:
    # -ffp-contract=off: an FMA only where the kernels write one, so every tier rounds alike.
    # -g0: no debug info in what wheels ship. It follows CFLAGS on the command line, so a build
    # with debug info needs -g after it: a compiler wrapper, as .ci/sanitize.sh does.
    cflags = ["-O3", "-g0", "-ffp-contract=off", "-fno-math-errno", "-std=c11"]
    libraries = ["m", "pthread"]

ext = Extension(
    "int8attn._cache",
    sources=[
        "src/int8attn/_cache.pyx",
        "src/int8attn/_engine.c",
        "src/int8attn/_cpu.c",
        "src/int8attn/_pool.c",
        "src/int8attn/_simd/kernels.c",
    ],
    include_dirs=["src/int8attn"],
    extra_compile_args=cflags,
    libraries=libraries,
)

setup(ext_modules=cythonize([ext], language_level=3))
