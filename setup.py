"""Build the Cython kernels in ``_ext/`` into private ``rowstore._<name>`` modules.

The kernels link the static ``libblosc2.a`` shipped in the ``blosc2`` wheel (a build
requirement), hiding its symbols, so the built package needs no shared libblosc2 at run time and
cannot clash with the one python-blosc2 or PyTables load.
"""

import os
import sys
from glob import glob

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup


def _blosc2_paths():
    import blosc2

    root = os.path.dirname(blosc2.__file__)
    include = os.path.join(root, "include")
    static = os.path.join(root, "lib", "libblosc2.a")
    if not os.path.exists(os.path.join(include, "blosc2.h")) or not os.path.exists(static):
        sys.exit(f"rowstore: the blosc2 wheel at {root} lacks include/blosc2.h or lib/libblosc2.a")
    return include, static


blosc2_include, blosc2_static = _blosc2_paths()

extensions = [
    Extension(
        "rowstore." + os.path.splitext(os.path.basename(src))[0],
        [src],
        include_dirs=[np.get_include(), blosc2_include, "_ext"],
        extra_compile_args=["-O3", "-fno-strict-aliasing"],
        extra_objects=[blosc2_static],
        extra_link_args=["-Wl,--exclude-libs,ALL", "-lpthread", "-lm", "-ldl"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for src in sorted(glob(os.path.join("_ext", "*.pyx")))
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3", "embedsignature": True},
    ),
)
