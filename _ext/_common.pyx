# cython: language_level=3
"""``KernelCode``, the kernels' error codes, as a Python enum (declared in ``_common.pxd``,
which every kernel module cimports): ``rowstore/kernels.py`` imports it from here."""

# Cython names the class after the module it was compiled as ("_common"); pickles (a KernelError
# sent from a DataLoader worker) must name the module it is imported as.
KernelCode.__module__ = __name__
