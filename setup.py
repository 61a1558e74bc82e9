"""Build the Cython kernels in ``_ext/`` into private ``rowstore._<name>`` modules.

Only ``_frame`` (everything that needs c-blosc2) links the static ``libblosc2.a`` shipped in the
``blosc2`` wheel (a build requirement), hiding its symbols, so the built package needs no shared
libblosc2 at run time and cannot clash with the one python-blosc2 or PyTables load. ``_jpeg``
(the JPEG batch kernel) needs libjpeg-turbo's ``jpeglib.h`` (Debian ``libjpeg62-turbo-dev``)
and links its shared ``libjpeg.so.62`` (Debian's ``libjpeg.a`` is not position-independent);
without the header
it is not built and the reader decodes JPEG through imagecodecs. ``_audio`` (FLAC/WAV) links
Debian ``libflac-dev``'s shared ``libFLAC``; without ``FLAC/stream_decoder.h`` it is not built
and the audio codecs decode through soundfile. The other modules need libc
only. ``_ext/*.pxd`` hold the shared C declarations (see docs/kernels.md).
"""

import os
import sys
import sysconfig
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


def _libjpeg() -> tuple[list[str], list[str], list[str]] | None:
    """(include dirs, extra objects, link args) of libjpeg-turbo, or None without jpeglib.h.
    ``ROWSTORE_LIBJPEG=0`` builds without the kernel (the fallback's tests)."""
    if os.environ.get("ROWSTORE_LIBJPEG", "1") == "0":
        return None
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    roots = [os.environ.get("ROWSTORE_LIBJPEG_PREFIX", ""), "/usr/local", "/usr"]
    for root in filter(None, roots):
        include = os.path.join(root, "include")
        if not os.path.exists(os.path.join(include, "jpeglib.h")):
            continue
        includes = [include] + [os.path.join(include, multiarch)] * bool(multiarch)
        libdirs = [os.path.join(root, "lib", multiarch), os.path.join(root, "lib")]
        return includes, [], [f"-L{d}" for d in libdirs if os.path.isdir(d)] + ["-ljpeg"]
    return None


def _libflac() -> list[str] | None:
    """Link args of libFLAC, or None without ``FLAC/stream_decoder.h`` (Debian ``libflac-dev``).
    ``ROWSTORE_LIBFLAC=0`` builds without the kernel (the soundfile fallback's tests)."""
    if os.environ.get("ROWSTORE_LIBFLAC", "1") == "0":
        return None
    for root in ("/usr/local", "/usr"):
        if os.path.exists(os.path.join(root, "include", "FLAC", "stream_decoder.h")):
            return ["-lFLAC"]
    return None


def _extension(src: str) -> Extension | None:
    name = os.path.splitext(os.path.basename(src))[0]
    include_dirs = [np.get_include(), "_ext"]
    extra_objects: list[str] = []
    libs: list[str] = []
    if name in BLOSC2_MODULES:
        blosc2_include, blosc2_static = _blosc2_paths()
        include_dirs.append(blosc2_include)
        extra_objects.append(blosc2_static)
        libs = ["-lpthread", "-lm", "-ldl"]
    if name == "_jpeg":
        jpeg = _libjpeg()
        if jpeg is None:
            print("rowstore: no jpeglib.h (libjpeg62-turbo-dev): _jpeg not built", file=sys.stderr)
            return None
        include_dirs += jpeg[0]
        extra_objects += jpeg[1]
        libs = [*jpeg[2], "-lm"]
    if name == "_audio":
        flac = _libflac()
        if flac is None:
            print(
                "rowstore: no FLAC/stream_decoder.h (libflac-dev): _audio not built",
                file=sys.stderr,
            )
            return None
        libs = [*flac, "-lm"]
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
    [
        ext
        for ext in map(_extension, sorted(glob(os.path.join("_ext", "*.pyx"))))
        if ext is not None
    ],
    compiler_directives={"language_level": "3", "embedsignature": True},
)
for ext in extensions:
    ext.name = "rowstore." + ext.name

setup(ext_modules=extensions)
