"""The benchmarks' helpers that decide what a run measures."""
from int8attn import _bench


def test_the_last_level_cache_is_read_past_other_files(tmp_path):
    """sysfs's cache folder holds index0 .. indexN and a uevent file: the size is the largest
    index's (a file without a size once made the whole read fall back to 32 MiB, so "cold"
    round robins of 256 MiB fit a 480 MiB L3)."""
    for name, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "491520K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "size").write_text(size + "\n")
    (tmp_path / "uevent").write_text("")
    (tmp_path / "index9").mkdir()                      # no size: skipped
    assert _bench.llc_bytes(str(tmp_path)) == 491520 << 10
    assert _bench.llc_bytes(str(tmp_path / "absent")) == 32 << 20
