// edgeattn's encoder bundle for the browser and Node.js: text in, embeddings / labels / hidden
// states out, as edgeattn's Python runtime gives them. An ES module with no build step; it needs
// an ONNX Runtime for JavaScript passed in (onnxruntime-web in a page, onnxruntime-node or
// onnxruntime-web in Node) and reads bundle.json, tokenizer.json and the model beside it.
//
//   import * as ort from "onnxruntime-node";            // or "onnxruntime-web"
//   import { load } from "./edgeattn.mjs";
//   const model = await load(new URL("./", import.meta.url), ort);
//   const vectors = await model.embed(["a sentence", "another"]);   // Float32Array per text
//   const labels = await model.classify(["a review"]);             // {label, score, scores}
import { Tokenizer } from "./tokenizers.min.mjs";

const IS_NODE = typeof process !== "undefined" && !!process.versions?.node;

async function readBytes(url) {
  if (IS_NODE && url.protocol === "file:") {
    const { readFile } = await import("node:fs/promises");
    return new Uint8Array(await readFile(url));
  }
  const response = await fetch(url);
  if (!response.ok) throw new Error(`edgeattn: cannot read ${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

async function readJson(url) {
  return JSON.parse(new TextDecoder().decode(await readBytes(url)));
}

function baseUrl(base) {
  if (base instanceof URL) return base;
  if (IS_NODE && !/^[a-z]+:/i.test(base)) {
    const path = base.endsWith("/") ? base : `${base}/`;
    return new URL(`file://${path.startsWith("/") ? "" : process.cwd() + "/"}${path}`);
  }
  return new URL(base.endsWith("/") ? base : `${base}/`, globalThis.location?.href);
}

/**
 * Session options: the given ones over edgeattn's defaults. int8 products with signed weights beyond
 * 7 bits saturate in the u8 x s8 kernels of x86 CPUs without VNNI (onnxruntime-node on an AVX2
 * machine: an int8 export made on a VNNI machine 0.025 off in its logits); ONNX Runtime's
 * `session.x64quantprecision` makes those weights unsigned, the same products without saturating
 * (nothing changes elsewhere; the wasm kernels do not saturate).
 */
export function createOptions(ort, executionProviders, sessionOptions = {}) {
  const extra = { ...(sessionOptions.extra ?? {}) };
  extra.session = { x64quantprecision: "1", ...(extra.session ?? {}) };
  return { executionProviders: executionProviders ?? [ort.env?.versions?.web ? "wasm" : "cpu"],
           ...sessionOptions, extra };
}

/** The bundle at `base` (a URL or, in Node, a directory path) on `ort`, at `precision`. */
export async function load(base, ort, { precision, executionProviders, sessionOptions = {} } = {}) {
  const root = baseUrl(base);
  const bundle = await readJson(new URL("bundle.json", root));
  const file = bundle.files.find((f) => f.precision === (precision ?? bundle.files[0].precision));
  if (!file) {
    const held = bundle.files.map((f) => f.precision).join(", ");
    throw new Error(`edgeattn: this bundle holds no ${precision} model (it has ${held})`);
  }
  const tokenizer = new Tokenizer(await readJson(new URL(bundle.tokenizer, root)), bundle.tokenizer_config);
  const session = await ort.InferenceSession.create(await readBytes(new URL(file.file, root)),
    createOptions(ort, executionProviders, sessionOptions));
  return new EncoderModel(bundle, file, tokenizer, session, ort);
}

export class EncoderModel {
  constructor(bundle, file, tokenizer, session, ort) {
    this.bundle = bundle;
    this.file = file;
    this.tokenizer = tokenizer;
    this.session = session;
    this.ort = ort;
    this.task = bundle.task;
    this.labels = bundle.labels;
  }

  /** Token ids, attention mask and token types of `texts`, padded on the right (as the Python runtime). */
  tokenize(texts, { truncate = false } = {}) {
    const list = typeof texts === "string" ? [texts] : texts;
    if (!Array.isArray(list) || list.length === 0 || !list.every((t) => typeof t === "string")) {
      throw new Error("edgeattn: give a text or a non-empty list of texts");
    }
    const { max_len: maxLen, pad_id: padId } = this.bundle.model;
    const rows = list.map((text, i) => {
      const encoded = this.tokenizer.encode(text, { return_token_type_ids: true });
      let ids = encoded.ids.map(Number);
      let types = (encoded.token_type_ids ?? ids.map(() => 0)).map(Number);
      let kept = ids.map((_, k) => k);
      if (ids.length > maxLen) {
        if (!truncate) {
          throw new Error(`edgeattn: text ${i} is ${ids.length} tokens long; this model takes at most ${maxLen}: ` +
            "shorten it or ask for truncation ({truncate: true})");
        }
        const tail = this.bundle.closing_special_tokens;
        const keep = [...Array(maxLen - tail).keys(), ...Array.from({ length: tail }, (_, k) => ids.length - tail + k)];
        ids = keep.map((k) => ids[k]);
        types = keep.map((k) => types[k]);
        kept = keep;
      }
      return { ids, types, kept };
    });
    const width = Math.max(...rows.map((r) => r.ids.length));
    const ids = new BigInt64Array(rows.length * width).fill(BigInt(padId));
    const mask = new BigInt64Array(rows.length * width);
    const types = new BigInt64Array(rows.length * width);
    rows.forEach((r, i) => r.ids.forEach((id, j) => {
      ids[i * width + j] = BigInt(id);
      mask[i * width + j] = 1n;
      types[i * width + j] = BigInt(r.types[j]);
    }));
    return { ids, mask, types, batch: rows.length, width, kept: rows.map((r) => r.kept) };
  }

  async run(tokens) {
    const { Tensor } = this.ort;
    const dims = [tokens.batch, tokens.width];
    const feeds = { input_ids: new Tensor("int64", tokens.ids, dims),
                    attention_mask: new Tensor("int64", tokens.mask, dims) };
    if (this.session.inputNames.includes("token_type_ids")) {
      feeds.token_type_ids = new Tensor("int64", tokens.types, dims);
    }
    return this.session.run(feeds);
  }

  /** Hidden states: one {data: Float32Array (tokens x d_model), tokens} per text, padding left out. */
  async encode(texts, options) {
    const tokens = this.tokenize(texts, options);
    const hidden = (await this.run(tokens)).last_hidden_state;
    const d = hidden.dims[2];
    return Array.from({ length: tokens.batch }, (_, i) => {
      let real = 0;
      for (let j = 0; j < tokens.width; j++) real += Number(tokens.mask[i * tokens.width + j]);
      return { tokens: real, data: hidden.data.slice(i * tokens.width * d, (i * tokens.width + real) * d) };
    });
  }

  /** One vector (Float32Array) per text, pooled and normalised as the export says. */
  async embed(texts, options) {
    const tokens = this.tokenize(texts, options);
    const hidden = (await this.run(tokens)).last_hidden_state;
    const [batch, width, d] = hidden.dims;
    const { mode, normalize } = this.bundle.pooling;
    return Array.from({ length: batch }, (_, i) => {
      const out = new Float64Array(d);
      if (mode === "cls") {
        for (let k = 0; k < d; k++) out[k] = hidden.data[i * width * d + k];
      } else if (mode === "max") {
        out.fill(-Infinity);
        for (let j = 0; j < width; j++) {
          if (tokens.mask[i * width + j] === 0n) continue;
          for (let k = 0; k < d; k++) out[k] = Math.max(out[k], hidden.data[(i * width + j) * d + k]);
        }
      } else {
        let count = 0;
        for (let j = 0; j < width; j++) {
          if (tokens.mask[i * width + j] === 0n) continue;
          count += 1;
          for (let k = 0; k < d; k++) out[k] += hidden.data[(i * width + j) * d + k];
        }
        for (let k = 0; k < d; k++) out[k] /= Math.max(count, 1);
      }
      if (normalize) {
        const norm = Math.max(Math.sqrt(out.reduce((s, v) => s + v * v, 0)), 1e-12);
        for (let k = 0; k < d; k++) out[k] /= norm;
      }
      return Float32Array.from(out);
    });
  }

  /**
   * Each text's entities (a token-classification head): {entity_group, score, word, start, end},
   * B-/I- tags merged as transformers' "simple" aggregation merges them, or each word labelled by
   * its first piece ({aggregation: "first"}); spans count characters (code points) of the text.
   */
  async tag(texts, { aggregation = "simple", truncate = false } = {}) {
    if (this.bundle.model.head !== "token") {
      throw new Error(`edgeattn: this model has no token-classification head (head=${this.bundle.model.head})`);
    }
    if (!["simple", "first"].includes(aggregation)) {
      throw new Error(`edgeattn: aggregation ${aggregation} is not one of simple, first`);
    }
    const list = typeof texts === "string" ? [texts] : texts;
    const tokens = this.tokenize(list, { truncate });
    const logits = (await this.run(tokens)).logits;
    const [, width, count] = logits.dims;
    const tagOf = (label) => (label.includes("-") ? label.slice(label.indexOf("-") + 1) : label);
    const split = (label) => (label.startsWith("B-") || label.startsWith("I-") ? [label[0], label.slice(2)]
      : ["I", label]);
    return list.map((text, i) => {
      const chars = Array.from(text);
      const all = this.pieces(text);
      const pieces = tokens.kept[i].map((k) => all[k]);
      const found = [];
      let previous = null;
      pieces.forEach((piece, k) => {
        if (piece.special) {
          previous = null;
          return;
        }
        if (aggregation === "first" && found.length && piece.word === previous) {
          found[found.length - 1].end = piece.end;  // a later piece widens its word's span
          return;
        }
        previous = piece.word;
        const row = Array.from(logits.data.slice((i * width + k) * count, (i * width + k + 1) * count), Number);
        const top = Math.max(...row);
        const exp = row.map((v) => Math.exp(v - top));
        const sum = exp.reduce((a, v) => a + v, 0);
        const best = exp.indexOf(Math.max(...exp));
        found.push({ label: this.labels[best], score: exp[best] / sum, start: piece.start, end: piece.end });
      });
      const groups = [];
      for (const token of found) {
        const [bi, tag] = split(token.label);
        const last = groups.at(-1);
        if (last && tag === split(last.at(-1).label)[1] && bi !== "B") last.push(token);
        else groups.push([token]);
      }
      return groups.filter((g) => tagOf(g[0].label) !== "O").map((g) => {
        const start = g[0].start, end = g.at(-1).end;
        return { entity_group: tagOf(g[0].label), score: g.reduce((a, t) => a + t.score, 0) / g.length,
                 word: chars.slice(start, end).join(""), start, end };
      });
    });
  }

  /**
   * Each token of `text` with its span (code points of the text), whether it is special, and its
   * word's index: WordPiece tokens aligned to the text as the Bert normalizer sees it (lowercased,
   * accents and control characters removed), as the Python tokenizers library gives offsets.
   */
  pieces(text) {
    const { specials, prefix, unk, lowercase, strip_accents: stripAccents } = this.bundle.tagging;
    const view = [];  // [normalized character, its character index in the text]
    Array.from(text).forEach((ch, index) => {
      if (ch === "\u0000" || ch === "\ufffd" || (/\p{Cc}/u.test(ch) && !/\s/u.test(ch))) return;
      let n = /\s/u.test(ch) ? " " : ch;
      if (lowercase) n = n.toLowerCase();
      if (stripAccents ?? lowercase) n = n.normalize("NFD").replace(/\p{Mn}/gu, "");
      for (const c of n) view.push([c, index]);
    });
    const isPunct = (c) => /[\p{P}\p{S}]/u.test(c);
    // the Bert pre-tokenizer's own words: a punctuation mark, or a CJK ideograph (handle_chinese_chars)
    const isCjk = (c) => /[\u4E00-\u9FFF\u3400-\u4DBF\uF900-\uFAFF\u{20000}-\u{2A6DF}\u{2A700}-\u{2B81F}\u{2B820}-\u{2CEAF}\u{2F800}-\u{2FA1F}]/u.test(c);
    const alone = (c) => isPunct(c) || isCjk(c);
    let cursor = 0;
    let word = -1;
    return this.tokenizer.encode(text).tokens.map((token) => {
      if (token !== unk && specials.includes(token)) return { special: true, start: 0, end: 0, word: null };
      while (cursor < view.length && view[cursor][0] === " ") cursor++;
      const continuing = !!prefix && token.startsWith(prefix) && token !== prefix;
      if (!continuing) word++;
      const start = cursor;
      if (token === unk) {  // a whole word the vocabulary lacks: up to the next space or punctuation
        if (cursor < view.length && alone(view[cursor][0])) cursor++;
        else while (cursor < view.length && view[cursor][0] !== " " && !alone(view[cursor][0])) cursor++;
      } else {
        for (const c of Array.from(continuing ? token.slice(prefix.length) : token)) {
          if (cursor < view.length && view[cursor][0] === c) cursor++;
        }
      }
      if (cursor === start) return { special: false, start: view[start]?.[1] ?? 0, end: view[start]?.[1] ?? 0, word };
      return { special: false, start: view[start][1], end: view[cursor - 1][1] + 1, word };
    });
  }

  /** One {label, score, scores} per text (a sequence-classification head). */
  async classify(texts, options) {
    if (this.bundle.model.head !== "sequence") {
      throw new Error(`edgeattn: this model has no sequence-classification head (head=${this.bundle.model.head})`);
    }
    const logits = (await this.run(this.tokenize(texts, options))).logits;
    const [batch, count] = logits.dims;
    return Array.from({ length: batch }, (_, i) => {
      const row = Array.from(logits.data.slice(i * count, (i + 1) * count), Number);
      const top = Math.max(...row);
      const exp = row.map((v) => Math.exp(v - top));
      const sum = exp.reduce((s, v) => s + v, 0);
      const probs = exp.map((v) => v / sum);
      const best = probs.indexOf(Math.max(...probs));
      const scores = Object.fromEntries(this.labels.map((name, k) => [name, probs[k]]));
      return { label: this.labels[best], score: probs[best], scores };
    });
  }
}
