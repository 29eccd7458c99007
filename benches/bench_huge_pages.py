"""Decode from a weight file read cold, mapped in 2 MiB pages against 4 KiB pages
(hybrid.models.mapping), 2 threads.

Two copies of one file (the Llama-3.2-1B-shaped model at Q4_K_M by llama.cpp's own quantizer,
or SmolLM2's float32 weights when llama-cpp-python is not installed) are dropped from the page
cache, then one is loaded with ``huge_pages=True`` and the other with ``huge_pages=False``, and
the two decode in alternating rounds in one process (64 greedy tokens after a 32-token prompt).
Reported: each side's tokens/s and share of the read bandwidth (every byte of these tied-
embedding files is read once per token), the ratio, and how much of each file the kernel mapped
in 2 MiB pages (FilePmdMapped in /proc/self/smaps).
"""

import os
import re
import shutil

import numpy as np
import pytest

import hybrid
import gguf_models
from conftest import RESULTS, record_ratio, record_rate

PROMPT, NEW, ROUNDS = 32, 64, 10


@pytest.fixture(scope="module")
def two_copies(tmp_path_factory):
    from hybrid.models import ModelLoadError, default_model_path

    folder = str(tmp_path_factory.mktemp("huge"))
    try:
        try:
            import llama_cpp  # noqa: F401
            path, what = gguf_models.peer_files(folder, ["llama1b-shaped Q4_K_M"])[
                "llama1b-shaped Q4_K_M"], "Llama-3.2-1B-shaped Q4_K_M"
        except ImportError:
            path = gguf_models.float32_gguf(default_model_path(), os.path.join(folder, "f32.gguf"))
            what = "SmolLM2-135M float32"
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    copy = os.path.join(folder, "copy.gguf")
    shutil.copyfile(path, copy)
    return path, copy, what


def _drop_from_page_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # written pages are dirty until written back, and dirty pages stay
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _pmd_mapped(path) -> int:
    """Bytes of ``path``'s mappings in this process that the kernel maps in 2 MiB pages."""
    total, current = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", parts[0]):  # a mapping's first line
                current = parts[5] if len(parts) >= 6 else None
            elif line.startswith("FilePmdMapped:") and current == path:
                total += int(parts[1]) * 1024
    return total


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
def test_decode_from_a_cold_file_in_huge_pages(benchmark, two_copies, read_bandwidth):
    huge_path, small_path, what = two_copies
    for p in (huge_path, small_path):
        _drop_from_page_cache(p)
    models = {"2 MiB pages": hybrid.load_model(huge_path, huge_pages=True),
              "4 KiB pages": hybrid.load_model(small_path, huge_pages=False)}
    prompt = [int(t) for t in np.random.default_rng(1).integers(100, 20000, PROMPT)]
    for m in models.values():
        m.generate(prompt, 8, stop_tokens=[])  # every weight read once from disk

    def decode(m):
        m.generate(prompt, NEW, stop_tokens=[])
        return (m.last_stats.decode_tps,)

    runners = [lambda m=m: decode(m) for m in models.values()]
    best = dict(zip(models, (b[0] for b in gguf_models.alternating(runners, ROUNDS))))
    benchmark.pedantic(lambda: None, rounds=1)
    size = os.path.getsize(huge_path)
    for (name, tps), path in zip(best.items(), (huge_path, small_path)):
        record_rate("huge pages", f"{what} decode, cold file, {name}", tps, read_bandwidth,
                    f"{size * tps / read_bandwidth:.0%} of read bw; "
                    f"{_pmd_mapped(path) / size:.0%} of the file in 2 MiB pages")
    record_ratio("huge pages", f"{what} decode, 2 MiB against 4 KiB pages",
                 best["2 MiB pages"], best["4 KiB pages"])
    RESULTS.append(("huge pages", f"{what} file size", size / 2**20, "MiB", ""))
