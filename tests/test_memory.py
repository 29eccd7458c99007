"""Memory: a GGUF model's weights stay in the file's pages (memory-mapped, used in place), so the
resident memory a load and a generate add is the file size plus a small constant."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("gguf")
from hybrid.models import ModelLoadError, default_model_path  # noqa: E402

try:
    GGUF = default_model_path()
except ModelLoadError as exc:
    pytest.skip(f"the default model is not installed ({exc})", allow_module_level=True)

SLACK = 64 * 2**20  # tokenizer, scratch buffers, the KV cache of a short generate

PROBE = """
import os, sys
import hybrid
import hybrid.models, hybrid.models.gguf_file, hybrid.models.tokenizer
import tokenizers, jinja2  # library code is loaded before the baseline
from hybrid._cpu import attention, elementwise, quant

def rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')

before = rss()
model = hybrid.load_model(sys.argv[1])
loaded = rss()
model.generate(model.tokenizer.encode('Why is the sky blue? ' * 8), 16, stop_tokens=[])
print(loaded - before, rss() - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc/self/statm")
def test_rss_growth_is_the_file_plus_a_constant(tmp_path):
    # run outside the source tree, so the installed package (with its built kernels) is imported
    proc = subprocess.run([sys.executable, "-c", PROBE, GGUF], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split()
    after_load, after_generate = int(out[0]), int(out[1])
    size = os.path.getsize(GGUF)
    assert after_load < SLACK, f"loading alone added {after_load / 2**20:.0f} MiB"
    assert after_generate < size + SLACK, (
        f"RSS grew {after_generate / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file")
