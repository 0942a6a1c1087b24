"""Bins: input shards packed together so that published files follow the file target, not the
number of input shards.

A bitext of 50M pairs may come as 50 shards of 1M or as 2,500 of 20k. Compacting each input
shard's rows on its own (per output partition) would give 2,500 x partitions small files in the
second case. So input shards are packed, in name order, into bins of at least ``capacity``
records (the file target's rows times the number of output partitions: about one full file per
partition), and compaction writes one series of files per (bin, partition). A shard larger than
the capacity is a bin of its own; only the last bin of a packing is under the capacity.

A refresh keeps a previous bin's files when every shard in it is unchanged and the bin is full;
the unchanged shards of any other previous bin (one of its shards changed or went away, or it is
the under-full last bin) are *carried*: their rows are copied out of the old files, filtered by
``input_shard``, never decoded again, and packed again with the new and changed shards
(paracorpus/incremental.py). So a refresh rewrites at most the bins it touches plus one
under-full bin, and the number of under-full bins stays at one.
"""
from __future__ import annotations

import hashlib


def bin_capacity(file_rows: int, partitions: int) -> int:
    """Records a bin is filled to: about FILE_ROWS rows in each of the PARTITIONS output partitions."""
    return max(1, file_rows) * max(1, partitions)


def bin_id(members) -> str:
    """A file-name-safe id of the bin holding MEMBERS (input shard names may be long or odd)."""
    return "b" + hashlib.sha1("\0".join(sorted(members)).encode()).hexdigest()[:12]


def pack(sizes: dict[str, int], capacity: int) -> dict[str, str]:
    """{shard: bin id}: the shards of SIZES (name -> records) in name order, a bin closed once it
    holds CAPACITY records or more."""
    bins, current, filled = [], [], 0
    for name in sorted(sizes):
        current.append(name)
        filled += max(0, sizes[name])
        if filled >= capacity:
            bins.append(current)
            current, filled = [], 0
    if current:
        bins.append(current)
    return {name: bin_id(members) for members in bins for name in members}


def is_full(sizes: list[int], capacity: int) -> bool:
    """True when a bin of shards of SIZES records is at its capacity (a refresh keeps its files)."""
    return sum(sizes) >= capacity
