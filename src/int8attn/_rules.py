"""The cache format's cross-field rules, each stated once: which combinations of the format's
options (k_bits, v_bits, rotate, rotation_seed, keep_first, center, recent) and head_dim a cache
can have, and the counts that follow from them (the ring's slots, evict's step).

Each rule is a small pure function whose docstring gives the rule and why it holds; the checks
raise ValueError naming the option, the expected and the actual value. Three callers state the
options, and a rule names them as its caller does (``Source``): the constructor of KVCache and
Int8KVCache (``_args.constructor``: the arguments, ``ARGS``), the loader of a state dict or file
(``_state.check``: its fields, ``STATE``) and ``int8attn.hf`` (a named format at some widths,
``named_format(kv_format)``). ``resolve`` checks a complete set of options in the constructor's
order; the loader calls the single rules between its checks of the arrays, in its own order.

The C engine keeps its own preconditions on the same rules (``engine/``): these are the ones
the Python side checks first, with messages that name the argument.
"""

from typing import NamedTuple

from . import _format as F


class Source(NamedTuple):
    """Who states the options a rule checks, for its message: a constructor's arguments
    (``ARGS``), a state dict's fields (``STATE``: "state recent ...", and what int8attn never
    writes), or a named format of int8attn.hf (``named_format``: the messages name kv_format)."""
    state: bool = False
    kv_format: str | None = None

    @property
    def prefix(self):
        return "state " if self.state else ""


ARGS = Source()
STATE = Source(state=True)


def named_format(kv_format):
    """The Source of int8attn.hf's options: the format `kv_format` at some k_bits, v_bits."""
    return Source(kv_format=kv_format)


class Format(NamedTuple):
    """A complete set of format options, checked (what ``resolve`` returns)."""
    k_bits: int
    v_bits: int
    rotate: bool
    rotation_seed: int
    keep_first: bool
    center: bool
    recent: int


# -- head_dim and the widths --------------------------------------------------------------

def check_head_dim(head_dim, src=ARGS):
    """head_dim (at least 1) is a multiple of 16 and at most MAX_HEAD_DIM: the kernels take a
    row 16 values at a time, and the engine's row buffers (on the stack) hold MAX_HEAD_DIM."""
    if head_dim % 16 != 0 or head_dim > F.MAX_HEAD_DIM:
        raise ValueError(f"{src.prefix}head_dim must be a multiple of 16 and at most "
                         f"{F.MAX_HEAD_DIM}, got {head_dim}")


def check_bits(bits, name, src=ARGS):
    """k_bits and v_bits (`name`) are each one of BITS (8 or 4): the widths the engine
    codes. Returns `bits`."""
    if bits not in F.BITS:
        raise ValueError(f"{src.prefix}{name} must be one of {', '.join(map(str, F.BITS))}, "
                         f"got {bits!r}")
    return bits


def has_four_bit_side(k_bits, v_bits):
    """Whether a side is at 4 bits (k_bits and v_bits each 8 or 4: not both 8)."""
    return (k_bits, v_bits) != (8, 8)


def check_head_dim_at_4_bits(head_dim, k_bits, v_bits, src=ARGS):
    """With a side at 4 bits, head_dim is a multiple of NIB_BLOCK: its codes are packed two a
    byte in blocks of NIB_BLOCK elements (element i in the low half of byte i, i + 16 in the
    high half), so a row is whole blocks."""
    if has_four_bit_side(k_bits, v_bits) and head_dim % F.NIB_BLOCK:
        why = "" if src.state else f" (its codes pack in blocks of {F.NIB_BLOCK})"
        raise ValueError(f"{src.prefix}head_dim must be a multiple of {F.NIB_BLOCK} with a side "
                         f"at 4 bits{why}, got {head_dim}")


# -- the recent window ----------------------------------------------------------------------

def check_recent(recent, k_bits, src=ARGS):
    """recent is from 0 to RECENT_MAX (a decode keeps the window's logits on the stack); with K at
    4 bits, at least K4_GROUP: K's ranges are per channel over groups of K4_GROUP positions, and
    a group's positions are read from the window's floats until the group is complete and
    coded, so the window must hold a whole group."""
    if not 0 <= recent <= F.RECENT_MAX:
        raise ValueError(f"{src.prefix}recent must be from 0 to {F.RECENT_MAX}, got {recent}")
    if k_bits == 4 and recent < F.K4_GROUP:
        if src.kv_format is not None:
            raise ValueError(f"k_bits=4 needs a format with a recent window of at least "
                             f"{F.K4_GROUP} tokens; kv_format={src.kv_format!r} has "
                             f"recent={recent}")
        why = "" if src.state else (f" (K's groups of {F.K4_GROUP} positions are read from the "
                                    f"window until complete)")
        raise ValueError(f"{src.prefix}recent must be at least {F.K4_GROUP} with k_bits=4{why}, "
                         f"got {recent}")


def ring_slots(recent, max_seq):
    """The slots of the recent window's ring: min(2 * recent, max_seq). It holds the last
    recent positions and as many again, what truncate can take back exactly; never more
    than the cache holds. (The engine's store layout sizes the ring by the same rule; the
    loader checks a state's window against this.)"""
    return min(2 * recent, max_seq)


def decode_queries_max(recent, max_seq, length):
    """The most queries a decode (of the last T positions) takes: each query reads the recent
    window of its own position from the ring, which holds the last ring_slots positions, so the
    first query's window (R - 1 positions before the T) is held for T <= R + 1, or for any T
    while the cache holds no more positions than the ring. Longer chunks go through prefill,
    which keeps the windows of the rows it appends. No limit without a window."""
    slots = ring_slots(recent, max_seq)
    if not recent or length <= slots:
        return length
    return min(length, slots - recent + 1)


def check_decode_queries(t, recent, max_seq, length, where=""):
    """T queries fit decode_queries_max (where: "caches[b] " in a batch)."""
    most = decode_queries_max(recent, max_seq, length)
    if t > most:
        raise ValueError(
            f"q holds T={t} query positions, but {where}a cache with recent={recent} holds the "
            f"floats of its last {ring_slots(recent, max_seq)} positions only, so a decode "
            f"reads each query's recent window as token-by-token decoding did for T <= {most}; "
            f"append and attend a longer chunk in one call with prefill(k, v, q)")


# -- the paged pool --------------------------------------------------------------------------

def check_block_size(block_size):
    """A paged pool's block holds a power of two of positions from 16 to 256: a whole number
    of V's tiles of 4, at most one softmax chunk, and a block's row found by a shift."""
    if block_size not in F.BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {', '.join(map(str, F.BLOCK_SIZES))}, "
                         f"got {block_size}")


# -- the rotation ---------------------------------------------------------------------------

def seed_in_range(seed):
    """rotation_seed is from 0 to 2**64 - 1: the signs are drawn from it as a uint64."""
    return 0 <= seed < 1 << 64


def check_seed(seed, src=ARGS):
    """seed_in_range(seed), or ValueError."""
    if not seed_in_range(seed):
        raise ValueError(f"{src.prefix}rotation_seed must be from 0 to 2**64 - 1, got {seed}")


def rotation_block(head_dim):
    """The rotation's block for head_dim: its largest power-of-two divisor (the Hadamard
    transform is of power-of-two size; a row is rotated in blocks of it)."""
    return head_dim & -head_dim


# -- the kept first position and the offsets ------------------------------------------------

def default_center(keep_first, k_bits, v_bits):
    """center's default (None): centered when it can be, with keep_first and both sides at 8
    bits (the rules of check_center)."""
    return keep_first and not has_four_bit_side(k_bits, v_bits)


def check_center(keep_first, center, k_bits, v_bits, src=ARGS):
    """center needs keep_first: the offsets come from the rows past position 0 (their mean), and
    position 0 is kept as floats instead (often far from the others: an attention sink). And
    center needs both sides at 8 bits: a side at 4 bits stores its own minima (per group of K,
    per row of V), which take the offsets' place."""
    if center and not keep_first:
        raise ValueError("state has center without keep_first, which int8attn never writes"
                         if src.state else
                         "center=True needs keep_first=True: the offsets come from the rows "
                         "past position 0, so position 0 is kept as floats")
    if center and has_four_bit_side(k_bits, v_bits):
        raise ValueError("state has center with a side at 4 bits, which int8attn never writes"
                         if src.state else
                         "center=True needs k_bits=8 and v_bits=8: a side at 4 bits keeps its "
                         "own minima instead of offsets")


# -- evict -----------------------------------------------------------------------------------

def evict_step(k_bits):
    """What evict's count must be a multiple of, when it leaves some tokens: K4_GROUP with K at
    4 bits (K's groups of positions share their ranges, so a group leaves whole), else 1."""
    return F.K4_GROUP if k_bits == 4 else 1


def check_evict(n, length, k_bits):
    """n (the tokens evict forgets, of the cache's `length`) is a multiple of
    evict_step(k_bits), or all of them: forgetting everything leaves no group in part."""
    if n % evict_step(k_bits) and n != length:
        raise ValueError(f"n must be a multiple of {F.K4_GROUP} with k_bits=4 (K's groups of "
                         f"{F.K4_GROUP} positions stay whole), or len(cache)={length}, got {n}")


# -- all of them ----------------------------------------------------------------------------

def resolve(option, head_dim=None, src=ARGS):
    """The format options, complete and checked: a Format, or the first rule's ValueError.

    option(name) gives the option `name` ("k_bits", "v_bits", "rotate", "keep_first",
    "center", "recent", "rotation_seed") as the caller has it, converted (the constructor's
    conversions raise TypeError naming the argument); center may be None, for its default. Each
    is asked for once, in this order, with the checks between: a call with several faults
    raises for the first of them. head_dim None (int8attn.hf, before the model's is known)
    skips the rules on head_dim."""
    if head_dim is not None:
        check_head_dim(head_dim, src)
    k_bits = check_bits(option("k_bits"), "k_bits", src)
    v_bits = check_bits(option("v_bits"), "v_bits", src)
    if head_dim is not None:
        check_head_dim_at_4_bits(head_dim, k_bits, v_bits, src)
    rotate = option("rotate")
    keep_first = option("keep_first")
    center = option("center")
    if center is None:
        center = default_center(keep_first, k_bits, v_bits)
    recent = option("recent")
    check_recent(recent, k_bits, src)
    seed = option("rotation_seed")
    check_seed(seed, src)
    check_center(keep_first, center, k_bits, v_bits, src)
    return Format(k_bits, v_bits, rotate, seed, keep_first, center, recent)
