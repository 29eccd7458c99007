"""Tools that are run, not imported by the library: ``python -m hybrid.tools.gpucheck`` checks
every GPU path against the CPU and times paged attention on a machine with an NVIDIA GPU."""
