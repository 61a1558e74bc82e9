"""rowstore.from_images: a folder of PNG/JPEG files to a dataset, bytes as they are, labels from
class folders (ImageFolder's order) or a CSV, shards written by worker processes, one commit."""

from __future__ import annotations

import os
import resource

import numpy as np
import pytest
from helpers import raised_without_blocking, stored_payloads

import rowstore
import rowstore.images
from rowstore import RowValidationError
from rowstore.cli import main
from rowstore.errors import InputError, OutsideRootError
from rowstore.format import manifest

ic = pytest.importorskip("imagecodecs")


def image(h, w, c=3, k=0, dtype=np.uint8):
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([np.sin(x / 3.0 + k) + np.cos(y / 4.0 + j) for j in range(c)], axis=-1)
    out = ((base + 2) / 4 * np.iinfo(dtype).max).astype(dtype)
    return out[..., 0] if c == 1 else out


def put(path, data: bytes) -> bytes:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
    return data


def image_folder_order(root):
    """torchvision's ImageFolder: classes sorted; per class, sorted os.walk, sorted names
    (hidden names left out: from_images skips them, ImageFolder does not)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and e.name[0] != ".")
    out = []
    for i, c in enumerate(classes):
        for d, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for n in sorted(names):
                if n.lower().endswith((".png", ".jpg", ".jpeg")) and n[0] != ".":
                    out.append((os.path.relpath(os.path.join(d, n), root), i))
    return out, classes


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "src"
    for k, c in enumerate(["zebra", "ant", "moth"]):
        for j in range(4):
            sub = "deep/er" if j == 1 else "z" if j == 2 else ""
            put(str(root / c / sub / f"{j}.png"), ic.png_encode(image(6, 8, k=3 * k + j)))
        put(str(root / c / "a_last.PNG"), ic.png_encode(image(6, 8, k=50 + k)))
    put(str(root / "ant" / "notes.txt"), b"not an image")
    put(str(root / "ant" / ".hidden.png"), b"skipped")
    put(str(root / ".cache" / "x.png"), b"skipped")
    put(str(root / "loose.png"), ic.png_encode(image(6, 8)))  # not in a class folder
    return str(root)


def test_image_folder(folder, tmp_path):
    out = tmp_path / "ds"
    schema = rowstore.from_images(folder, out, workers=1).schema
    assert schema["image"].codec["id"] == "png" and schema["image"].shape == (6, 8, 3)
    want, classes = image_folder_order(folder)
    with rowstore.open(out) as r:
        b = r.take(np.arange(len(r)))
        attrs = r.layout.user_attrs
    assert list(b["path"]) == [p for p, _ in want]
    assert b["label"].tolist() == [i for _, i in want]
    assert attrs["images"]["classes"] == classes == ["ant", "moth", "zebra"]
    files = [open(os.path.join(folder, p), "rb").read() for p, _ in want]
    assert stored_payloads(out, "image") == files
    for i, f in enumerate(files):
        np.testing.assert_array_equal(b["image"][i], ic.png_decode(f))


def test_shapes_from_headers(tmp_path):
    root = tmp_path / "src"
    put(str(root / "a" / "0.jpg"), ic.jpeg8_encode(image(6, 8)))
    put(str(root / "a" / "1.jpeg"), ic.jpeg8_encode(image(9, 8)))
    s = rowstore.from_images(root, tmp_path / "j", path_field=None).schema
    assert s["image"].codec["id"] == "jpeg" and s["image"].shape == (None, 8, 3)
    assert s.names == ["image", "label"]
    # a JPEG whose frame header lies past the first bytes read (a large EXIF segment first)
    Image = pytest.importorskip("PIL.Image")
    exif = tmp_path / "exif"
    os.makedirs(exif / "a")
    Image.fromarray(image(6, 8)).save(exif / "a" / "0.jpg", exif=b"Exif\x00\x00" + bytes(20000))
    assert (exif / "a" / "0.jpg").stat().st_size > 20000
    s = rowstore.from_images(exif, tmp_path / "e").schema
    assert s["image"].shape == (6, 8, 3)
    gray = tmp_path / "gray"
    put(str(gray / "a" / "0.png"), ic.png_encode(image(5, 7, c=1, dtype=np.uint16)))
    s = rowstore.from_images(gray, tmp_path / "g", labels=None).schema
    assert s["image"].shape == (5, 7) and s["image"].dtype == np.uint16
    assert s.names == ["image", "path"]
    with rowstore.open(tmp_path / "g") as r:
        np.testing.assert_array_equal(r[0]["image"], image(5, 7, c=1, dtype=np.uint16))


def test_csv_labels(folder, tmp_path):
    table = tmp_path / "labels.csv"
    table.write_text("path,label\nmoth/0.png,7\nant/0.png,-1\n")
    rowstore.from_images(folder, tmp_path / "a", labels=table)
    with rowstore.open(tmp_path / "a") as r:
        b = r.take(np.arange(len(r)))
        assert "classes" not in r.layout.user_attrs["images"]
    assert list(b["path"]) == ["moth/0.png", "ant/0.png"] and b["label"].tolist() == [7, -1]
    table.write_text("zebra/0.png,cat\nant/0.png,bee\nmoth/0.png,cat\n")
    rowstore.from_images(folder, tmp_path / "b", labels=str(table))
    with rowstore.open(tmp_path / "b") as r:
        assert r.take(np.arange(3))["label"].tolist() == [1, 0, 1]
        assert r.layout.user_attrs["images"]["classes"] == ["bee", "cat"]
    table.write_text("ant/0.png,1\nant/missing.png,2\n")
    with pytest.raises(FileNotFoundError, match="line 2"):
        rowstore.from_images(folder, tmp_path / "c", labels=table)


def test_refusals_leave_nothing(folder, tmp_path):
    out = tmp_path / "ds"
    put(os.path.join(folder, "moth", "zz.png"), b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    with pytest.raises(RowValidationError, match=r"moth/zz.png.*row \d+: field 'image'") as e:
        rowstore.from_images(folder, out, workers=1)
    row = [p for p, _ in image_folder_order(folder)[0]].index(os.path.join("moth", "zz.png"))
    assert e.value.field == "image" and e.value.row == row
    assert not manifest.is_dataset(str(out))
    os.remove(os.path.join(folder, "moth", "zz.png"))
    put(os.path.join(folder, "moth", "zz.jpg"), ic.jpeg8_encode(image(6, 8)))
    with pytest.raises(
        RowValidationError, match=r"moth/zz.jpg.*JPEG bytes; field 'image' stores PNG"
    ):
        rowstore.from_images(folder, out)
    os.remove(os.path.join(folder, "moth", "zz.jpg"))
    with pytest.raises(InputError, match=r"no image .* can be stored.*stores JPEG \(codec='jpeg'"):
        rowstore.from_images(folder, out, codec="jpeg", on_error="skip")  # none of that codec
    os.makedirs(tmp_path / "flat")
    put(str(tmp_path / "flat" / "0.png"), ic.png_encode(image(6, 8)))
    with pytest.raises(FileNotFoundError, match="no class folders"):
        rowstore.from_images(tmp_path / "flat", out)
    assert not manifest.is_dataset(str(out))


def test_worker_processes(tmp_path, monkeypatch):
    """Shards written by spawned worker processes, in file order, one commit; a bad file in a
    worker's run (verify_encoded: its image data is corrupt) publishes nothing and removes the
    shards written."""
    monkeypatch.setattr(rowstore.images, "_MIN_PART_FILES", 4)
    root = tmp_path / "src"
    files = []
    for j in range(24):
        files.append(put(str(root / f"c{j % 2}" / f"{j:02d}.png"), ic.png_encode(image(6, 8, k=j))))
    out = tmp_path / "ds"
    rowstore.from_images(root, out, workers=2, shard_bytes=2000)
    with rowstore.open(out) as r:
        assert r.layout.num_shards >= 2
        b = r.take(np.arange(len(r)))
    want, _ = image_folder_order(str(root))
    assert list(b["path"]) == [p for p, _ in want]
    assert stored_payloads(out, "image") == [
        open(os.path.join(root, p), "rb").read() for p, _ in want
    ]
    good = ic.png_encode(image(6, 8, k=99))
    put(str(root / "c1" / "zz.png"), good[:-30] + bytes(18) + good[-12:])  # header intact
    with pytest.raises(RowValidationError, match=r"c1/zz.png.*row 24: .*CRC of chunk"):
        rowstore.from_images(root, tmp_path / "bad", workers=2)
    assert not os.path.exists(tmp_path / "bad")  # no shard, no directory left behind


def test_cli(folder, tmp_path, capsys):
    out = str(tmp_path / "cli")
    assert main(["from-images", folder, out, "--workers", "1", "--no-path"]) == 0
    assert "15 images in 3 classes (png, uint8 (6, 8, 3))" in capsys.readouterr().out
    with rowstore.open(out) as r:
        assert r.schema.names == ["image", "label"] and len(r) == 15
    assert main(["from-images", str(tmp_path / "nope"), out]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_a_symlink_loop_is_walked_once(folder, tmp_path):
    """Symlinked directories are followed (as ImageFolder does), but a loop ends: each real
    directory is walked once, so the files are those without the link."""
    want = [p for p, _ in image_folder_order(folder)[0]]
    os.symlink(".", os.path.join(folder, "ant", "again"))  # ant/again -> ant
    os.symlink("..", os.path.join(folder, "moth", "deep", "up"))  # moth/deep/up -> moth
    out = tmp_path / "ds"
    rowstore.from_images(folder, out, workers=1)
    with rowstore.open(out) as r:
        assert list(r.take(np.arange(len(r)))["path"]) == want


# -- inputs opened as every ingest input is (rowstore.storage.inputs) -----------------------------
def test_a_fifo_named_like_an_image_is_refused_without_blocking(folder, tmp_path):
    fifo = os.path.join(folder, "ant", "x.png")
    os.mkfifo(fifo)
    exc = raised_without_blocking(
        lambda: rowstore.from_images(folder, tmp_path / "ds", workers=1), fifo
    )
    assert isinstance(exc, InputError) and isinstance(exc, ValueError), exc
    assert "ant/x.png" in str(exc) and "FIFO" in str(exc) and exc.path == fifo
    assert not manifest.is_dataset(str(tmp_path / "ds"))


def test_a_huge_sparse_image_is_refused_before_it_is_read(folder, tmp_path):
    """A valid PNG header, then a hole up to 3 GiB: its size (from fstat) is over what a value
    may hold, refused before a byte of it is read (the peak memory shows it was not read)."""
    big = os.path.join(folder, "moth", "big.png")
    put(big, ic.png_encode(image(6, 8)))
    os.truncate(big, 3 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with pytest.raises(InputError, match=r"moth/big.png.*3221225472 bytes, more than") as e:
        rowstore.from_images(folder, tmp_path / "ds", workers=1)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 256 << 20, grown
    assert e.value.path == big and not manifest.is_dataset(str(tmp_path / "ds"))


def test_a_symlink_to_the_root_of_the_filesystem_is_not_walked(folder, tmp_path):
    os.symlink("/", os.path.join(folder, "ant", "everything"))
    for labels in ("folders", None):
        exc = raised_without_blocking(
            lambda k=labels: rowstore.from_images(folder, tmp_path / "ds", labels=k)
        )
        assert isinstance(exc, OutsideRootError), exc
        assert "ant/everything" in str(exc) and exc.real == "/"
    assert not manifest.is_dataset(str(tmp_path / "ds"))


def test_symlinks_out_of_the_tree_only_when_asked_for(folder, tmp_path):
    """A link inside the tree is followed; one leading out of it (a class folder or a file)
    is refused, naming it, unless allow_outside=True."""
    elsewhere = tmp_path / "elsewhere"
    extra = put(str(elsewhere / "e.png"), ic.png_encode(image(6, 8, k=77)))
    os.symlink(os.path.join(folder, "ant"), os.path.join(folder, "zebra", "ants"))  # inside
    os.symlink(elsewhere, os.path.join(folder, "moth", "out"))
    with pytest.raises(OutsideRootError, match=r"moth/out.*outside") as e:
        rowstore.from_images(folder, tmp_path / "a", workers=1)
    assert e.value.real == os.path.realpath(elsewhere)
    rowstore.from_images(folder, tmp_path / "a", workers=1, allow_outside=True)
    with rowstore.open(tmp_path / "a") as r:
        paths = list(r.take(np.arange(len(r)))["path"])
    assert "moth/out/e.png" in paths and "zebra/ants/0.png" in paths
    assert stored_payloads(tmp_path / "a", "image")[paths.index("moth/out/e.png")] == extra
    os.remove(os.path.join(folder, "moth", "out"))
    os.symlink(elsewhere / "e.png", os.path.join(folder, "moth", "e.png"))  # a file
    with pytest.raises(OutsideRootError, match=r"moth/e.png"):
        rowstore.from_images(folder, tmp_path / "b", workers=1)


def test_csv_paths_stay_inside_the_source_unless_asked_for(folder, tmp_path):
    outside = put(str(tmp_path / "x.png"), ic.png_encode(image(6, 8, k=5)))
    table = tmp_path / "labels.csv"
    for bad in ("../x.png", str(tmp_path / "x.png"), "ant/../../x.png"):
        table.write_text(f"path,label\nant/0.png,1\n{bad},2\n")
        with pytest.raises(OutsideRootError, match=r"labels.csv', line 3: image path") as e:
            rowstore.from_images(folder, tmp_path / "ds", labels=table)
        assert e.value.line == 3 and e.value.name == bad
        assert not manifest.is_dataset(str(tmp_path / "ds"))
    rowstore.from_images(folder, tmp_path / "ds", labels=table, allow_outside=True)
    assert stored_payloads(tmp_path / "ds", "image")[1] == outside
    os.symlink(tmp_path / "x.png", os.path.join(folder, "ant", "link.png"))
    table.write_text("ant/link.png,1\n")
    with pytest.raises(OutsideRootError, match=r"line 1: image path 'ant/link.png'"):
        rowstore.from_images(folder, tmp_path / "ds2", labels=table)


def test_csv_with_a_byte_order_mark_is_read(folder, tmp_path):
    table = tmp_path / "labels.csv"
    table.write_bytes(b"\xef\xbb\xbfpath,label\r\nmoth/0.png,7\r\nant/0.png,3\r\n")
    rowstore.from_images(folder, tmp_path / "ds", labels=table)
    with rowstore.open(tmp_path / "ds") as r:
        b = r.take(np.arange(len(r)))
    assert list(b["path"]) == ["moth/0.png", "ant/0.png"] and b["label"].tolist() == [7, 3]
    table.write_bytes(b"\xef\xbb\xbfmoth/0.png,7\n")  # no header: the first path is clean too
    rowstore.from_images(folder, tmp_path / "ds2", labels=table)


def test_csv_that_is_not_utf8_or_a_label_beyond_int64_names_file_and_line(folder, tmp_path):
    put(os.path.join(folder, "ant", "caf\xe9.png"), ic.png_encode(image(6, 8)))
    table = tmp_path / "labels.csv"
    table.write_bytes("path,label\nant/0.png,1\nant/caf\xe9.png,2\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"labels.csv', line 3: byte 0xe9 .*not UTF-8") as e:
        rowstore.from_images(folder, tmp_path / "ds", labels=table)
    assert e.value.line == 3 and e.value.path == str(table)
    table.write_text(f"ant/0.png,1\nmoth/0.png,{1 << 63}\n")
    with pytest.raises(InputError, match=r"labels.csv', line 2: label 9223372036854775808 .*int64"):
        rowstore.from_images(folder, tmp_path / "ds", labels=table)
    table.write_text(f"ant/0.png,{-(1 << 63)}\nmoth/0.png,{(1 << 63) - 1}\n")  # the limits fit
    rowstore.from_images(folder, tmp_path / "ds", labels=table)
    table.write_text("ant/0.png,1,extra\n")
    with pytest.raises(InputError, match=r"line 1: expected path,label"):
        rowstore.from_images(folder, tmp_path / "ds3", labels=table)
    assert not manifest.is_dataset(str(tmp_path / "ds3"))


def test_the_command_refuses_links_out_of_the_tree_unless_asked_for(folder, tmp_path, capsys):
    """`rowstore from-images` keeps the API's default and its opt-in (--allow-outside)."""
    from rowstore.cli import main

    elsewhere = tmp_path / "elsewhere"
    put(str(elsewhere / "e.png"), ic.png_encode(image(6, 8, k=77)))
    os.symlink(elsewhere, os.path.join(folder, "moth", "out"))
    assert main(["from-images", folder, str(tmp_path / "a"), "--workers", "1"]) == 1
    assert "outside" in capsys.readouterr().err
    assert not manifest.is_dataset(str(tmp_path / "a"))
    out = str(tmp_path / "b")
    assert main(["from-images", folder, out, "--workers", "1", "--allow-outside"]) == 0
    with rowstore.open(out) as r:
        assert "moth/out/e.png" in list(r.take(np.arange(len(r)))["path"])
