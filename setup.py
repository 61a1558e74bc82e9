"""Build the Cython kernels in ``_ext/`` into private ``rowstore._<name>`` modules.

Only ``_frame`` (everything that needs c-blosc2) links the static ``libblosc2.a`` shipped in the
``blosc2`` wheel (a build requirement), hiding its symbols, so the built package needs no shared
libblosc2 at run time and cannot clash with the one python-blosc2 or PyTables load. The other
modules need libc only. ``_ext/*.pxd`` hold the shared C declarations (see docs/kernels.md).
"""

import os
import sys
from glob import glob

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

#: The modules that link libblosc2 (_png and _io: for the zlib-ng inside it).
BLOSC2_MODULES = {"_frame", "_io", "_png"}


def _blosc2_paths():
    import blosc2

    root = os.path.dirname(blosc2.__file__)
    include = os.path.join(root, "include")
    static = os.path.join(root, "lib", "libblosc2.a")
    if not os.path.exists(os.path.join(include, "blosc2.h")) or not os.path.exists(static):
        sys.exit(f"rowstore: the blosc2 wheel at {root} lacks include/blosc2.h or lib/libblosc2.a")
    return include, static


def _extension(src: str) -> Extension:
    name = os.path.splitext(os.path.basename(src))[0]
    include_dirs = [np.get_include(), "_ext"]
    extra_objects: list[str] = []
    libs: list[str] = []
    if name in BLOSC2_MODULES:
        blosc2_include, blosc2_static = _blosc2_paths()
        include_dirs.append(blosc2_include)
        extra_objects.append(blosc2_static)
        libs = ["-lpthread", "-lm", "-ldl"]
    return Extension(
        name,
        [src],
        include_dirs=include_dirs,
        extra_compile_args=["-O3", "-fno-strict-aliasing"],
        extra_objects=extra_objects,
        extra_link_args=["-Wl,--exclude-libs,ALL", *libs],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


# Cythonized under their own names, so that each module finds its _ext/<name>.pxd (the name a
# cimport uses), then installed as private modules of the package.
extensions = cythonize(
    [_extension(src) for src in sorted(glob(os.path.join("_ext", "*.pyx")))],
    compiler_directives={"language_level": "3", "embedsignature": True},
)
for ext in extensions:
    ext.name = "rowstore." + ext.name

setup(ext_modules=extensions)
