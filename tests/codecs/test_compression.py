"""Block compression objects (rowstore.codecs.blocks): the compression= argument and stored
configs they accept, the config they store, their HDF5 filter, compress/decompress round trips,
the frame codes the reader checks, and the registry."""

from __future__ import annotations

from dataclasses import dataclass

import hdf5plugin
import numpy as np
import pytest

from rowstore import CodecError, FormatError
from rowstore.codecs import blocks as bc

CNAMES = list(bc.BLOSC2_CODECS)
SHUFFLES = list(bc.BLOSC2_SHUFFLES)


@pytest.mark.parametrize(
    ("given", "config"),
    [
        (None, {"id": "none"}),
        (False, {"id": "none"}),
        ("none", {"id": "none"}),
        ({"id": "none"}, {"id": "none"}),
        (
            {"id": "none", "cname": "lz4"},
            {"id": "none"},
        ),  # other keys have always been ignored for "none"
        ("lz4", {"id": "blosc2", "cname": "lz4", "clevel": 5, "shuffle": "byte"}),
        ("zstd", {"id": "blosc2", "cname": "zstd", "clevel": 5, "shuffle": "byte"}),
        ({}, {"id": "blosc2", "cname": "lz4", "clevel": 5, "shuffle": "byte"}),
        (
            {"cname": "zlib", "clevel": 0, "shuffle": "bit"},
            {"id": "blosc2", "cname": "zlib", "clevel": 0, "shuffle": "bit"},
        ),
        (
            {"id": "blosc2", "cname": "blosclz", "clevel": 9, "shuffle": "none"},
            {"id": "blosc2", "cname": "blosclz", "clevel": 9, "shuffle": "none"},
        ),
    ],
)
def test_accepted_forms_and_stored_config(given, config):
    c = bc.block_compression(given)
    assert c.get_config() == config
    assert bc.compression_config(given) == config
    assert c.compressed == (config["id"] != "none")
    assert bc.block_compression(config) == c  # a stored config gives the same object back
    assert bc.block_compression(c) is c


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            5,
            "compression must be None, a codec name ('lz4', 'lz4hc', 'zstd', 'blosclz', 'zlib') or "
            "a dict, got 5",
        ),
        (True, "compression must be None"),
        (["lz4"], "compression must be None"),
        (
            "snappy",
            "unknown blosc2 codec 'snappy'; expected one of ('lz4', 'lz4hc', 'zstd', 'blosclz', "
            "'zlib')",
        ),
        ({"id": "gzip"}, "unknown block compression 'gzip'; expected 'none' or 'blosc2'"),
        ({"id": ["x"]}, "unknown block compression ['x']"),
        ({"clevel": 12}, "compression level must be an int in 0..9, got 12"),
        ({"clevel": 2.5}, "compression level must be an int in 0..9, got 2.5"),
        ({"shuffle": "word"}, "shuffle must be one of ('none', 'byte', 'bit'), got 'word'"),
        (
            {"cname": "lz4", "typo": 1, "alpha": 2},
            "unknown compression option(s) ['alpha', 'typo']",
        ),
        ({"cname": ["lz4"]}, "unknown blosc2 codec ['lz4']"),
    ],
)
def test_refused_forms(given, message):
    with pytest.raises(CodecError) as info:
        bc.block_compression(given)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, ValueError)


def test_objects_are_frozen_values():
    a = bc.block_compression({"cname": "zstd", "clevel": 3})
    b = bc.Blosc2(cname="zstd", clevel=3)
    assert (
        a == b and hash(a) == hash(b) and a != bc.Blosc2(cname="zstd") and a != bc.NoCompression()
    )
    assert repr(a) == "Blosc2(cname='zstd', clevel=3, shuffle='byte')"
    with pytest.raises(AttributeError):
        a.clevel = 4  # type: ignore[misc]
    with pytest.raises(AttributeError):
        bc.NoCompression().x = 1  # type: ignore[attr-defined]
    assert {a: 1}[b] == 1


def test_frame_check_uses_the_declared_codes():
    assert bc.NoCompression().frame_check() is None
    for cname in CNAMES:
        for shuffle in SHUFFLES:
            got = bc.Blosc2(cname=cname, shuffle=shuffle).frame_check()
            assert got == (bc.BLOSC2_CODECS[cname], bc.BLOSC2_SHUFFLES[shuffle])
    # blosc2.h's codes, as hdf5plugin knows them too
    assert bc.BLOSC2_CODECS == {"blosclz": 0, "lz4": 1, "lz4hc": 2, "zlib": 4, "zstd": 5}
    assert bc.BLOSC2_SHUFFLES == {
        "none": hdf5plugin.Blosc2.NOFILTER,
        "byte": hdf5plugin.Blosc2.SHUFFLE,
        "bit": hdf5plugin.Blosc2.BITSHUFFLE,
    }


@pytest.mark.parametrize("cname", CNAMES)
@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_hdf5_filter_kwargs(cname, shuffle):
    names = {
        "none": hdf5plugin.Blosc2.NOFILTER,
        "byte": hdf5plugin.Blosc2.SHUFFLE,
        "bit": hdf5plugin.Blosc2.BITSHUFFLE,
    }
    kw = bc.Blosc2(cname=cname, clevel=2, shuffle=shuffle).hdf5_filter_kwargs()
    assert kw == dict(hdf5plugin.Blosc2(cname=cname, clevel=2, filters=names[shuffle]))
    assert kw["compression"] == bc.BLOSC2_FILTER_ID
    assert bc.NoCompression().hdf5_filter_kwargs() == {}


@pytest.mark.parametrize("cname", CNAMES)
@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_compress_decompress_round_trip(cname, shuffle):
    rng = np.random.default_rng(1)
    raw = np.repeat(rng.integers(0, 50, 4096, dtype=np.int32), 2).tobytes()  # compressible
    c = bc.Blosc2(cname=cname, clevel=3, shuffle=shuffle)
    stored = c.compress(raw, typesize=4)
    assert len(stored) < len(raw)
    out = np.empty(len(raw), np.uint8)
    c.decompress_into(stored, out)
    assert out.tobytes() == raw
    with pytest.raises(FormatError):
        c.decompress_into(stored, np.empty(len(raw) - 1, np.uint8))  # not the chunk's raw size


def test_compress_accepts_memoryview_and_zero_chunk():
    c = bc.Blosc2()
    zeros = memoryview(bytes(1000))
    out = np.empty(1000, np.uint8)
    c.decompress_into(c.compress(zeros, typesize=1), out)
    assert not out.any()


def test_no_compression_is_the_identity():
    c = bc.NoCompression()
    raw = memoryview(b"abcdefgh")
    assert c.compress(raw, typesize=8) is raw
    out = np.empty(2, np.uint32)
    c.decompress_into(b"abcdefgh", out)
    assert out.tobytes() == b"abcdefgh"
    with pytest.raises(FormatError):
        c.decompress_into(b"abc", out)


def test_registry(monkeypatch):
    monkeypatch.setattr(bc, "_REGISTRY", dict(bc._REGISTRY))

    @dataclass(frozen=True, kw_only=True)
    class Xor(bc.BlockCompression):
        compression_id = "xor"
        key: int = 7

        def hdf5_filter_kwargs(self):
            return {}

        def compress(self, raw, *, typesize):
            return (np.frombuffer(raw, np.uint8) ^ self.key).tobytes()

        def decompress_into(self, stored, out):
            out.reshape(-1).view(np.uint8)[:] = np.frombuffer(stored, np.uint8) ^ self.key

        def frame_check(self):
            return None

    assert bc.register_block_compression(Xor) is Xor
    assert bc.registered_block_compressions()["xor"] is Xor
    c = bc.block_compression({"id": "xor", "key": 3})
    assert isinstance(c, Xor) and c.get_config() == {"id": "xor", "key": 3}
    with pytest.raises(AttributeError):
        c.key = 4  # type: ignore[misc]
    assert c == Xor(key=3) and c != Xor() and repr(c) == "test_registry.<locals>.Xor(key=3)"
    with pytest.raises(CodecError, match="bad configuration for block compression 'xor'"):
        bc.block_compression({"id": "xor", "nope": 1})
    with pytest.raises(CodecError, match="expected 'none', 'blosc2' or 'xor'"):
        bc.block_compression({"id": "nope"})

    @dataclass(frozen=True, kw_only=True)
    class Other(Xor):
        pass

    with pytest.raises(CodecError, match="already registered"):
        bc.register_block_compression(Other)
    bc.register_block_compression(Other, replace=True)
    with pytest.raises(CodecError, match="not a BlockCompression"):
        bc.register_block_compression(int)  # type: ignore[arg-type]

    @dataclass(frozen=True, kw_only=True)
    class NoId(Xor):
        compression_id = ""

    with pytest.raises(CodecError, match="no compression_id"):
        bc.register_block_compression(NoId)
