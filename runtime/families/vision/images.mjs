// Images in, pixel values out, in JavaScript: what edgeattn's Python runtime does with Pillow,
// value for value. PNG is decoded here (every colour type and bit depth, interlaced or not, its
// EXIF orientation), hostile files refused before anything is inflated; other formats come decoded
// ({data, width, height}: an ImageData, or RGB / RGBA / grey bytes) or, in a browser, through its
// own decoder. The resize is Pillow's (its filters' weights in 22-bit fixed point, a horizontal then a
// vertical pass over 8-bit rows), then transformers' centre crop, float64 rescale and float32
// normalisation, so that the pixel values equal the Python runtime's to the last bit.
//
//   import { preprocess } from "./images.mjs";
//   const { data, height, width } = await preprocess(pngBytes, bundle.preprocessing);

/** The most pixels an image may declare unless the bundle says otherwise (the Python runtime's). */
export const MAX_PIXELS = 64_000_000;

const PNG_SIGNATURE = [137, 80, 78, 71, 13, 10, 26, 10];

/** An error about an input image: one line a user can act on. */
export class ImageError extends Error {
  constructor(message) {
    super(`edgeattn: ${message}`);
    this.name = "ImageError";
  }
}

/** The format of encoded bytes by their first ones, or null. */
export function sniff(bytes) {
  const starts = (sig) => sig.every((b, i) => bytes[i] === b);
  if (starts(PNG_SIGNATURE)) return "PNG";
  if (starts([0xff, 0xd8, 0xff])) return "JPEG";
  if (starts([0x47, 0x49, 0x46, 0x38])) return "GIF";
  if (starts([0x52, 0x49, 0x46, 0x46]) && bytes.length >= 12 && String.fromCharCode(...bytes.slice(8, 12)) === "WEBP") return "WEBP";
  if (starts([0x42, 0x4d])) return "BMP";
  return null;
}

function checkSize(width, height, name, maxPixels) {
  if (!(width >= 1 && height >= 1)) throw new ImageError(`${name} is ${width} x ${height} pixels: an image has at least one`);
  if (width * height > maxPixels) {
    throw new ImageError(`${name} declares ${width} x ${height} pixels, over the limit of ${maxPixels.toLocaleString("en-US")} ` +
      "(a decompression bomb is refused before it is decoded; maxPixels sets the limit)");
  }
}

async function inflate(bytes, name) {
  try {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  } catch (error) {
    throw new ImageError(`${name} is damaged or truncated: its compressed pixels do not inflate (${error.message})`);
  }
}

function paeth(a, b, c) {
  const p = a + b - c;
  const pa = Math.abs(p - a);
  const pb = Math.abs(p - b);
  const pc = Math.abs(p - c);
  if (pa <= pb && pa <= pc) return a;
  return pb <= pc ? b : c;
}

/** Undo PNG's row filters of one (sub-)image in place; the rows' bytes without their filter bytes. */
function unfilter(raw, at, width, height, bitsPerPixel, name) {
  const stride = Math.ceil((width * bitsPerPixel) / 8);
  const bpp = Math.max(1, bitsPerPixel >> 3);
  const out = new Uint8Array(stride * height);
  if (raw.length < at + (stride + 1) * height) throw new ImageError(`${name} is damaged or truncated: it holds fewer rows than it declares`);
  for (let y = 0; y < height; y++) {
    const type = raw[at + y * (stride + 1)];
    const row = raw.subarray(at + y * (stride + 1) + 1, at + (y + 1) * (stride + 1));
    const o = y * stride;
    for (let x = 0; x < stride; x++) {
      const a = x >= bpp ? out[o + x - bpp] : 0;
      const b = y > 0 ? out[o - stride + x] : 0;
      const c = x >= bpp && y > 0 ? out[o - stride + x - bpp] : 0;
      let v = row[x];
      if (type === 1) v += a;
      else if (type === 2) v += b;
      else if (type === 3) v += (a + b) >> 1;
      else if (type === 4) v += paeth(a, b, c);
      else if (type !== 0) throw new ImageError(`${name} is damaged: row filter ${type} is not one PNG has`);
      out[o + x] = v & 255;
    }
  }
  return { rows: out, stride, used: (stride + 1) * height };
}

/** Sample k of a row of packed samples at `depth` bits (1, 2, 4, 8, 16: 16 bits read big-endian). */
function sample(rows, rowStart, k, depth) {
  if (depth === 8) return rows[rowStart + k];
  if (depth === 16) return (rows[rowStart + 2 * k] << 8) | rows[rowStart + 2 * k + 1];
  const bit = k * depth;
  return (rows[rowStart + (bit >> 3)] >> (8 - depth - (bit & 7))) & ((1 << depth) - 1);
}

/**
 * One pixel of a PNG as Pillow's convert("RGB") makes it: grey of 1, 2 and 4 bits scaled to 8, 16-bit
 * grey clipped at 255 (Pillow's I;16), 16-bit colour by its high byte, alpha dropped, a palette looked up.
 */
function pngToRgb(rows, stride, width, height, header, palette, out, place) {
  const { depth, colorType } = header;
  const channels = { 0: 1, 2: 3, 3: 1, 4: 2, 6: 4 }[colorType];
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const [oy, ox] = place(y, x);
      const o = (oy * header.width + ox) * 3;
      if (colorType === 3) {
        const i = sample(rows, y * stride, x, depth) * 3;
        out[o] = palette[i] ?? 0;
        out[o + 1] = palette[i + 1] ?? 0;
        out[o + 2] = palette[i + 2] ?? 0;
        continue;
      }
      if (colorType === 0 || colorType === 4) {
        let v = sample(rows, y * stride, x * channels, depth);
        if (depth === 16) v = colorType === 0 ? Math.min(v, 255) : v >> 8;
        else if (depth < 8) v = depth === 1 ? v * 255 : depth === 2 ? v * 85 : v * 17;
        out[o] = out[o + 1] = out[o + 2] = v;
        continue;
      }
      for (let c = 0; c < 3; c++) {
        const v = sample(rows, y * stride, x * channels + c, depth);
        out[o + c] = depth === 16 ? v >> 8 : v;
      }
    }
  }
}

/** Adam7's passes: first column and row, and the steps between them. */
const ADAM7 = [[0, 0, 8, 8], [4, 0, 8, 8], [0, 4, 4, 8], [2, 0, 4, 4], [0, 2, 2, 4], [1, 0, 2, 2], [0, 1, 1, 2]];

/** A PNG's pixels as RGB bytes {data, width, height, channels: 3, orientation}. */
export async function decodePng(bytes, { name = "the image", maxPixels = MAX_PIXELS } = {}) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let at = 8;
  let header = null;
  let palette = new Uint8Array(0);
  let orientation = 1;
  const idat = [];
  let ended = false;
  while (at + 8 <= bytes.length) {
    const length = view.getUint32(at);
    const type = String.fromCharCode(...bytes.subarray(at + 4, at + 8));
    if (at + 12 + length > bytes.length) break;
    const data = bytes.subarray(at + 8, at + 8 + length);
    if (type === "IHDR") {
      if (length < 13) throw new ImageError(`${name} is damaged: its PNG header is short`);
      header = { width: view.getUint32(at + 8), height: view.getUint32(at + 12), depth: data[8], colorType: data[9],
                 interlace: data[12] };
      checkSize(header.width, header.height, name, maxPixels);
      const depths = { 0: [1, 2, 4, 8, 16], 2: [8, 16], 3: [1, 2, 4, 8], 4: [8, 16], 6: [8, 16] }[header.colorType];
      if (!depths?.includes(header.depth)) {
        throw new ImageError(`${name} is damaged: colour type ${header.colorType} at ${header.depth} bits is not one PNG has`);
      }
    } else if (type === "PLTE") palette = data.slice();
    else if (type === "IDAT") idat.push(data);
    else if (type === "eXIf") orientation = exifOrientation(data);
    else if (type === "IEND") {
      ended = true;
      break;
    }
    at += 12 + length;
  }
  if (!header) throw new ImageError(`${name} is damaged or truncated: it has no PNG header`);
  if (!idat.length) throw new ImageError(`${name} is damaged or truncated: it holds no pixel data`);
  if (header.colorType === 3 && !palette.length) throw new ImageError(`${name} is damaged: a palette image without its palette`);
  const joined = new Uint8Array(idat.reduce((s, d) => s + d.length, 0));
  idat.reduce((o, d) => (joined.set(d, o), o + d.length), 0);
  const raw = await inflate(joined, name);
  if (!ended && raw.length === 0) throw new ImageError(`${name} is damaged or truncated`);
  const channels = { 0: 1, 2: 3, 3: 1, 4: 2, 6: 4 }[header.colorType];
  const bits = channels * header.depth;
  const { width, height } = header;
  const out = new Uint8Array(width * height * 3);
  if (!header.interlace) {
    const { rows, stride } = unfilter(raw, 0, width, height, bits, name);
    pngToRgb(rows, stride, width, height, header, palette, out, (y, x) => [y, x]);
  } else {
    let offset = 0;
    for (const [x0, y0, dx, dy] of ADAM7) {
      const w = Math.ceil((width - x0) / dx);
      const h = Math.ceil((height - y0) / dy);
      if (w <= 0 || h <= 0) continue;
      const { rows, stride, used } = unfilter(raw, offset, w, h, bits, name);
      offset += used;
      pngToRgb(rows, stride, w, h, header, palette, out, (y, x) => [y0 + y * dy, x0 + x * dx]);
    }
  }
  return { data: out, width, height, channels: 3, orientation };
}

/** The orientation (1..8) an EXIF block (TIFF-headed, as PNG's eXIf or after JPEG's "Exif\0\0") gives. */
export function exifOrientation(block) {
  if (block.length < 8) return 1;
  const view = new DataView(block.buffer, block.byteOffset, block.byteLength);
  const little = block[0] === 0x49 && block[1] === 0x49;
  if (!little && !(block[0] === 0x4d && block[1] === 0x4d)) return 1;
  const ifd = view.getUint32(4, little);
  if (ifd + 2 > block.length) return 1;
  const count = view.getUint16(ifd, little);
  for (let k = 0; k < count; k++) {
    const entry = ifd + 2 + 12 * k;
    if (entry + 12 > block.length) break;
    if (view.getUint16(entry, little) === 0x0112) {
      const value = view.getUint16(entry + 8, little);
      return value >= 1 && value <= 8 ? value : 1;
    }
  }
  return 1;
}

/** RGB pixels turned upright as their EXIF orientation says (Pillow's ImageOps.exif_transpose). */
export function applyOrientation(image) {
  const o = image.orientation ?? 1;
  if (o === 1) return image;
  const { data, width: w, height: h } = image;
  const swap = o >= 5;
  const W = swap ? h : w;
  const H = swap ? w : h;
  const out = new Uint8Array(W * H * 3);
  for (let y = 0; y < H; y++) {
    for (let x = 0; x < W; x++) {
      let sx;
      let sy; // the source pixel of output (x, y)
      if (o === 2) [sx, sy] = [w - 1 - x, y];
      else if (o === 3) [sx, sy] = [w - 1 - x, h - 1 - y];
      else if (o === 4) [sx, sy] = [x, h - 1 - y];
      else if (o === 5) [sx, sy] = [y, x];
      else if (o === 6) [sx, sy] = [y, h - 1 - x];
      else if (o === 7) [sx, sy] = [w - 1 - y, h - 1 - x];
      else [sx, sy] = [w - 1 - y, x];
      const s = (sy * w + sx) * 3;
      out.set(data.subarray(s, s + 3), (y * W + x) * 3);
    }
  }
  return { data: out, width: W, height: H, channels: 3, orientation: 1 };
}

// ---------------------------------------------------------------------------------------- resize
const FILTERS = {
  1: { support: 3, weight: (x) => (x >= -3 && x < 3 ? sinc(x) * sinc(x / 3) : 0) }, // lanczos
  2: { support: 1, weight: (x) => (Math.abs(x) < 1 ? 1 - Math.abs(x) : 0) }, // bilinear
  3: { support: 2, weight: bicubic },
  4: { support: 0.5, weight: (x) => (x > -0.5 && x <= 0.5 ? 1 : 0) }, // box
  5: { support: 1, weight: hamming },
};
const HAMMING_A = Math.fround(0.54);
const HAMMING_B = Math.fround(0.46);
/** Bits of the fixed-point weights Pillow resizes 8-bit images with. */
const PRECISION_BITS = 22;

function sinc(x) {
  if (x === 0) return 1;
  const t = x * Math.PI;
  return Math.sin(t) / t;
}

function bicubic(x) {
  const a = -0.5;
  const t = Math.abs(x);
  if (t < 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return (((t - 5) * t + 8) * t - 4) * a;
  return 0;
}

function hamming(x) {
  let t = Math.abs(x);
  if (t === 0) return 1;
  if (t >= 1) return 0;
  t *= Math.PI;
  return (Math.sin(t) / t) * (HAMMING_A + HAMMING_B * Math.cos(t));
}

/** Each output position's first input, count and fixed-point weights, for `inSize` -> `outSize`. */
function weights(inSize, outSize, filter) {
  const scale = inSize / outSize;
  const filterScale = Math.max(scale, 1);
  const support = filter.support * filterScale;
  const size = Math.ceil(support) * 2 + 1;
  const first = new Int32Array(outSize);
  const count = new Int32Array(outSize);
  const fixed = new Int32Array(outSize * size);
  for (let o = 0; o < outSize; o++) {
    const center = (o + 0.5) * scale;
    const lo = Math.max(Math.trunc(center - support + 0.5), 0);
    const hi = Math.min(Math.trunc(center + support + 0.5), inSize) - lo;
    const w = new Float64Array(Math.max(hi, 0));
    const step = 1 / filterScale;
    let total = 0;
    for (let k = 0; k < hi; k++) {
      w[k] = filter.weight((k + lo - center + 0.5) * step);
      total += w[k];
    }
    for (let k = 0; k < hi; k++) {
      const v = total !== 0 ? w[k] / total : w[k];
      fixed[o * size + k] = Math.trunc(v < 0 ? -0.5 + v * (1 << PRECISION_BITS) : 0.5 + v * (1 << PRECISION_BITS));
    }
    first[o] = lo;
    count[o] = hi;
  }
  return { first, count, fixed, size };
}

function clip8(sum) {
  const v = sum >> PRECISION_BITS;
  return v < 0 ? 0 : v > 255 ? 255 : v;
}

/** One pass of Pillow's resample along the image's width (`horizontal`) or height. */
function pass(image, size, filter, horizontal) {
  const { data, width: w, height: h } = image;
  const outW = horizontal ? size : w;
  const outH = horizontal ? h : size;
  const { first, count, fixed, size: taps } = weights(horizontal ? w : h, size, filter);
  const half = 1 << (PRECISION_BITS - 1);
  const step = horizontal ? 3 : w * 3; // bytes between one input of a sum and the next
  const out = new Uint8Array(outW * outH * 3);
  for (let y = 0; y < outH; y++) {
    for (let x = 0; x < outW; x++) {
      const o = horizontal ? x : y;
      let r = half;
      let g = half;
      let b = half;
      let s = horizontal ? (y * w + first[o]) * 3 : (first[o] * w + x) * 3;
      for (let k = 0; k < count[o]; k++, s += step) {
        const c = fixed[o * taps + k];
        r += data[s] * c;
        g += data[s + 1] * c;
        b += data[s + 2] * c;
      }
      const at = (y * outW + x) * 3;
      out[at] = clip8(r);
      out[at + 1] = clip8(g);
      out[at + 2] = clip8(b);
    }
  }
  return { data: out, width: outW, height: outH, channels: 3 };
}

/**
 * RGB bytes resized by Pillow's filter `resample` (0 nearest .. 5 hamming), as Image.resize does:
 * a horizontal then a vertical pass, or (Pillow 13 on, `pillow` its major version) the vertical pass
 * first where the height shrinks by more than twice what the width does.
 */
export function resize(image, width, height, resample, pillow = 13) {
  const { width: w, height: h } = image;
  if (w === width && h === height) return image;
  if (resample === 0) return nearest(image, width, height);
  const filter = FILTERS[resample];
  if (!filter) throw new ImageError(`resample ${resample} is not one of Pillow's filters (0..5)`);
  const verticalFirst = pillow >= 13 && h - height > 0 && h - height > (w - width) * 2;
  let out = image;
  if (verticalFirst && height !== h) out = pass(out, height, filter, false);
  if (width !== w) out = pass(out, width, filter, true);
  if (!verticalFirst && height !== h) out = pass(out, height, filter, false);
  return out;
}

/** Pillow's nearest-neighbour resize: each output pixel takes the input one under its centre. */
function nearest(image, width, height) {
  const { data, width: w, height: h } = image;
  const pick = (inSize, outSize) => {
    const step = inSize / outSize;
    const at = new Int32Array(outSize);
    let position = step * 0.5;
    for (let o = 0; o < outSize; o++, position += step) at[o] = Math.min(Math.trunc(position), inSize - 1);
    return at;
  };
  const xs = pick(w, width);
  const ys = pick(h, height);
  const out = new Uint8Array(width * height * 3);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const s = (ys[y] * w + xs[x]) * 3;
      out.set(data.subarray(s, s + 3), (y * width + x) * 3);
    }
  }
  return { data: out, width, height, channels: 3 };
}

// ---------------------------------------------------------------------------------- preprocessing
/** transformers' resize target for an image of `height` x `width` (a fixed size, or the shorter edge). */
export function resizedSize(pre, height, width) {
  if (pre.size.shortest_edge !== undefined) {
    const short = Math.min(width, height);
    const long = Math.max(width, height);
    const newShort = pre.size.shortest_edge;
    const newLong = Math.trunc((newShort * long) / short);
    return width <= height ? [newLong, newShort] : [newShort, newLong];
  }
  return [pre.size.height, pre.size.width];
}

/** The centre `height` x `width` of RGB pixels, padded with zeros where they are smaller (transformers'). */
export function centerCrop(image, height, width) {
  const { data, width: w, height: h } = image;
  const H = Math.max(h, height);
  const W = Math.max(w, width);
  const padTop = Math.trunc((H - h) / 2);
  const padLeft = Math.trunc((W - w) / 2);
  const top = Math.floor((h - height) / 2) + padTop;
  const left = Math.floor((w - width) / 2) + padLeft;
  const out = new Uint8Array(width * height * 3);
  for (let y = 0; y < height; y++) {
    const sy = top + y - padTop;
    if (sy < 0 || sy >= h) continue;
    for (let x = 0; x < width; x++) {
      const sx = left + x - padLeft;
      if (sx < 0 || sx >= w) continue;
      const s = (sy * w + sx) * 3;
      out.set(data.subarray(s, s + 3), (y * width + x) * 3);
    }
  }
  return { data: out, width, height, channels: 3 };
}

/** Decoded pixels {data, width, height} of 1 (grey), 3 (RGB) or 4 (RGBA, alpha dropped) channels as RGB. */
export function toRgb(pixels, name = "the image", maxPixels = MAX_PIXELS) {
  const { data, width, height } = pixels;
  if (!(data?.length >= 0) || !Number.isInteger(width) || !Number.isInteger(height)) {
    throw new ImageError(`${name}: decoded pixels are {data, width, height} with data of bytes`);
  }
  checkSize(width, height, name, maxPixels);
  const channels = pixels.channels ?? data.length / (width * height);
  if (![1, 3, 4].includes(channels) || data.length !== width * height * channels) {
    throw new ImageError(`${name}: ${data.length} bytes are not ${width} x ${height} pixels of 1, 3 or 4 channels`);
  }
  if (channels === 3) return { data: Uint8Array.from(data), width, height, channels: 3, orientation: pixels.orientation };
  const out = new Uint8Array(width * height * 3);
  for (let p = 0; p < width * height; p++) {
    for (let c = 0; c < 3; c++) out[p * 3 + c] = data[p * channels + (channels === 1 ? 0 : c)];
  }
  return { data: out, width, height, channels: 3, orientation: pixels.orientation };
}

/** RGB pixels of an image: encoded bytes (PNG here; others by the browser), a Blob, or decoded pixels. */
export async function decode(image, { name = "the image", maxPixels = MAX_PIXELS } = {}) {
  if (image instanceof ArrayBuffer) image = new Uint8Array(image);
  if (typeof Blob !== "undefined" && image instanceof Blob) {
    const head = new Uint8Array(await image.slice(0, 16).arrayBuffer());
    if (sniff(head) === "PNG") image = new Uint8Array(await image.arrayBuffer());
    else return applyOrientation(toRgb(await decodeByBrowser(image, name, sniff(head)), name, maxPixels));
  }
  if (image instanceof Uint8Array) {
    if (image.length === 0) throw new ImageError(`${name} is empty: 0 bytes`);
    const format = sniff(image);
    if (format === "PNG") return applyOrientation(await decodePng(image, { name, maxPixels }));
    if (format === null) throw new ImageError(`${name} is not an image edgeattn reads (JPEG, PNG, WEBP, GIF, BMP)`);
    if (typeof createImageBitmap === "undefined") {
      throw new ImageError(`${name} is a ${format}: edgeattn's JavaScript decodes PNG itself and other formats with ` +
        "a browser's decoder; here decode it yourself and pass {data, width, height}");
    }
    return applyOrientation(toRgb(await decodeByBrowser(new Blob([image]), name, format), name, maxPixels));
  }
  if (typeof ImageBitmap !== "undefined" && (image instanceof ImageBitmap || image?.tagName === "IMG"
      || image?.tagName === "CANVAS")) {
    return toRgb(canvasPixels(image, image.naturalWidth ?? image.width, image.naturalHeight ?? image.height), name, maxPixels);
  }
  if (image && typeof image === "object" && "data" in image && "width" in image) {
    return applyOrientation(toRgb(image, name, maxPixels));
  }
  throw new ImageError(`an image is encoded bytes (Uint8Array, ArrayBuffer, Blob) or decoded pixels {data, width, height}; got ${typeof image}`);
}

/** A browser's decoding of an encoded image (orientation applied by it), as RGBA pixels. */
async function decodeByBrowser(blob, name, format) {
  let bitmap;
  try {
    bitmap = await createImageBitmap(blob, { imageOrientation: "from-image", premultiplyAlpha: "none",
                                             colorSpaceConversion: "none" });
  } catch (error) {
    throw new ImageError(`${name} (${format ?? "unknown format"}) is damaged or not an image the browser decodes: ${error.message}`);
  }
  return canvasPixels(bitmap, bitmap.width, bitmap.height);
}

function canvasPixels(source, width, height) {
  const canvas = new OffscreenCanvas(width, height);
  const context = canvas.getContext("2d");
  context.drawImage(source, 0, 0);
  const { data } = context.getImageData(0, 0, width, height);
  return { data, width, height, channels: 4 };
}

/**
 * RGB pixels as the model's float32 pixel values {data (channels x height x width), height, width}:
 * resized, centre-cropped, rescaled in float64 and normalised in float32 as `pre` (the export's
 * preprocessing settings) says.
 */
export function pixelValues(rgb, pre) {
  let image = rgb;
  if (pre.do_resize) {
    const [height, width] = resizedSize(pre, image.height, image.width);
    image = resize(image, width, height, pre.resample, pre.pillow ?? 13);
  }
  if (pre.do_center_crop) image = centerCrop(image, pre.crop_size.height, pre.crop_size.width);
  const { data, width, height } = image;
  const plane = width * height;
  const out = new Float32Array(3 * plane);
  const mean = pre.image_mean.map(Math.fround);
  const std = pre.image_std.map(Math.fround);
  if (pre.do_normalize && mean.length !== 3) throw new ImageError(`the image has 3 channels, the model's normalisation ${mean.length}`);
  for (let p = 0; p < plane; p++) {
    for (let c = 0; c < 3; c++) {
      let v = data[p * 3 + c];
      if (pre.do_rescale) v = Math.fround(v * pre.rescale_factor);
      if (pre.do_normalize) v = Math.fround(Math.fround(v - mean[c]) / std[c]);
      out[c * plane + p] = v;
    }
  }
  return { data: out, height, width };
}

/** One image (see decode) as the model's pixel values. */
export async function preprocess(image, pre, { name = "the image", maxPixels = MAX_PIXELS } = {}) {
  return pixelValues(await decode(image, { name, maxPixels }), pre);
}
