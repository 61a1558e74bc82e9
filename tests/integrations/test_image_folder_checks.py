"""rowstore.from_images on image folders as they come (issue 39): every file checked at ingest
(its real format sniffed, its structure walked, optionally decoded), ``on_error="raise"`` naming
the first bad file and leaving nothing, ``on_error="skip"`` storing every good file
byte-identical and reporting the rest (returned, kept in the dataset, printed by the command),
``channels=``/``shape=`` for trees whose images differ in channels, progress and summary.

Tests marked ``needs_h39d`` need image fields that take any JPEG/PNG whatever its channels
(branch h39d, issue 39 item 1); they run as soon as that is in (the marker probes for it)."""

from __future__ import annotations

import io
import os
import zlib

import numpy as np
import pytest
from damaged_images import damaged_jpegs, png_chunk, png_chunks
from helpers import stored_payloads

import rowstore
import rowstore.images
from rowstore import RowValidationError
from rowstore.cli import main
from rowstore.codecs.image import jpeg_header
from rowstore.errors import InputError

Image = pytest.importorskip("PIL.Image")


def picture(h=12, w=16, seed=0, mode="RGB"):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 9, y * 13, (x + y) * 5], axis=-1) + rng.integers(0, 30, (h, w, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).convert(mode)


def encode(img, fmt, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


def put(root, rel, data: bytes) -> str:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return rel


def _mixed_channels_landed() -> bool:
    try:
        return jpeg_header(encode(picture(mode="CMYK"), "JPEG")).channels == 4
    except ValueError:
        return False


needs_h39d = pytest.mark.skipif(
    not _mixed_channels_landed(),
    reason="needs branch h39d: image fields that take any JPEG/PNG whatever its channels",
)


def png_with_bad_data(good: bytes) -> bytes:
    """``good`` with its zlib stream damaged and every CRC right: well formed, not decodable."""
    out = b"\x89PNG\r\n\x1a\n"
    for kind, data in png_chunks(good):
        if kind == b"IDAT":
            z = zlib.compress(b"\x07" * len(zlib.decompress(data)))  # filter type 7: invalid
            data = z
        out += png_chunk(kind, data)
    return out


def stored(out) -> dict[str, bytes]:
    with rowstore.open(out) as r:
        paths = list(r.take(np.arange(len(r)))["path"])
    return dict(zip(paths, stored_payloads(out, "image")))


def read(src, rel) -> bytes:
    with open(os.path.join(src, rel), "rb") as f:
        return f.read()


@pytest.fixture
def jpeg_tree(tmp_path):
    """A JPEG class folder as real collections hold them: RGB baseline, progressive, with
    restart markers, and the bad ones: PNG bytes named .jpg, a truncated JPEG, an empty file,
    a GIF named .jpg (and a directory named .jpg, which is a folder, walked)."""
    src = str(tmp_path / "jpegs")
    p = picture()
    good = [
        put(src, "cat/a_rgb.jpg", encode(p, "JPEG", quality=90)),
        put(src, "cat/b_progressive.jpg", encode(p, "JPEG", progressive=True)),
        put(src, "cat/c_restarts.jpeg", encode(p, "JPEG", restart_marker_blocks=2)),
        put(src, "dog/a.JPG", encode(picture(seed=1), "JPEG")),
    ]
    whole = encode(picture(seed=2), "JPEG")
    bad = {
        put(src, "cat/d_png.jpg", encode(p, "PNG")): "PNG bytes named '.jpg'; field 'image' "
        "stores JPEG (the format of 5 of the 6 images), one codec per field",
        put(src, "cat/e_truncated.jpg", damaged_jpegs(whole)["truncated"]): "truncated",
        put(src, "dog/b_empty.jpg", b""): "an empty file (0 bytes)",
        put(src, "dog/c_gif.jpg", encode(p, "GIF")): "not PNG or JPEG bytes (GIF)",
    }
    os.makedirs(os.path.join(src, "dog", "folder.jpg"))
    return src, good, bad


def test_skip_stores_every_good_file_as_it_is_and_reports_the_rest(jpeg_tree, tmp_path):
    src, good, bad = jpeg_tree
    out = tmp_path / "ds"
    report = rowstore.from_images(src, out, on_error="skip", workers=1)
    assert stored(out) == {rel: read(src, rel) for rel in good}  # byte-identical, in order
    assert [s.path for s in report.skipped] == sorted(bad)
    for s in report.skipped:
        assert bad[s.path] in s.reason, s
    with rowstore.open(out) as r:
        meta = r.layout.user_attrs["images"]
        assert r.take(np.arange(len(r)))["label"].tolist() == [0, 0, 0, 1]
    assert meta["skipped"] == [s.to_json() for s in report.skipped]
    assert meta["files"] == report.images == 4 and meta["checked"] == "structure"
    assert report.classes == ["cat", "dog"] and report.schema["image"].shape == (12, 16, 3)
    assert report.payload_bytes == sum(len(read(src, rel)) for rel in good)
    assert report.stored_bytes > report.payload_bytes
    text = report.summary()
    assert "4 images in 2 classes (jpeg, uint8 (12, 16, 3))" in text and "4 skipped" in text
    for rel in bad:
        assert f"skipped {rel}: " in text


def test_raise_names_the_first_bad_file_and_leaves_nothing(jpeg_tree, tmp_path):
    """The default: the first bad file in file order, whether its header shows it (checked
    first, in this process) or only its content (the structural check), and no dataset or
    directory left behind."""
    src, _, _ = jpeg_tree
    out = tmp_path / "ds"
    with pytest.raises(RowValidationError, match=r"'cat/d_png.jpg': row 3: .*PNG bytes named") as e:
        rowstore.from_images(src, out, workers=1)
    assert e.value.row == 3 and e.value.field == "image"
    assert not os.path.exists(out)
    os.remove(os.path.join(src, "cat", "d_png.jpg"))  # the first is now one damaged inside
    with pytest.raises(RowValidationError, match=r"'cat/e_truncated.jpg': row 3: .*truncated"):
        rowstore.from_images(src, out, workers=1)
    assert not os.path.exists(out)
    os.remove(os.path.join(src, "cat", "e_truncated.jpg"))
    with pytest.raises(RowValidationError, match=r"'dog/b_empty.jpg': row 4: .*empty file"):
        rowstore.from_images(src, out, workers=1)
    assert not os.path.exists(out)


def test_png_tree_bit_depth_and_fixed_shape(tmp_path):
    """A PNG tree: palette and RGB stored; a 16-bit PNG in an 8-bit tree has no stated rule to
    convert it and is a bad file; a damaged CRC; with ``shape=`` a file whose size differs."""
    src = str(tmp_path / "pngs")
    p = picture()
    good = [
        put(src, "a/rgb.png", encode(p, "PNG")),
        put(src, "a/palette.png", encode(p.convert("P"), "PNG")),
        put(src, "a/named.jpg", encode(picture(seed=3), "PNG")),  # PNG in a PNG field: stored
    ]
    deep = Image.fromarray(np.arange(12 * 16, dtype=np.uint16).reshape(12, 16) * 300)
    put(src, "a/x16.png", encode(deep, "PNG"))
    crc = bytearray(encode(picture(seed=4), "PNG"))
    crc[60] ^= 0x10
    put(src, "b/crc.png", bytes(crc))
    put(src, "b/small.png", encode(picture(10, 16), "PNG"))
    report = rowstore.from_images(src, tmp_path / "ds", on_error="skip", shape=(12, 16, 3))
    assert stored(tmp_path / "ds") == {rel: read(src, rel) for rel in sorted(good)}
    why = {s.path: s.reason for s in report.skipped}
    assert "a 16-bit PNG; field 'image' holds 8-bit samples" in why["a/x16.png"]
    assert "no stated rule" in why["a/x16.png"]
    assert "CRC of chunk" in why["b/crc.png"]
    assert "an image of 10x16; field 'image' has shape (12, 16, 3)" in why["b/small.png"]
    assert report.schema["image"].codec["id"] == "png"


def test_verify_encoded_decodes_in_full(tmp_path):
    """Damage inside well-formed data passes the structural check and is stored; with
    ``verify_encoded=True`` the full decode finds it (skipped, or the error naming it)."""
    src = str(tmp_path / "src")
    good = [put(src, f"c/{k:02d}.png", encode(picture(seed=k), "PNG")) for k in range(6)]
    put(src, "c/03x_zlib.png", png_with_bad_data(encode(picture(), "PNG")))
    plain = rowstore.from_images(src, tmp_path / "plain", workers=1, on_error="skip")
    assert plain.images == 7 and not plain.skipped  # well formed: stored
    report = rowstore.from_images(
        src, tmp_path / "v", workers=1, on_error="skip", verify_encoded=True
    )
    assert [(s.path, "does not decode" in s.reason) for s in report.skipped] == [
        ("c/03x_zlib.png", True)
    ]
    assert stored(tmp_path / "v") == {rel: read(src, rel) for rel in good}
    with rowstore.open(tmp_path / "v") as r:
        assert r.layout.user_attrs["images"]["checked"] == "decoded"
    with pytest.raises(RowValidationError, match=r"'c/03x_zlib.png': row 4: .*does not decode"):
        rowstore.from_images(src, tmp_path / "r", workers=1, verify_encoded=True)
    assert not os.path.exists(tmp_path / "r")


def test_worker_processes_check_skip_and_keep_file_order(tmp_path, monkeypatch):
    """Spawned workers run the checks (the structural one and, asked for, the full decode):
    the rows are the good files in order, the skipped list is in file order with each
    reason, and a part whose every file is bad writes no shard."""
    monkeypatch.setattr(rowstore.images, "_MIN_PART_FILES", 4)
    src = str(tmp_path / "src")
    whole = encode(picture(24, 24), "JPEG")
    rels, why = [], {}
    for k in range(24):
        data = encode(picture(seed=k), "JPEG")
        if k % 5 == 0 or 12 <= k < 18:
            data, why[k] = whole[:-2], "no EOI marker (truncated)"
        elif k == 7:
            data, why[k] = damaged_jpegs(whole)["zero_run"], "does not decode"
        rels.append(put(src, f"c{k // 12}/{k:02d}.jpg", data))
    report = rowstore.from_images(
        src, tmp_path / "ds", workers=2, on_error="skip", shard_bytes=1, verify_encoded=True
    )
    assert [s.path for s in report.skipped] == [rels[k] for k in sorted(why)]
    for s, k in zip(report.skipped, sorted(why)):
        assert why[k] in s.reason, s
    assert stored(tmp_path / "ds") == {r: read(src, r) for k, r in enumerate(rels) if k not in why}


def test_everything_bad_is_an_error_not_an_empty_dataset(tmp_path):
    src = str(tmp_path / "src")
    put(src, "a/0.jpg", b"")
    put(src, "a/1.jpg", b"GIF89a" + bytes(10))
    with pytest.raises(InputError, match=r"no image .* can be stored: all 2 files are bad"):
        rowstore.from_images(src, tmp_path / "ds", on_error="skip")
    assert not os.path.exists(tmp_path / "ds")


def test_a_fifo_and_a_dangling_link_are_skipped_when_asked(tmp_path):
    """Skipped with their reasons (the FIFO found without blocking); with the default, the
    errors of the opener as they are (InputError, FileNotFoundError)."""
    src = str(tmp_path / "src")
    put(src, "a/0.jpg", encode(picture(), "JPEG"))
    os.mkfifo(os.path.join(src, "a", "1.jpg"))
    os.symlink(os.path.join(src, "a", "gone.jpg"), os.path.join(src, "a", "2.jpg"))
    report = rowstore.from_images(src, tmp_path / "ds", on_error="skip")
    assert [s.path for s in report.skipped] == ["a/1.jpg", "a/2.jpg"]
    assert "FIFO" in report.skipped[0].reason and "No such file" in report.skipped[1].reason
    with pytest.raises(InputError, match="FIFO"):
        rowstore.from_images(src, tmp_path / "r")
    os.remove(os.path.join(src, "a", "1.jpg"))
    with pytest.raises(FileNotFoundError):
        rowstore.from_images(src, tmp_path / "r")
    assert not os.path.exists(tmp_path / "r")


def test_arguments_are_checked(tmp_path):
    src = str(tmp_path / "src")
    put(src, "a/0.jpg", encode(picture(), "JPEG"))
    for kwargs, err in (
        ({"on_error": "ignore"}, ValueError),
        ({"verify_encoded": 1}, TypeError),
        ({"progress": "yes"}, TypeError),
        ({"shape": (12, 16, 3), "channels": 1}, ValueError),
        ({"channels": 0}, ValueError),
        ({"shape": (12,)}, ValueError),
    ):
        with pytest.raises(err):
            rowstore.from_images(src, tmp_path / "ds", **kwargs)
    assert not os.path.exists(tmp_path / "ds")


def test_the_command_shows_progress_summary_and_skipped_files(jpeg_tree, tmp_path, capsys):
    src, good, bad = jpeg_tree
    out = str(tmp_path / "cli")
    assert main(["from-images", src, out, "--workers", "1"]) == 1  # raise: the first bad file
    assert "cat/d_png.jpg" in capsys.readouterr().err and not os.path.exists(out)
    args = ["from-images", src, out, "--on-error", "skip", "--shape", "none,none,3", "--verify"]
    assert main(args) == 0
    cap = capsys.readouterr()
    assert "headers" in cap.err and "8 files" in cap.err  # the progress: headers read,
    assert "write" in cap.err and "5 files" in cap.err  # then files checked and written
    assert "4 images in 2 classes (jpeg, uint8 (None, None, 3))" in cap.out
    for rel in bad:
        assert f"skipped {rel}: " in cap.out
    with rowstore.open(out) as r:
        assert r.layout.user_attrs["images"]["checked"] == "decoded"
    assert main(["from-images", src, str(tmp_path / "q"), "--on-error", "skip", "--quiet"]) == 0
    assert not capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["from-images", src, out, "--shape", "12,x,3"])
    assert "expected H,W or H,W,C" in capsys.readouterr().err


# -- trees whose images differ in channels (needs h39d) --------------------------------------
@pytest.fixture
def every_kind(tmp_path):
    """The issue's folder: greyscale, CMYK and progressive JPEGs, palette, alpha and 16-bit
    PNGs, a PNG named .jpg, a truncated JPEG, an empty file; split in a JPEG tree and a PNG
    tree (a field stores one codec)."""
    p = picture(14, 20)
    jp, pn = str(tmp_path / "jpegs"), str(tmp_path / "pngs")
    jgood = [
        put(jp, "a/0_rgb.jpg", encode(p, "JPEG")),
        put(jp, "a/1_grey.jpg", encode(p.convert("L"), "JPEG")),
        put(jp, "a/2_cmyk.jpg", encode(p.convert("CMYK"), "JPEG")),
        put(jp, "a/3_progressive.jpg", encode(p, "JPEG", progressive=True)),
    ]
    jbad = [
        put(jp, "a/4_png.jpg", encode(p, "PNG")),
        put(jp, "a/5_truncated.jpg", encode(p, "JPEG")[:-40]),
        put(jp, "a/6_empty.jpg", b""),
    ]
    pgood = [
        put(pn, "a/0_rgb.png", encode(p, "PNG")),
        put(pn, "a/1_palette.png", encode(p.convert("P"), "PNG")),
        put(pn, "a/2_alpha.png", encode(p.convert("RGBA"), "PNG")),
        put(pn, "a/3_grey.png", encode(p.convert("L"), "PNG")),
    ]
    deep = Image.fromarray(np.arange(14 * 20, dtype=np.uint16).reshape(14, 20) * 200)
    pbad = [put(pn, "a/4_16bit.png", encode(deep, "PNG"))]
    return (jp, jgood, jbad), (pn, pgood, pbad)


@needs_h39d
def test_every_kind_of_file_a_folder_holds(every_kind, tmp_path):
    """The issue's "done when": ``on_error="skip"`` stores every good file byte-identical in a
    3-channel field and reports the rest; the default refuses the tree naming the first bad
    file and leaves nothing."""
    for k, (src, good, bad) in enumerate(every_kind):
        out = tmp_path / f"ds{k}"
        report = rowstore.from_images(src, out, on_error="skip")
        assert report.schema["image"].shape == (14, 20, 3)
        assert stored(out) == {rel: read(src, rel) for rel in good}
        assert [s.path for s in report.skipped] == bad
        with pytest.raises(RowValidationError, match=f"'{bad[0]}': row {len(good)}: "):
            rowstore.from_images(src, tmp_path / f"r{k}")
        assert not os.path.exists(tmp_path / f"r{k}")


@needs_h39d
def test_channels_of_the_field(every_kind, tmp_path):
    (jp, jgood, _), (pn, _, _) = every_kind
    grey = str(tmp_path / "grey")
    put(grey, "a/0.jpg", encode(picture(14, 20, mode="L"), "JPEG"))
    put(grey, "a/1.jpg", encode(picture(14, 20, seed=1, mode="L"), "JPEG"))
    assert rowstore.from_images(grey, tmp_path / "g").schema["image"].shape == (14, 20)
    s = rowstore.from_images(grey, tmp_path / "g3", channels=3).schema["image"]
    assert s.shape == (14, 20, 3)
    s = rowstore.from_images(jp, tmp_path / "j1", channels=1, on_error="skip").schema["image"]
    assert s.shape == (14, 20)
    # images of any channels convert to 1 or 3 (h39d): with channels=4 the other PNGs are
    # bad files, skipped with the codec's reason, the RGBA one stored
    report = rowstore.from_images(pn, tmp_path / "p4", channels=4, on_error="skip")
    assert report.schema["image"].shape == (14, 20, 4)
    assert stored(tmp_path / "p4") == {"a/2_alpha.png": read(pn, "a/2_alpha.png")}
    why = {s.path: s.reason for s in report.skipped}
    assert "cannot become 4 channels" in why["a/0_rgb.png"] and len(why) == 4
    with pytest.raises(RowValidationError, match="'a/0_rgb.png': row 0: .*cannot become 4"):
        rowstore.from_images(pn, tmp_path / "p4r", channels=4)
    # one read check (the decode engineer's tests hold every path): a grey JPEG read as RGB
    with rowstore.open(tmp_path / "g3") as r:
        want = np.asarray(Image.open(os.path.join(grey, "a/0.jpg")).convert("RGB"))
        got = r[0]["image"]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
