"""Weight files mapped read-only (hybrid.models.mapping): the bytes asked for, nothing writable,
and the mapping advised for transparent huge pages unless the caller says no."""

import mmap
import re
import sys

import numpy as np
import pytest

from hybrid.models import ModelLoadError, default_model_path, read_weights
from hybrid.models.mapping import map_file


def _huge_page_advice_works() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            setting = f.read()
    except OSError:
        return False
    return sys.platform == "linux" and hasattr(mmap, "MADV_HUGEPAGE") and "[never]" not in setting


needs_thp = pytest.mark.skipif(not _huge_page_advice_works(),
                               reason="no transparent huge pages on this kernel")


def _vm_flags(address: int) -> set:
    """The VmFlags of the mapping in /proc/self/smaps that holds ``address``."""
    span = None
    with open("/proc/self/smaps") as f:
        for line in f:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                span = (int(m.group(1), 16), int(m.group(2), 16))
            elif line.startswith("VmFlags:") and span[0] <= address < span[1]:
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def _address(a) -> int:
    return np.asarray(a).__array_interface__["data"][0]


def test_the_bytes_asked_for_read_only(tmp_path, rng):
    raw = rng.integers(0, 256, 3 * mmap.ALLOCATIONGRANULARITY + 123, dtype=np.uint8)
    path = tmp_path / "w.bin"
    raw.tofile(path)
    for offset, size in ((0, None), (1, 5), (mmap.ALLOCATIONGRANULARITY + 7, 1000),
                         (len(raw) - 9, 9), (len(raw), 0)):
        got = map_file(str(path), offset, size)
        want = raw[offset:] if size is None else raw[offset:offset + size]
        assert got.dtype == np.uint8 and np.array_equal(got, want), (offset, size)
        with pytest.raises(ValueError):
            got[:1] = 1
    with pytest.raises(ValueError, match="outside its"):
        map_file(str(path), len(raw) - 2, 3)


@needs_thp
def test_huge_page_advice_unless_declined(tmp_path):
    path = tmp_path / "w.bin"
    np.zeros(4 << 20, np.uint8).tofile(path)
    assert "hg" in _vm_flags(_address(map_file(str(path))))
    assert "hg" not in _vm_flags(_address(map_file(str(path), huge_pages=False)))


@needs_thp
def test_a_loaded_gguf_is_advised_for_huge_pages():
    try:
        path = default_model_path()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    for huge in (True, False):
        mw = read_weights(path, huge_pages=huge)
        flags = _vm_flags(_address(mw.embed.data))
        assert ("hg" in flags) == huge, (huge, flags)
        assert "wr" not in flags


@pytest.mark.parametrize("command", [["generate", "Hi", "--max-tokens", "1"], ["serve"]])
@pytest.mark.parametrize("flag", [[], ["--no-huge-pages"]])
def test_the_cli_passes_its_huge_page_choice_to_the_loader(monkeypatch, command, flag):
    import hybrid.models
    from hybrid.cli import main

    if command[0] == "serve":
        pytest.importorskip("uvicorn")
        pytest.importorskip("fastapi")
    asked = []

    def load_model(path=None, **kw):  # records the choice, then stops the command
        asked.append(kw.get("huge_pages", True))
        raise ModelLoadError("model.gguf", "stopped by the test")
    monkeypatch.setattr(hybrid.models, "load_model", load_model)
    assert main(command + ["--model", "model.gguf"] + flag) == 2
    assert asked == [not flag]
