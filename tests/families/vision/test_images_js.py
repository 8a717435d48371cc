"""The vision bundle's image pipeline in JavaScript (``images.mjs``) under Node.js against the Python
runtime's (Pillow): Pillow's resize for every filter and many sizes, PNG decoding of every colour type,
bit depth and interlacing, EXIF orientation, and the preprocessing of real photographs, all equal to the
last bit; hostile files refused in one line before they are inflated."""

from __future__ import annotations

import io
import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgeattn.runtime.families.vision.images import ImagePreprocessing, open_image
from tests.families.vision.test_vision import sample_photos

MODULE = Path(__file__).resolve().parents[3] / "runtime" / "families" / "vision" / "images.mjs"


def node_run(script: str, work: Path) -> dict:
    """Run an ES module script under Node.js (importing images.mjs); what it printed as JSON."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    (work / "run.mjs").write_text(f'import * as images from "{MODULE.as_uri()}";\n'
                                  'import { readFileSync, writeFileSync } from "node:fs";\n' + script)  # fmt: skip
    done = subprocess.run([node, str(work / "run.mjs")], capture_output=True, text=True, timeout=300, cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_resize_equals_pillow_for_every_filter_and_size(tmp_path: Path) -> None:
    """400 resizes (1 to 300 pixels a side down to 1 to 120, both passes' orders, filters 0 to 5)."""
    rng = np.random.default_rng(11)
    cases = []
    for k in range(400):
        h, w = (int(v) for v in rng.integers(1, 300, 2))
        width, height = (int(v) for v in rng.integers(1, 120, 2))
        if k % 4 == 0:  # upscaling too
            width, height = width + w, height + h // 2
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        name = f"case{k}"
        (tmp_path / name).write_bytes(image.tobytes())
        want = np.asarray(Image.fromarray(image).resize((width, height), resample=k % 6, reducing_gap=None))
        (tmp_path / f"{name}.want").write_bytes(want.tobytes())
        cases.append({"file": str(tmp_path / name), "w": w, "h": h, "W": width, "H": height, "f": k % 6})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    from edgeattn.families.vision.bundle import pillow_major

    got = node_run(f"""
const cases = JSON.parse(readFileSync("{tmp_path / 'cases.json'}"));
const wrong = [];
for (const c of cases) {{
  const image = {{ data: new Uint8Array(readFileSync(c.file)), width: c.w, height: c.h, channels: 3 }};
  const out = images.resize(image, c.W, c.H, c.f, {pillow_major()}).data;
  const want = new Uint8Array(readFileSync(c.file + ".want"));
  if (out.length !== want.length || out.some((v, i) => v !== want[i])) wrong.push(c);
}}
console.log(JSON.stringify({{ wrong, count: cases.length }}));
""", tmp_path)  # fmt: skip
    assert got["count"] == 400 and got["wrong"] == []


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def interlaced_png(pixels: np.ndarray) -> bytes:
    """An Adam7-interlaced 8-bit RGB PNG of (H, W, 3) pixels (Pillow writes no interlaced PNG), each
    row filtered by a filter chosen in turn (none, sub, up, average, Paeth)."""
    h, w, _ = pixels.shape
    raw = bytearray()
    k = 0
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                           (0, 1, 1, 2)):  # fmt: skip
        sub = pixels[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        previous = np.zeros(sub.shape[1] * 3, np.int32)
        for row in sub.reshape(sub.shape[0], -1).astype(np.int32):
            kind = k % 5
            k += 1
            left = np.concatenate([np.zeros(3, np.int32), row[:-3]])
            upper_left = np.concatenate([np.zeros(3, np.int32), previous[:-3]])
            if kind == 0:
                coded = row
            elif kind == 1:
                coded = row - left
            elif kind == 2:
                coded = row - previous
            elif kind == 3:
                coded = row - (left + previous) // 2
            else:
                p = left + previous - upper_left
                pa, pb, pc = np.abs(p - left), np.abs(p - previous), np.abs(p - upper_left)
                predictor = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, previous, upper_left))
                coded = row - predictor
            raw += bytes([kind]) + (coded % 256).astype(np.uint8).tobytes()
            previous = row
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", zlib.compress(bytes(raw)))
            + _png_chunk(b"IEND", b""))  # fmt: skip


def png_kinds() -> dict[str, bytes]:
    """PNG files of every colour type and bit depth Pillow writes, an interlaced one, an EXIF-rotated one."""
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    base = Image.fromarray(rgb)

    def saved(image: Image.Image, **options: object) -> bytes:
        out = io.BytesIO()
        image.save(out, "PNG", **options)
        return out.getvalue()

    exif = base.getexif()
    kinds = {"rgb": saved(base), "rgba": saved(base.convert("RGBA")), "grey": saved(base.convert("L")),
             "grey+alpha": saved(base.convert("LA")), "1-bit": saved(base.convert("1")),
             "palette 8-bit": saved(base.convert("P")), "palette 2-bit": saved(base.quantize(4), bits=2),
             "palette 4-bit": saved(base.quantize(16), bits=4),
             "grey 16-bit": saved(Image.fromarray(rng.integers(0, 400, (29, 31), dtype=np.uint16))),
             "interlaced": interlaced_png(rgb)}  # fmt: skip
    for orientation in range(2, 9):
        exif[0x0112] = orientation
        kinds[f"orientation {orientation}"] = saved(base, exif=exif)
    return kinds


def test_png_decoding_and_preprocessing_equal_the_python_runtime(tmp_path: Path) -> None:
    """Every PNG kind, and real photographs (matplotlib's PNGs; its JPEG as decoded pixels), through
    three processors (a fixed bicubic size, shortest edge + centre crop, bilinear upscaling): the
    JavaScript pixel values equal the Python runtime's to the last bit."""
    from edgeattn.families.vision.bundle import pillow_major

    files = {name: data for name, data in png_kinds().items()}
    for path in sample_photos():
        if path.suffix == ".png":
            files[path.name] = path.read_bytes()
    photo = np.asarray(open_image(sample_photos()[0]))  # the JPEG, decoded by Pillow
    processors = [ImagePreprocessing(size={"height": 48, "width": 40}, resample=3),
                  ImagePreprocessing(size={"shortest_edge": 36}, do_center_crop=True, resample=3,
                                     crop_size={"height": 30, "width": 30}, image_mean=[0.485, 0.456, 0.406],
                                     image_std=[0.229, 0.224, 0.225]),
                  ImagePreprocessing(size={"height": 700, "width": 650}, resample=2)]  # fmt: skip
    items = []
    for k, (name, data) in enumerate([*files.items(), ("grace_hopper pixels", photo)]):
        path = tmp_path / f"image{k}"
        path.write_bytes(data if isinstance(data, bytes) else data.tobytes())
        items.append({"name": name, "file": str(path),
                      "pixels": list(data.shape[:2]) if isinstance(data, np.ndarray) else None})  # fmt: skip
    settings = [{**p.to_dict(), "pillow": pillow_major()} for p in processors]
    got = node_run(f"""
const items = {json.dumps(items)};
const settings = {json.dumps(settings)};
const out = {{}};
for (const item of items) {{
  const bytes = new Uint8Array(readFileSync(item.file));
  const input = item.pixels ? {{ data: bytes, width: item.pixels[1], height: item.pixels[0] }} : bytes;
  out[item.name] = [];
  for (const [k, pre] of settings.entries()) {{
    const {{ data, height, width }} = await images.preprocess(input, pre);
    writeFileSync(`${{item.file}}.${{k}}`, new Uint8Array(data.buffer));
    out[item.name].push([height, width]);
  }}
}}
console.log(JSON.stringify(out));
""", tmp_path)  # fmt: skip
    for k, item in enumerate(items):
        source = photo if item["pixels"] else item["file"]
        for j, pre in enumerate(processors):
            want = pre(source)
            have = np.frombuffer((tmp_path / f"image{k}.{j}").read_bytes(), dtype="<f4")
            assert got[item["name"]][j] == list(want.shape[1:]), (item["name"], j)
            assert np.array_equal(want.reshape(-1), have), (item["name"], j, np.abs(want.reshape(-1) - have).max())


def test_hostile_images_are_refused_in_one_line_before_they_are_inflated(tmp_path: Path) -> None:
    """A PNG declaring 100k x 100k pixels (refused from its header, naming the limit), a truncated one,
    damaged pixel data, zero bytes, a text file, a JPEG under Node.js (no decoder: pass pixels), pixels
    whose bytes do not fit their size, and a zero-sized image."""
    good = png_kinds()["rgb"]
    bomb = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0))
            + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 1000)) + _png_chunk(b"IEND", b""))  # fmt: skip
    damaged = bytearray(good)
    start = damaged.index(b"IDAT") + 4
    damaged[start:start + 40] = b"\xff" * 40
    jpeg = io.BytesIO()
    Image.new("RGB", (8, 8)).save(jpeg, "JPEG")
    cases = {"bomb": bomb, "truncated": good[: len(good) // 2], "damaged": bytes(damaged), "empty": b"",
             "text": b"hello, this is not an image", "jpeg": jpeg.getvalue()}  # fmt: skip
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    pre = ImagePreprocessing(size={"height": 8, "width": 8}).to_dict()
    got = node_run(f"""
const out = {{}};
const attempt = async (name, input) => {{
  try {{ await images.preprocess(input, {json.dumps(pre)}); out[name] = "accepted"; }}
  catch (error) {{ out[name] = `${{error.name}}: ${{error.message}}`; }}
}};
for (const name of {json.dumps(list(cases))}) await attempt(name, new Uint8Array(readFileSync("{tmp_path}/" + name)));
await attempt("short pixels", {{ data: new Uint8Array(10), width: 4, height: 4 }});
await attempt("zero-sized", {{ data: new Uint8Array(0), width: 0, height: 5 }});
await attempt("a number", 7);
console.log(JSON.stringify(out));
""", tmp_path)  # fmt: skip
    assert all(v.startswith("ImageError: edgeattn: ") and "\n" not in v for v in got.values()), got
    assert "100000 x 100000 pixels, over the limit of 64,000,000" in got["bomb"], got["bomb"]
    assert "before it is decoded" in got["bomb"]
    assert "damaged or truncated" in got["truncated"] and "damaged or truncated" in got["damaged"]
    assert "empty" in got["empty"] and "not an image" in got["text"]
    assert "is a JPEG" in got["jpeg"] and "{data, width, height}" in got["jpeg"]
    assert "not 4 x 4 pixels" in got["short pixels"] and "at least one" in got["zero-sized"]
