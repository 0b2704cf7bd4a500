"""``python -m int8attn kernels-layout OUT``: int8attn in the layout the Hugging Face ``kernels``
library (>= 0.17) loads, for the machine this runs on.

    OUT/build/torch-universal/
        metadata.json       id, name, version, license, python-depends, backend {"type": "cpu"}
        __init__.py         re-exports the package below
        cpu_attn/           this installed int8attn (its compiled module included): the folder
                            older loaders import when the variant has no __init__.py

``torch-universal`` is the variant every kernels install accepts without torch (it is also the
one a machine with CUDA libraries but no torch still picks). Load it with
``kernels.get_local_kernel(OUT)``, or make the original kernel's own call resolve here with
``LOCAL_KERNELS="phanerozoic/cpu-attn=OUT"`` and
``get_kernel("phanerozoic/cpu-attn", version=1, trust_remote_code=True)``.
"""

import json
import os
import platform
import re
import shutil

from . import __version__, supported_isas

VARIANT = "torch-universal"


def write_layout(out, name="cpu-attn", version=1):
    """Write the layout under `out` (created; an existing variant folder is replaced).
    Returns the variant folder."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        raise ValueError(f"name must be lowercase letters, digits and '-', got {name!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"version must be a positive int, got {version!r}")
    python_name = name.replace("-", "_")
    variant = os.path.join(os.path.abspath(out), "build", VARIANT)
    if os.path.exists(variant):
        shutil.rmtree(variant)
    package = os.path.dirname(os.path.abspath(__file__))
    target = os.path.join(variant, python_name)
    os.makedirs(target)
    for entry in sorted(os.listdir(package)):     # the installed package: modules, stub, binary
        if entry.endswith((".py", ".pyi", ".so", ".pyd")) or entry == "py.typed":
            shutil.copy2(os.path.join(package, entry), target)
    metadata = {
        "id": f"_{python_name}_int8attn_{__version__.replace('.', '_')}_{platform.machine().lower()}",
        "name": name,
        "version": version,
        "license": "Apache-2.0",
        "python-depends": [],       # numpy is required, but kernels rejects it here
        "backend": {"type": "cpu"},
    }
    with open(os.path.join(variant, "metadata.json"), "w") as f:
        json.dump(metadata, f, indent=2)
    with open(os.path.join(variant, "__init__.py"), "w") as f:
        f.write(f'"""int8attn {__version__} for {platform.machine()} '
                f'(tiers: {", ".join(supported_isas())}), as the {name} kernel."""\n\n'
                f"from .{python_name} import *  # noqa: F401,F403\n"
                f"from .{python_name} import __all__, __version__  # noqa: F401\n")
    return variant
