"""Extension build: one compiled module, int8attn._cache (Cython front end + C kernels).

Everything is compiled at the target's baseline. ISA code is switched on per function by the
pragmas inside src/int8attn/_simd/<tier>.h, never by compiler flags, so the module imports on any
CPU of the architecture and the tier is picked at run time.
"""
import pathlib
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
    libraries = ["m", "pthread"] + (["dl"] if sys.platform.startswith("linux") else [])

# The C sources: one list, which the C cross-check in .ci/ reads too.
here = pathlib.Path(__file__).parent
c_sources = [line.strip() for line in (here / "src/int8attn/csources.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]

ext = Extension(
    "int8attn._cache",
    sources=["src/int8attn/_cache.pyx", *c_sources],
    include_dirs=["src/int8attn"],
    extra_compile_args=cflags,
    libraries=libraries,
)

setup(ext_modules=cythonize([ext], language_level=3))
