"""Opening what users hand to rowstore: the one place every surface that reads a user's files
or turns a user's names into paths goes through, so that each inherits the same guarantees.

* **Regular files only.** :func:`open_input` (and the dataset opener's :func:`open_regular`)
  opens with ``O_NONBLOCK`` and checks ``fstat`` before anything is read: a FIFO, device,
  socket or directory where a file belongs is refused, naming what it is, never an ``open``
  or a read that waits forever.
* **Sizes bounded before reading.** ``max_bytes`` is checked against ``fstat`` before the
  first byte is read, and :func:`read_input` never reads past it (a file that grows while it
  is read is refused, not read on).
* **Names contained in their root.** :func:`contained` takes a name that becomes a path (a
  split name, an image path from a CSV, a shard name) and refuses an empty or absolute name,
  a ``..`` component or a NUL and, unless ``follow_links=True``, a name whose symlinks
  resolve outside the root. :func:`walk` lists a directory tree's files under the same rule
  (links that stay inside the tree are followed); :func:`outside` checks many names at once.

Refusals are :class:`~rowstore.errors.InputError` (a ``ValueError``) and its
:class:`~rowstore.errors.OutsideRootError`, naming the file or name and what was expected;
the dataset opener's :func:`open_regular` keeps :class:`~rowstore.errors.FormatError`. A
missing file and the system's other refusals stay ``OSError`` with their errno.

Everything here is plain system calls: thread-safe, no state kept between calls.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence

from rowstore.errors import FormatError, InputError, OutsideRootError

__all__ = [
    "open_regular",
    "open_input",
    "read_input",
    "read_text",
    "read_at",
    "contained",
    "name_problem",
    "outside",
    "walk",
]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
_READ_STEP = 1 << 24  # bytes per read() of read_input


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open(
    path: str, refuse: Callable[[os.stat_result], Exception | None]
) -> tuple[int, os.stat_result]:
    """``(descriptor, fstat)`` of ``path`` opened read-only without blocking (a FIFO's open
    waits for a writer otherwise), made blocking once ``refuse(fstat)`` found nothing wrong
    (else its error is raised and the descriptor closed)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        exc = refuse(st)
        if exc is not None:
            raise exc
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file ``path`` and its ``fstat``: the dataset
    opener's (rowstore files, shards, manifests).

    Opened with ``O_NONBLOCK`` (cleared once the file is known to be regular), so that a FIFO,
    device or socket put where a file belongs is a :class:`FormatError` naming what it is,
    never a read that waits forever. ``FileNotFoundError`` and the system's other refusals
    propagate.
    """

    def refuse(st: os.stat_result) -> Exception | None:
        if stat.S_ISREG(st.st_mode):
            return None
        return FormatError(
            f"{path!r} is {_kind(st.st_mode)}, not a regular file (a rowstore file or shard "
            "is a regular file)",
            path=path,
        )

    return _open(path, refuse)


def open_input(
    path: str | os.PathLike, *, what: str = "input file", max_bytes: int | None = None
) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file ``path`` an ingest path reads, and its
    ``fstat``; the caller closes the descriptor.

    Parameters
    ----------
    path : str or os.PathLike
    what : str
        What the file is, for messages (``"image file"``, ``"label CSV"``...).
    max_bytes : int, optional
        The largest size accepted, checked against ``fstat`` before anything is read.

    Raises
    ------
    InputError
        ``path`` is not a regular file (a FIFO, device, socket or directory: found without
        blocking), or is larger than ``max_bytes``.
    OSError
        The system's refusals (``FileNotFoundError``, ``PermissionError``...), errno set.
    """
    path = os.fspath(path)

    def refuse(st: os.stat_result) -> Exception | None:
        if not stat.S_ISREG(st.st_mode):
            return InputError(
                f"{path!r}: {what} is {_kind(st.st_mode)}, expected a regular file", path=path
            )
        if max_bytes is not None and st.st_size > max_bytes:
            return InputError(
                f"{path!r}: {what} is {st.st_size} bytes, more than the {max_bytes} bytes "
                "accepted (nothing of it was read)",
                path=path,
            )
        return None

    return _open(path, refuse)


def read_input(path: str | os.PathLike, *, what: str = "input file", max_bytes: int) -> bytes:
    """The whole content of the regular file ``path``, at most ``max_bytes`` (checked before
    reading, and again while reading: a file that grows past it is refused). Raises as
    :func:`open_input`."""
    path = os.fspath(path)
    fd, st = open_input(path, what=what, max_bytes=max_bytes)
    try:
        return _read_bounded(fd, path, what, st.st_size, max_bytes)
    finally:
        os.close(fd)


def read_text(
    path: str | os.PathLike, *, what: str = "text file", max_bytes: int, hint: str = ""
) -> str:
    """The text of the UTF-8 file ``path`` (a CSV, a manifest, transcripts), read whole as
    :func:`read_input` reads (at most ``max_bytes``), a leading byte order mark dropped.

    Raises as :func:`read_input`, and :class:`InputError` naming the line, byte and offset of
    the first byte that is not UTF-8 (``hint``: what to do about it, appended)."""
    path = os.fspath(path)
    data = read_input(path, what=what, max_bytes=max_bytes)
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        line = data.count(b"\n", 0, at) + 1
        raise InputError(
            f"{path!r}, line {line}: byte {data[at]:#04x} (offset {at}) is not UTF-8; expected "
            f"a UTF-8 {what}{hint}",
            path=path,
            line=line,
        ) from None


def read_at(fd: int, n: int, offset: int = 0) -> bytes:
    """Up to ``n`` bytes of descriptor ``fd`` from ``offset`` (fewer at the end of the file)."""
    parts = []
    while n > 0:
        b = os.pread(fd, min(n, _READ_STEP), offset)
        if not b:
            break
        parts.append(b)
        n -= len(b)
        offset += len(b)
    return b"".join(parts)


def _read_bounded(fd: int, path: str, what: str, size: int, max_bytes: int) -> bytes:
    """The content of ``fd`` (``size`` bytes by its ``fstat``, at most ``max_bytes``)."""
    buf = bytearray(size + 1)  # one byte more than fstat said: a file that grew shows it
    got = 0
    with memoryview(buf) as view:
        while got < len(buf):
            n = os.readv(fd, [view[got : got + _READ_STEP]])
            if n == 0:
                break
            got += n
    if got <= size:
        del buf[got:]
        return bytes(buf)
    parts, total = [bytes(buf)], got  # it grew after fstat: read on, within the bound
    while total <= max_bytes:
        more = os.read(fd, min(_READ_STEP, max_bytes + 1 - total))
        if not more:
            return b"".join(parts)
        parts.append(more)
        total += len(more)
    raise InputError(
        f"{path!r}: {what} grew past the {max_bytes} bytes accepted while it was read", path=path
    )


# -- names inside a root -----------------------------------------------------------------------
def name_problem(name: object, *, nested: bool = True) -> str | None:
    """Why ``name`` is not a relative name that stays inside its directory (None when it is):
    not a string, empty, absolute, a NUL, a ``..`` component (or, with ``nested=False``, more
    than one component, or ``.``). Lexical only: no file is looked at."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, expected a str"
    if not name:
        return "is empty"
    if "\x00" in name:
        return "holds a NUL character"
    if os.path.isabs(name):
        return "is an absolute path, expected a path relative to it"
    parts = name.replace(os.sep, "/").split("/")
    if ".." in parts:
        return "has a '..' component, expected a path that stays inside it"
    if not nested and (len(parts) > 1 or name == "."):
        return "is not a single plain name (no '/', not '.')"
    return None


def _real_prefix(root: str) -> tuple[str, str]:
    real = os.path.realpath(root)
    return real, real if real.endswith(os.sep) else real + os.sep


def _inside(real: str, real_root: str, prefix: str) -> bool:
    return real == real_root or real.startswith(prefix)


def contained(
    root: str | os.PathLike,
    name: str,
    *,
    what: str,
    follow_links: bool = False,
    nested: bool = True,
    line: int | None = None,
) -> str:
    """``os.path.join(root, name)``, once ``name`` is known to stay inside ``root``.

    Parameters
    ----------
    root : str or os.PathLike
        The directory the name must stay in.
    name : str
        A relative name (``/``-separated components).
    what : str
        What the name is, for the message (``"split name"``, ``"'labels.csv', line 3: image
        path"``...).
    follow_links : bool
        Accept a name whose symlinks lead outside ``root`` (by default the real path, links
        resolved, must be inside the real path of ``root``; links that stay inside are fine).
        ``..`` and absolute names are refused either way.
    nested : bool
        Accept names of several components (``a/b``); False: one plain name.
    line : int, optional
        The line of the text file the name came from (a label CSV, a manifest), kept on the
        error as ``line``.

    Raises
    ------
    OutsideRootError
        Naming ``root``, ``name``, what is wrong and (for a link) where it led. A path that
        does not exist is not refused here (whoever opens it reports that).
    """
    root = os.fspath(root)
    why = name_problem(name, nested=nested)
    if why is not None:
        raise OutsideRootError(
            f"{what} {name!r} {why} (inside {root!r})",
            path=root,
            line=line,
            root=root,
            name=str(name),
        )
    path = os.path.join(root, name)
    if not follow_links:
        real_root, prefix = _real_prefix(root)
        real = os.path.realpath(path)
        if not _inside(real, real_root, prefix):
            raise OutsideRootError(
                f"{what} {name!r} resolves to {real!r} through a symlink, outside {real_root!r}"
                " (links out of it are followed only when asked for)",
                path=path,
                line=line,
                root=root,
                name=name,
                real=real,
            )
    return path


def outside(root: str | os.PathLike, names: Sequence[str]) -> list[tuple[str, str]]:
    """``(name, real path)`` of each of ``names`` (plain relative ``/``-separated paths under
    the local directory ``root``) whose real path, symlinks resolved, is not inside the real
    path of ``root``.

    One ``realpath`` per distinct directory and one ``lstat`` per name (a name that is itself
    a symlink is resolved); a missing path is not outside (its absence is reported where it is
    read)."""
    root = os.fspath(root)
    real_root, prefix = _real_prefix(root)
    dirs: dict[str, str] = {}
    out: list[tuple[str, str]] = []
    for rel in names:
        d, _, name = rel.rpartition("/")
        rd = dirs.get(d)
        if rd is None:
            rd = dirs[d] = os.path.realpath(os.path.join(root, d)) if d else real_root
        p = os.path.join(rd, name)
        if not _inside(rd, real_root, prefix):
            out.append((rel, p))
        elif os.path.islink(p):
            rp = os.path.realpath(p)
            if not rp.startswith(prefix):
                out.append((rel, rp))
    return out


def walk(
    root: str | os.PathLike,
    keep: Callable[[str], bool],
    *,
    under: str = "",
    what: str = "file",
    follow_links: bool = False,
) -> list[str]:
    """The files under ``root`` (or its subdirectory ``under``) whose names ``keep`` accepts,
    relative to ``root`` (``/``-separated), by directory then by name; names starting with
    ``.`` skipped.

    Symlinks are followed (a directory reached twice, through a loop, is listed once) while
    they stay inside ``root``; a link leading out of it is an
    :class:`~rowstore.errors.OutsideRootError` naming it, unless ``follow_links``. Entries
    that are not regular files (FIFOs, sockets, devices) are listed: whoever opens them with
    :func:`open_input` refuses them without blocking.
    """
    root = os.fspath(root)
    real_root, prefix = _real_prefix(root)

    def check(rel: str, full: str) -> None:
        if follow_links:
            return
        real = os.path.realpath(full)
        if not _inside(real, real_root, prefix):
            raise OutsideRootError(
                f"{what} {rel!r} under {root!r} is a symlink to {real!r}, outside "
                f"{real_root!r} (links out of the tree are followed only when asked for)",
                path=full,
                root=root,
                name=rel,
                real=real,
            )

    found: list[tuple[str, str]] = []
    seen: set[tuple[int, int]] = set()
    start = os.path.join(root, under) if under else root
    if under:
        check(under, start)
    stack = [under]
    while stack:
        rel = stack.pop()
        d = os.path.join(root, rel) if rel else root
        st = os.stat(d)
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        subdirs = []
        with os.scandir(d) as it:
            entries = [e for e in it if not e.name.startswith(".")]
        for e in entries:
            r = f"{rel}/{e.name}" if rel else e.name
            link = e.is_symlink()
            if e.is_dir():
                if link:
                    check(r, e.path)
                subdirs.append(r)
            elif keep(e.name):
                if link:
                    check(r, e.path)
                found.append((rel, e.name))
        stack += sorted(subdirs, reverse=True)
    found.sort()
    return [f"{rel}/{n}" if rel else n for rel, n in found]
