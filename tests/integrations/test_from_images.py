"""rowstore.from_images: a folder of PNG/JPEG files to a dataset, bytes as they are, labels from
class folders (ImageFolder's order) or a CSV, shards written by worker processes, one commit."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import stored_payloads

import rowstore
import rowstore.images
from rowstore import RowValidationError, SchemaError
from rowstore.cli import main
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
    schema = rowstore.from_images(folder, out, workers=1)
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
    s = rowstore.from_images(root, tmp_path / "j", path_field=None)
    assert s["image"].codec["id"] == "jpeg" and s["image"].shape == (None, 8, 3)
    assert s.names == ["image", "label"]
    # a JPEG whose frame header lies past the first bytes read (a large EXIF segment first)
    Image = pytest.importorskip("PIL.Image")
    exif = tmp_path / "exif"
    os.makedirs(exif / "a")
    Image.fromarray(image(6, 8)).save(exif / "a" / "0.jpg", exif=b"Exif\x00\x00" + bytes(20000))
    assert (exif / "a" / "0.jpg").stat().st_size > 20000
    s = rowstore.from_images(exif, tmp_path / "e")
    assert s["image"].shape == (6, 8, 3)
    gray = tmp_path / "gray"
    put(str(gray / "a" / "0.png"), ic.png_encode(image(5, 7, c=1, dtype=np.uint16)))
    s = rowstore.from_images(gray, tmp_path / "g", labels=None)
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
    with pytest.raises(SchemaError, match="differ in format"):
        rowstore.from_images(folder, out)
    os.remove(os.path.join(folder, "moth", "zz.jpg"))
    put(os.path.join(folder, "moth", "zz.png"), ic.png_encode(image(6, 8, c=4)))
    with pytest.raises(SchemaError, match="differ in channels"):
        rowstore.from_images(folder, out)
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
    with pytest.raises(RowValidationError, match=r"c1/zz.png.*row 24: .*does not decode"):
        rowstore.from_images(root, tmp_path / "bad", workers=2, verify_encoded=True)
    assert not manifest.is_dataset(str(tmp_path / "bad"))
    assert not os.listdir(tmp_path / "bad" / "shards")


def test_cli(folder, tmp_path, capsys):
    out = str(tmp_path / "cli")
    assert main(["from-images", folder, out, "--workers", "1", "--no-path"]) == 0
    assert "15 images (png, uint8 (6, 8, 3))" in capsys.readouterr().out
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
