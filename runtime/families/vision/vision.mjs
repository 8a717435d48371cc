// edgeattn's vision bundle (ViT, DINOv2, CLIP, SigLIP) for the browser and Node.js: images in,
// embeddings, labels or zero-shot scores out, as edgeattn's Python runtime gives them. Images are
// decoded and preprocessed by images.mjs (pixel values equal to the Python runtime's); the vision
// encoder runs on them, and for CLIP / SigLIP the text tower on labels. load() in edgeattn.mjs
// returns a VisionModel.
//
//   const model = await load("./bundle/", ort);
//   const [vector] = await model.embed([pngBytes]);                 // Float32Array
//   const [best] = await model.classify([{ data, width, height }]);  // {label, score, scores}
//   const [scores] = await model.zeroShot([blob], ["a cat", "a dog"]);
import { BundleModel, classifications } from "./edgeattn.mjs";
import { MAX_PIXELS, decode, pixelValues } from "./images.mjs";

/** The model load() returns for a vision bundle. */
export async function open({ bundle, file, tokenizer, sessions, ort }) {
  return new VisionModel(bundle, file, tokenizer, sessions, ort);
}

function imageList(images) {
  const list = Array.isArray(images) ? images : [images];
  if (list.length === 0) throw new Error("edgeattn: give at least one image");
  return list;
}

function normalised(vector) {
  const norm = Math.sqrt(vector.reduce((s, v) => s + v * v, 0));
  return Float64Array.from(vector, (v) => v / norm);
}

/** A vision model: images (encoded bytes, Blobs or decoded pixels) in, embeddings and labels out. */
export class VisionModel extends BundleModel {
  constructor(bundle, file, tokenizer, sessions, ort) {
    super(bundle, file, tokenizer, sessions[file.graph], ort);
    this.sessions = sessions;
    this.preprocessing = bundle.preprocessing; // the export's, as the Python runtime reads it
    this.vision = bundle.model;
    this.labels = bundle.labels;
    this.maxPixels = bundle.max_pixels ?? MAX_PIXELS;
  }

  /** {data: Float32Array (batch x channels x height x width), dims} of images, one size for all. */
  async pixelValues(images) {
    const values = [];
    for (const [i, image] of imageList(images).entries()) {
      const rgb = await decode(image, { name: `image ${i}`, maxPixels: this.maxPixels });
      values.push(pixelValues(rgb, this.preprocessing));
    }
    const { height, width } = values[0];
    if (values.some((v) => v.height !== height || v.width !== width)) {
      throw new Error("edgeattn: the images' pixel values differ in size and this model's preprocessing neither " +
        "resizes them to one size nor crops them: give one size at a time");
    }
    const plane = values[0].data.length;
    const data = new Float32Array(values.length * plane);
    values.forEach((v, i) => data.set(v.data, i * plane));
    return { data, dims: [values.length, 3, height, width] };
  }

  /** Every output of the vision encoder for pixel values ({data, dims}: batch x channels x height x width). */
  async encode(pixels) {
    const [, channels, height, width] = pixels.dims;
    const { channels: want, patch_size: patch } = this.vision;
    if (pixels.dims.length !== 4 || channels !== want) throw new Error(`edgeattn: pixel values are (batch, ${want}, height, width)`);
    if (Math.min(height, width) < patch) {
      throw new Error(`edgeattn: an image of ${height} x ${width} pixels is smaller than one ${patch}-pixel patch`);
    }
    const feeds = { pixel_values: new this.ort.Tensor("float32", pixels.data, pixels.dims) };
    return this.sessions[this.bundle.graphs.vision].run(feeds);
  }

  /** One embedding (Float32Array) per image: the pooled output, or its projection (CLIP, SigLIP). */
  async embed(images) {
    const out = await this.encode(await this.pixelValues(images));
    const tensor = out.image_embeds ?? out.pooler_output;
    const [batch, d] = tensor.dims;
    return Array.from({ length: batch }, (_, i) => tensor.data.slice(i * d, (i + 1) * d));
  }

  /** Each image's labels (a classifier): {label, score, scores}. */
  async classify(images) {
    if (this.vision.classifier === "none") throw new Error("edgeattn: this vision model has no classifier: embed its images instead");
    const { logits } = await this.encode(await this.pixelValues(images));
    const [batch, count] = logits.dims;
    return classifications(logits.data, batch, count, this.labels);
  }

  /** Token ids and mask of texts for the text tower, padded as the Python runtime pads them. */
  tokenizeTexts(texts, { truncate = true } = {}) {
    const text = this.vision.text;
    if (!text) throw new Error("edgeattn: this vision model has no text tower: it embeds images, not texts");
    if (!this.tokenizer) throw new Error("edgeattn: this bundle has no tokenizer.json for its text tower");
    const list = typeof texts === "string" ? [texts] : texts;
    if (!Array.isArray(list) || !list.length || !list.every((t) => typeof t === "string")) {
      throw new Error("edgeattn: give a text or a non-empty list of texts");
    }
    const rows = list.map((t) => this.tokenizer.encode(t).ids.map(Number));
    let width = Math.max(...rows.map((r) => r.length));
    if (text.pool === "last") width = Math.max(width, text.max_len);
    const lengths = rows.map((r) => r.length);
    if (width > text.max_len) {
      if (!truncate) throw new Error(`edgeattn: a text of ${width} tokens is more than the text tower's ${text.max_len}`);
      rows.forEach((r, i) => {
        if (r.length > text.max_len) {
          const end = r[r.length - 1];
          r.length = text.max_len;
          if (text.pool === "eos") r[text.max_len - 1] = end; // the end token the tower pools
          lengths[i] = text.max_len;
        }
      });
      width = text.max_len;
    }
    const ids = new BigInt64Array(rows.length * width).fill(BigInt(text.pad_id));
    const mask = new BigInt64Array(rows.length * width);
    rows.forEach((r, i) => r.forEach((id, j) => {
      ids[i * width + j] = BigInt(id);
      mask[i * width + j] = 1n;
    }));
    return { ids, mask, batch: rows.length, width };
  }

  /** One embedding (Float32Array) per text in the space images are projected into (CLIP, SigLIP). */
  async embedText(texts, options) {
    const t = this.tokenizeTexts(texts, options);
    const dims = [t.batch, t.width];
    const { Tensor } = this.ort;
    const out = await this.sessions[this.bundle.graphs.text].run({ input_ids: new Tensor("int64", t.ids, dims),
                                                                    attention_mask: new Tensor("int64", t.mask, dims) });
    const [batch, d] = out.text_embeds.dims;
    return Array.from({ length: batch }, (_, i) => out.text_embeds.data.slice(i * d, (i + 1) * d));
  }

  /**
   * Each image's scores over `labels` (zero-shot: the cosine of its embedding to each label's text,
   * `template` filled with it, times the model's scale; CLIP's softmax, SigLIP's sigmoid after its bias).
   */
  async zeroShot(images, labels, { template = "a photo of {}" } = {}) {
    if (!Array.isArray(labels) || !labels.length || !labels.every((l) => typeof l === "string" && l.trim())) {
      throw new Error("edgeattn: labels are a non-empty list of non-empty strings");
    }
    if (!template.includes("{}")) throw new Error("edgeattn: template must hold {} where each label goes");
    const names = labels.map((l) => l.trim());
    const pictures = (await this.embed(images)).map(normalised);
    const words = (await this.embedText(names.map((n) => template.replace("{}", n)))).map(normalised);
    const { logit_scale: scale, logit_bias: bias, scores } = this.vision;
    const logits = pictures.map((p) => words.map((w) => scale * p.reduce((s, v, k) => s + v * w[k], 0) + bias));
    if (scores === "softmax") return classifications(logits.flat(), logits.length, names.length, names);
    return logits.map((row) => {
      const probs = row.map((v) => 1 / (1 + Math.exp(-v)));
      const best = probs.indexOf(Math.max(...probs));
      return { label: names[best], score: probs[best], scores: Object.fromEntries(names.map((n, k) => [n, probs[k]])) };
    });
  }
}
