"""Read-only file mappings for weights, advised for transparent huge pages.

Decoding reads every weight once per token.  Mapped in 4 KiB pages, a 1 GB file needs 262,144
page-table entries per token and a TLB miss every 4 KiB; advised with MADV_HUGEPAGE, pages the
kernel reads from disk come in 2 MiB folios mapped by one entry each (where the kernel and file
system support it; elsewhere the advice is ignored).  Pages already cached in small folios stay
small.  The file is read whole in 2 MiB pieces, so a mixture of experts' unused experts become
resident too: ``huge_pages=False`` keeps 4 KiB pages.
"""

from __future__ import annotations

import mmap
import os

import numpy as np


def map_file(path: str, offset: int = 0, size: "int | None" = None, *,
             huge_pages: bool = True) -> np.ndarray:
    """Bytes ``offset .. offset + size`` of ``path`` (to its end when size is None) as a
    read-only uint8 array over a shared read-only mapping, advised for huge pages unless
    ``huge_pages=False``.  The array keeps the mapping alive."""
    with open(path, "rb") as f:
        length = os.fstat(f.fileno()).st_size
        if size is None:
            size = length - offset
        if offset < 0 or size < 0 or offset + size > length:
            raise ValueError(f"{path}: bytes {offset}..{offset + size} lie outside its "
                             f"{length} bytes")
        if size == 0:  # mmap refuses an empty mapping
            empty = np.zeros(0, dtype=np.uint8)
            empty.flags.writeable = False
            return empty
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        m = mmap.mmap(f.fileno(), offset + size - start, access=mmap.ACCESS_READ, offset=start)
    if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: 4 KiB pages
            pass
    return np.frombuffer(m, dtype=np.uint8, count=size, offset=offset - start)
