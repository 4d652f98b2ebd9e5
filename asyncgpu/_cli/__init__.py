"""The ``asyncgpu`` command line."""
