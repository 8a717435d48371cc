// edgeattn's bundle for the browser and Node.js: text in, embeddings / labels / entities / hidden
// states out (an encoder), or continuations and chat answers (a language model), as edgeattn's
// Python runtime gives them. An ES module with no build step; it needs an ONNX Runtime for
// JavaScript passed in (onnxruntime-web in a page, onnxruntime-node or onnxruntime-web in Node) and
// reads bundle.json, tokenizer.json and the model beside it.
//
//   import * as ort from "onnxruntime-node";            // or "onnxruntime-web"
//   import { load } from "./edgeattn.mjs";
//   const model = await load(new URL("./", import.meta.url), ort);
//   const vectors = await model.embed(["a sentence", "another"]);   // Float32Array per text
//   const labels = await model.classify(["a review"]);             // {label, score, scores}
//   const [answer] = await model.generateText(["Once upon"], { maxNewTokens: 32 });  // a language model
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

/** The model file's bytes and its external data files (a graph over the browser's 2 GB limit is split). */
async function readModel(root, file) {
  const bytes = await readBytes(new URL(file.file, root));
  const externalData = [];
  for (const part of file.external_data ?? []) {
    externalData.push({ path: part.file.split("/").at(-1), data: await readBytes(new URL(part.file, root)) });
  }
  return { bytes, externalData };
}

/** A session over one of the bundle's files. */
async function createSession(ort, root, file, options) {
  if (IS_NODE && root.protocol === "file:" && !ort.env?.versions?.web) {
    // onnxruntime-node reads the file and its external data itself (no 2 GB Buffer in between)
    const { fileURLToPath } = await import("node:url");
    return ort.InferenceSession.create(fileURLToPath(new URL(file.file, root)), options);
  }
  const { bytes, externalData } = await readModel(root, file);
  return ort.InferenceSession.create(bytes, externalData.length ? { ...options, externalData } : options);
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
  if (executionProviders?.includes("webgpu") && file.webgpu?.runs === false) {
    throw new Error(`edgeattn: the ${file.precision} model does not run on WebGPU: ${file.webgpu.why}`);
  }
  const tokenizer = bundle.tokenizer ? new Tokenizer(await readJson(new URL(bundle.tokenizer, root)), bundle.tokenizer_config)
    : null; // a family whose inputs are not text may have none
  const options = createOptions(ort, executionProviders, sessionOptions);
  const session = await createSession(ort, root, file, options);
  if (bundle.task === "complete") {
    const template = bundle.chat_template ? await readJson(new URL(bundle.chat_template, root)) : null;
    return new CausalModel(bundle, file, tokenizer, session, ort, template);
  }
  const sessions = { [file.graph]: session };
  if (bundle.task === "generate" || bundle.module) { // every graph of the precision (the first above)
    for (const other of bundle.files.filter((f) => f.precision === file.precision && f.graph !== file.graph)) {
      sessions[other.graph] = await createSession(ort, root, other, options);
    }
  }
  if (bundle.module) { // a family whose JavaScript is a module of its own, beside this one (bundle.json names it)
    const family = await import(new URL(bundle.module, root).href);
    return family.open({ bundle, file, tokenizer, sessions, ort, root, readBytes, readJson });
  }
  if (bundle.task === "generate") return new Seq2SeqModel(bundle, file, tokenizer, sessions, ort);
  return new EncoderModel(bundle, file, tokenizer, session, ort);
}

/** What every bundle's model holds: its description (bundle.json), its file, tokenizer and session. */
export class BundleModel {
  constructor(bundle, file, tokenizer, session, ort) {
    this.bundle = bundle;
    this.file = file;
    this.tokenizer = tokenizer;
    this.session = session;
    this.ort = ort;
    this.task = bundle.task;
  }

  /** The text of token ids, special tokens left out. */
  decode(tokens) {
    return tokens.length ? this.tokenizer.decode(tokens, { skip_special_tokens: true }) : "";
  }

  /** Checked generation settings (a language model's or a seq2seq model's). */
  settings({ maxNewTokens = 64, strategy, temperature = 1, topK = 0, topP = 1, seed, repetitionPenalty = 1 } = {}) {
    const chosen = strategy ?? (temperature !== 1 || topK || topP < 1 || seed !== undefined ? "sample" : "greedy");
    if (!["greedy", "sample"].includes(chosen)) {
      throw new Error(`edgeattn: strategy ${chosen} is not greedy or sample (beam search is the Python runtime's)`);
    }
    if (!(maxNewTokens >= 1)) throw new Error("edgeattn: maxNewTokens must be at least 1");
    if (!(temperature > 0)) throw new Error("edgeattn: temperature must be positive");
    if (!(topP > 0 && topP <= 1)) throw new Error("edgeattn: topP must be in (0, 1]");
    if (!(repetitionPenalty > 0)) throw new Error("edgeattn: repetitionPenalty must be positive (1: off)");
    return { maxNewTokens, strategy: chosen, temperature, topK, topP, seed, repetitionPenalty };
  }
}

export class EncoderModel extends BundleModel {
  constructor(bundle, file, tokenizer, session, ort) {
    super(bundle, file, tokenizer, session, ort);
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
   * word's index, as the Python tokenizers library gives offsets and word ids: WordPiece tokens
   * aligned to the text as the Bert normalizer sees it (lowercased, accents and control characters
   * removed), byte-level BPE tokens (RoBERTa, GPT-2) by the bytes each one holds, or
   * SentencePiece-style tokens (XLM-R's Unigram, "\u2581" for a space) in the normalised text.
   */
  pieces(text) {
    const kind = this.bundle.tagging.kind;
    return kind === "bytelevel" ? this.bytePieces(text) : kind === "metaspace" ? this.metaPieces(text)
      : this.wordPieces(text);
  }

  /** Byte-level BPE: each pre-tokenized word's tokens from the model, placed by their UTF-8 bytes. */
  bytePieces(text) {
    const { specials, add_prefix_space: prefixSpace, trim_offsets: trim } = this.bundle.tagging;
    const chars = Array.from(text);
    const encoder = new TextEncoder();
    const charOfByte = [];  // the character each UTF-8 byte of the text belongs to
    chars.forEach((ch, i) => { for (let k = encoder.encode(ch).length; k > 0; k--) charOfByte.push(i); });
    const shift = prefixSpace && !text.startsWith(" ") ? 1 : 0;  // the space the pre-tokenizer adds
    const all = this.tokenizer.encode(text).tokens;
    const found = [];
    let cursor = 0;
    this.tokenizer.pre_tokenizer(text).forEach((word, w) => {
      for (const token of this.tokenizer.model([word])) {
        const symbols = Array.from(token);
        let start = cursor, end = cursor + symbols.length;
        cursor = end;
        if (trim) {  // offsets leave out the spaces a token begins or ends with (Python's trim_offsets)
          let lead = 0, tail = 0;
          while (lead < symbols.length && symbols[lead] === BYTE_SPACE) lead++;
          while (tail < symbols.length && symbols[symbols.length - 1 - tail] === BYTE_SPACE) tail++;
          start = Math.min(start + lead, end);
          end = Math.max(end - tail, start);
        }
        start = Math.max(start - shift, 0);
        end = Math.max(end - shift, start);
        const first = charOfByte[start] ?? chars.length;
        found.push({ special: false, start: first, end: end > start ? charOfByte[end - 1] + 1 : first, word: w });
      }
    });
    const out = [];
    let k = 0;
    for (const token of all) {
      if (specials.includes(token)) out.push({ special: true, start: 0, end: 0, word: null });
      else out.push(found[k++]);
    }
    if (k !== found.length || out.some((piece) => piece === undefined)) {
      throw new Error("edgeattn: the text's byte-level pieces do not match its tokens; tag it with the Python runtime");
    }
    return out;
  }

  /**
   * SentencePiece-style tokens ("\u2581" for a space, a word each): found in the text as the
   * tokenizer's normalizer sees it character by character (runs of spaces made one where it makes
   * them one, the last of the run kept), an unknown token spanning what lies before the next one.
   */
  metaPieces(text) {
    const { specials, unk, replacement, prepend, collapse_spaces: collapse } = this.bundle.tagging;
    const view = [];  // [normalized character, its character index in the text]
    Array.from(text).forEach((ch, index) => {
      const n = this.tokenizer.normalizer ? this.tokenizer.normalizer(ch) : ch;
      for (const c of n) {
        if (collapse && c === " " && view.at(-1)?.[0] === " ") view.pop();  // the run's last space stays
        view.push([c, index]);
      }
    });
    if (prepend && view.length && view[0][0] !== " ") view.unshift([" ", view[0][1]]);  // the space it adds
    const tokens = this.tokenizer.encode(text).tokens;
    const textOf = (token) => token.replaceAll(replacement, " ");
    const matches = (at, piece) => Array.from(piece).every((c, k) => view[at + k]?.[0] === c);
    let cursor = 0;
    let word = -1;
    return tokens.map((token, t) => {
      if (token !== unk && specials.includes(token)) return { special: true, start: 0, end: 0, word: null };
      const start = cursor;
      if (token === unk) {  // up to where the next known token's text begins
        const next = tokens.slice(t + 1).find((x) => x !== unk && !specials.includes(x));
        cursor++;
        if (next === undefined) {
          while (cursor < view.length && view[cursor][0] !== " ") cursor++;
        } else {
          while (cursor < view.length && !matches(cursor, textOf(next))) cursor++;
        }
      } else {
        const piece = Array.from(textOf(token));
        if (!matches(cursor, piece.join(""))) {
          throw new Error("edgeattn: the text's pieces could not be placed in it; tag it with the Python runtime");
        }
        cursor += piece.length;
      }
      if (view[start]?.[0] === " " || word < 0) word++;
      if (cursor === start) return { special: false, start: view[start]?.[1] ?? 0, end: view[start]?.[1] ?? 0, word };
      return { special: false, start: view[start][1], end: view[cursor - 1][1] + 1, word };
    });
  }

  /** WordPiece: each piece found in the text as the Bert normalizer sees it. */
  wordPieces(text) {
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
    return classifications(logits.data, logits.dims[0], logits.dims[1], this.labels);
  }
}

/** (batch x labels) logits as one {label, score, scores} a row: a softmax over each row's labels. */
export function classifications(logits, batch, count, labels) {
  return Array.from({ length: batch }, (_, i) => {
    const row = Array.from(logits.slice(i * count, (i + 1) * count), Number);
    const top = Math.max(...row);
    const exp = row.map((v) => Math.exp(v - top));
    const sum = exp.reduce((s, v) => s + v, 0);
    const probs = exp.map((v) => v / sum);
    const best = probs.indexOf(Math.max(...probs));
    const scores = Object.fromEntries(labels.map((name, k) => [name, probs[k]]));
    return { label: labels[best], score: probs[best], scores };
  });
}

/** A small seeded generator of uniform numbers in [0, 1) (mulberry32): sampling that repeats with a seed. */
export function uniform(seed) {
  let a = (seed ?? Math.floor(Math.random() * 2 ** 32)) >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Each row's next token: the largest logit (greedy), or one drawn from the filtered distribution. */
export function choose(row, { strategy, temperature, topK, topP }, random) {
  if (strategy === "greedy") {
    let best = 0;
    for (let k = 1; k < row.length; k++) if (row[k] > row[best]) best = k;
    return best;
  }
  // temperature, then the top-k tokens, then the smallest set whose probability reaches top-p
  const x = Array.from(row, (v) => v / temperature);
  if (topK && topK < x.length) {
    const kth = [...x].sort((a, b) => b - a)[topK - 1];
    for (let k = 0; k < x.length; k++) if (x[k] < kth) x[k] = -Infinity;
  }
  if (topP < 1) {
    const order = x.map((_, k) => k).sort((a, b) => x[b] - x[a] || a - b);
    const top = x[order[0]];
    const exp = order.map((k) => Math.exp(x[k] - top));
    const total = exp.reduce((s, v) => s + v, 0);
    let before = 0;
    order.forEach((k, r) => {
      if (before >= topP) x[k] = -Infinity;
      before += exp[r] / total;
    });
  }
  const top = Math.max(...x);
  const cdf = [];
  let sum = 0;
  for (const v of x) cdf.push((sum += Math.exp(v - top)));
  const u = random() * sum;
  let picked = 0;
  while (picked < cdf.length - 1 && cdf[picked] < u) picked++;
  return picked;
}

/**
 * Greedy or sampled decoding from the first logits (rows x vocab): yields each step's tokens (one a
 * row; the pad id for a row that already stopped) until every row stopped at one of the model's stop
 * ids or `cfg.maxNewTokens`; `next(tokens)` runs a step and gives its logits; `seen` (a list of ids a
 * row, or null) is where a repetition penalty starts (the tokens fed after the first step join it).
 */
async function* search(model, cfg, first, seen, next) {
  const { pad_id: padId, vocab_size: vocab } = model.bundle.model;
  const random = uniform(cfg.seed);
  const marks = seen && seen.map((ids) => {
    const s = new Uint8Array(vocab);
    for (const id of ids) s[id] = 1;
    return s;
  });
  const done = new Array(first.length).fill(false);
  let logits = first;
  for (let step = 0; step < cfg.maxNewTokens; step++) {
    if (marks) {
      logits = logits.map((row, i) => row.map((v, k) => (marks[i][k] ? (v > 0 ? v / cfg.repetitionPenalty
        : v * cfg.repetitionPenalty) : v)));
    }
    const tokens = logits.map((row, i) => (done[i] ? padId : choose(row, cfg, random)));
    yield tokens;
    tokens.forEach((t, i) => { if (model.stopIds.includes(t)) done[i] = true; });
    if (done.every(Boolean) || step + 1 === cfg.maxNewTokens) return;
    if (marks) tokens.forEach((t, i) => { marks[i][t] = 1; });
    logits = await next(tokens);
  }
}

/** The text up to the first stop string in it, or null when it holds none. */
function cutAtStop(text, stop) {
  const found = stop.filter((s) => s && text.includes(s)).map((s) => text.indexOf(s));
  return found.length ? text.slice(0, Math.min(...found)) : null;
}

/** How many characters at the end of `text` could begin a stop string (not shown yet). */
function heldBack(text, stop) {
  let held = 0;
  for (const s of stop) {
    for (let k = Math.min(s.length - 1, text.length); k > 0; k--) {
      if (text.endsWith(s.slice(0, k))) {
        held = Math.max(held, k);
        break;
      }
    }
  }
  return held;
}

/**
 * One answer's text as its tokens arrive (the stop token not among them), as the Python runtime's
 * AnswerText: add(token) gives what the token adds to the text shown so far, holding back an end
 * that could begin a stop string; once a stop string appears the answer is cut before it (stopped).
 * The pieces and finish()'s tail join to text.
 */
export class AnswerText {
  constructor(decode, stop = []) {
    this.decode = decode;
    this.stop = stop.filter(Boolean);
    this.tokens = [];
    this.shown = "";
    this.cut = null;
  }

  get stopped() { return this.cut !== null; }

  get text() { return this.cut ?? this.decode(this.tokens); }

  add(token, whole = false) {
    this.tokens.push(token);
    const text = this.decode(this.tokens);
    this.cut = cutAtStop(text, this.stop);
    if (this.cut !== null) return this.show(this.cut);
    return this.show(whole ? text : text.slice(0, text.length - heldBack(text, this.stop)));
  }

  finish() { return this.stopped ? "" : this.show(this.decode(this.tokens)); }

  show(shown) {
    if (!shown.startsWith(this.shown) || shown.length <= this.shown.length) return "";
    const piece = shown.slice(this.shown.length);
    this.shown = shown;
    return piece;
  }
}

/** Each row's answer {text, tokens} from `steps` (each step's tokens, one a row): up to a stop id or a stop string. */
async function collectAnswers(model, steps, rows, stop) {
  const answers = Array.from({ length: rows }, () => new AnswerText((t) => model.decode(t), stop));
  const ended = answers.map(() => false);
  for await (const tokens of steps) {
    tokens.forEach((t, i) => {
      if (ended[i]) return;
      if (model.stopIds.includes(t)) {
        ended[i] = true;
        return;
      }
      answers[i].add(t);
      ended[i] = answers[i].stopped;
    });
    if (ended.every(Boolean)) break;
  }
  return answers.map((a) => ({ text: a.text, tokens: a.tokens }));
}

/** One row's answer as it grows from `steps`: each piece what a token adds to its text (see AnswerText). */
async function* answerPieces(model, steps, stop) {
  const answer = new AnswerText((t) => model.decode(t), stop);
  for await (const [token] of steps) {
    if (model.stopIds.includes(token)) break;
    const piece = answer.add(token);
    if (piece) yield piece;
    if (answer.stopped) return;
  }
  const tail = answer.finish();
  if (tail) yield tail;
}

/**
 * A decoder graph's cache written in place, named by the bundle's contract (`names`: its inputs and,
 * in order, the outputs they are written back through): a tensor of zeros of `shape` per input;
 * after each run, take(out) makes the updated outputs the next run's inputs.
 */
export class SlotCache {
  constructor(ort, names, shape) {
    this.names = names;
    const size = shape.reduce((a, b) => a * b, 1);
    this.tensors = Object.fromEntries(names.inputs.map((name) => [name, new ort.Tensor(
      "float32", new Float32Array(size), shape)]));
  }

  take(out) {
    this.names.inputs.forEach((name, k) => { this.tensors[name] = out[this.names.outputs[k]]; });
  }

  /** Row i becomes what row index[i] held (beam search's reordering). */
  reorder(ort, index) {
    for (const [name, tensor] of Object.entries(this.tensors)) this.tensors[name] = gatherRows(ort, tensor, index);
  }
}

/** The rows `index` of a tensor (rows first), as a new tensor. */
function gatherRows(ort, tensor, index) {
  const size = tensor.data.length / tensor.dims[0];
  const data = new tensor.data.constructor(index.length * size);
  index.forEach((row, i) => data.set(tensor.data.subarray(row * size, (row + 1) * size), i * size));
  return new ort.Tensor(tensor.type, data, [index.length, ...tensor.dims.slice(1)]);
}

/** A crossSource whose one row is repeated `n` times (the beams of one window). */
export function repeatSource(model, source, n) {
  const index = Array.from({ length: n * source.rows }, (_, i) => Math.floor(i / n));
  const cross = Object.fromEntries(Object.entries(source.cross).map(([k, v]) => [k, gatherRows(model.ort, v, index)]));
  return { cross, rows: index.length, mask: gatherRows(model.ort, source.mask, index) };
}

/** Each row's logits (rows x vocab) at position `at` of a (rows x t x vocab) logits tensor. */
function rowLogits(logits, at) {
  const [rows, t, vocab] = logits.dims;
  return Array.from({ length: rows }, (_, i) => logits.data.slice((i * t + at) * vocab, (i * t + at + 1) * vocab));
}

/**
 * An encoder-decoder's source (seq2seq's text, a speech model's window): the encoder and the cross
 * projections run once on `encoderFeeds` (keyed by the contract's input roles); `mask` (rows x
 * positions, a tensor) marks the positions the decoder attends to (null: all of them).
 */
export async function crossSource(model, encoderFeeds, mask = null) {
  const c = model.bundle.contract;
  const feeds = Object.fromEntries(Object.entries(encoderFeeds).map(([role, v]) => [c.encoder.inputs[role], v]));
  const hidden = (await model.sessions[c.encoder.graph].run(feeds))[c.encoder.output];
  const cross = await model.sessions[c.cross.graph].run({ [c.cross.input]: hidden });
  const [rows, positions] = hidden.dims;
  return { cross, rows, mask: mask ?? new model.ort.Tensor("int64", new BigInt64Array(rows * positions).fill(1n),
    [rows, positions]) };
}

/**
 * A decoder over a crossSource with a cache of `capacity` slots written in place: step(ids) feeds
 * each row's new tokens (rows x t) and gives each row's logits after its last one;
 * step.reorder(index) reorders the rows' caches (beam search).
 */
export function crossDecoder(model, source, capacity) {
  const { Tensor } = model.ort;
  const d = model.bundle.contract.decoder;
  const { n_heads: heads, head_dim: dim } = model.bundle.model;
  const cache = new SlotCache(model.ort, d.cache, [source.rows, heads, capacity, dim]);
  let position = 0;
  const step = async (ids) => {
    const t = ids[0].length;
    if (position + t > capacity) throw new Error(`edgeattn: ${position + t} tokens exceed a cache of ${capacity}`);
    const out = await model.sessions[d.graph].run({
      [d.ids]: new Tensor("int64", BigInt64Array.from(ids.flat(), BigInt), [source.rows, t]), [d.mask]: source.mask,
      [d.position]: new Tensor("int64", BigInt64Array.of(BigInt(position)), [1]), ...source.cross,
      ...cache.tensors });
    cache.take(out);
    position += t;
    return rowLogits(out[d.logits], t - 1);
  };
  step.reorder = (index) => cache.reorder(model.ort, index);
  return step;
}

/**
 * A batch of prompts over the decoder-only graph: one cache buffer of `capacity` slots per layer,
 * the graph writing each call's keys and values at slots position .. position + t - 1; the attention
 * mask marks the slots that hold real tokens, so a row padded on the left answers as it would alone.
 */
class CausalState {
  constructor(model, rows, capacity) {
    const { n_kv_heads: heads, dim } = model.bundle.model;
    this.model = model;
    this.rows = rows;
    this.capacity = capacity;
    this.position = 0;
    this.nextPosition = new Array(rows).fill(0);
    this.slots = new BigInt64Array(rows * capacity);
    this.cache = new SlotCache(model.ort, model.bundle.contract.decoder.cache, [rows, heads, capacity, dim]);
  }

  /** Run `ids` (rows x t, `mask` marking padding) after what the cache holds: each row's next-token logits. */
  async feed(ids, mask) {
    const total = this.model.bundle.prefill_chunk; // tokens a run, counted over the rows
    const chunk = total && Math.max(1, Math.floor(total / this.rows));
    const t = ids[0].length;
    if (!chunk || t <= chunk) return this.run(ids, mask);
    const last = mask.map((m) => m.reduce((a, v, j) => (v ? j : a), 0));
    let logits = await this.run(ids.map((r) => r.slice(0, chunk)), mask.map((r) => r.slice(0, chunk)));
    for (let start = chunk; start < t; start += chunk) {
      const part = await this.run(ids.map((r) => r.slice(start, start + chunk)),
        mask.map((r) => r.slice(start, start + chunk)));
      logits = logits.map((row, i) => (last[i] >= start ? part[i] : row));
    }
    return logits;
  }

  async run(ids, mask) {
    const { Tensor } = this.model.ort;
    const d = this.model.bundle.contract.decoder;
    const { rows, capacity } = this;
    const t = ids[0].length;
    const start = this.position;
    if (start + t > capacity) throw new Error(`edgeattn: ${start + t} tokens do not fit a cache of ${capacity}`);
    const flat = new BigInt64Array(rows * t);
    const positions = new BigInt64Array(rows * t);
    const last = new BigInt64Array(rows);
    for (let i = 0; i < rows; i++) {
      let seen = 0;
      for (let j = 0; j < t; j++) {
        flat[i * t + j] = BigInt(ids[i][j]);
        this.slots[i * capacity + start + j] = BigInt(mask[i][j]);
        seen += mask[i][j];
        positions[i * t + j] = BigInt(this.nextPosition[i] + Math.max(seen - 1, 0));
        if (mask[i][j]) last[i] = BigInt(j);
      }
    }
    const out = await this.model.session.run({
      [d.ids]: new Tensor("int64", flat, [rows, t]), [d.mask]: new Tensor("int64", this.slots.slice(), [rows, capacity]),
      [d.positions]: new Tensor("int64", positions, [rows, t]),
      [d.position]: new Tensor("int64", BigInt64Array.of(BigInt(start)), [1]),
      [d.logits_at]: new Tensor("int64", last, [rows, 1]), ...this.cache.tensors });
    this.cache.take(out); // the graph wrote this call's keys and values
    this.position += t;
    mask.forEach((m, i) => { this.nextPosition[i] += m.reduce((a, v) => a + v, 0); });
    return rowLogits(out[d.logits], 0);
  }
}

/** A decoder-only language model: continue prompts, stream them, answer a conversation. */
export class CausalModel extends BundleModel {
  constructor(bundle, file, tokenizer, session, ort, chatTemplate = null) {
    super(bundle, file, tokenizer, session, ort);
    this.chatTemplate = chatTemplate;
    this.stopIds = bundle.stop_ids;
  }

  /** A conversation ([{role, content}, ...]) as the model's prompt text, by the export's chat template. */
  async renderChat(messages, { addGenerationPrompt = true } = {}) {
    if (!this.chatTemplate) throw new Error("edgeattn: this model has no chat template; use generateText");
    const { Template } = await import("./jinja.mjs");
    this.template ??= new Template(this.chatTemplate.chat_template);
    // the template's own raise_exception (a builtin of @huggingface/jinja) throws with its message
    return this.template.render({ ...this.chatTemplate.special_tokens, messages,
      add_generation_prompt: addGenerationPrompt });
  }

  /**
   * Token ids (rows x width) and mask of `prompts`, padded on the left, with `room` new tokens left
   * within the model's max_len (else an error, or with `truncate` each prompt's last tokens). A
   * prompt is a text (the tokenizer's special tokens added) or a conversation (rendered by the
   * chat template, whose markup carries its own).
   */
  async encodePrompts(prompts, { room = 0, truncate = false } = {}) {
    const list = typeof prompts === "string" || isConversation(prompts) ? [prompts] : prompts;
    if (!Array.isArray(list) || list.length === 0) throw new Error("edgeattn: give a prompt or a non-empty list of prompts");
    const encoded = [];
    for (const p of list) {
      if (typeof p === "string") encoded.push(this.tokenizer.encode(p, { add_special_tokens: true }).ids.map(Number));
      else if (isConversation(p)) encoded.push(this.tokenizer.encode(await this.renderChat(p), { add_special_tokens: false }).ids.map(Number));
      else throw new Error("edgeattn: a prompt is a text or a list of messages ({role, content})");
    }
    if (encoded.some((e) => e.length === 0)) throw new Error("edgeattn: a prompt encodes to no tokens; give it some text");
    const { max_len: maxLen, pad_id: padId } = this.bundle.model;
    const limit = maxLen - room;
    if (limit < 1) throw new Error(`edgeattn: ${room} new tokens leave no room for a prompt (max_len ${maxLen})`);
    const rows = truncate ? encoded.map((e) => e.slice(-limit)) : encoded;
    const width = Math.max(...rows.map((e) => e.length));
    if (width > limit) {
      throw new Error(`edgeattn: a prompt is ${width} tokens long; with ${room} new ones this model takes at most ` +
        `${limit} (max_len ${maxLen}); shorten it or truncate`);
    }
    return { ids: rows.map((e) => [...new Array(width - e.length).fill(padId), ...e]),
             mask: rows.map((e) => [...new Array(width - e.length).fill(0), ...e.map(() => 1)]) };
  }

  /** New tokens when none are asked for: 64, or 256 where a conversation is among the prompts, within half of max_len. */
  defaultSteps(prompts) {
    const list = typeof prompts === "string" || isConversation(prompts) ? [prompts] : prompts;
    const wanted = Array.isArray(list) && list.some(isConversation) ? 256 : 64;
    return Math.max(1, Math.min(wanted, Math.floor(this.bundle.model.max_len / 2)));
  }

  /**
   * Decode after prompt ids (rows x width, left-padded, `mask` marking padding): yields each step's
   * tokens (one a row; the pad id for a row that already stopped), until every row stopped at one of
   * the model's stop ids or `maxNewTokens`. The first step's logits are kept in `this.promptLogits`.
   */
  async *steps(ids, mask, options = {}) {
    const cfg = this.settings(options);
    const rows = ids.length;
    const capacity = ids[0].length + cfg.maxNewTokens;
    if (capacity > this.bundle.model.max_len) {
      throw new Error(`edgeattn: a prompt of ${ids[0].length} tokens and ${cfg.maxNewTokens} new ones exceed ` +
        `the model's max_len ${this.bundle.model.max_len}`);
    }
    const state = new CausalState(this, rows, capacity);
    // a repetition penalty starts from each row's prompt
    const seen = cfg.repetitionPenalty === 1 ? null : ids.map((row, i) => row.filter((_, j) => mask[i][j]));
    this.promptLogits = await state.feed(ids, mask);
    yield* search(this, cfg, this.promptLogits, seen, (tokens) => state.feed(tokens.map((t) => [t]),
      tokens.map(() => [1])));
  }

  /**
   * The continuation of each prompt (a text, a conversation, or a list of them) as {text, tokens}:
   * up to a stop id, or up to (not including) the first of the `stop` strings. Options:
   * maxNewTokens (64), strategy (greedy, or sample with temperature, topK, topP, seed),
   * repetitionPenalty, stop, truncate.
   */
  async generate(prompts, { stop = [], truncate = false, ...options } = {}) {
    const cfg = this.settings({ maxNewTokens: this.defaultSteps(prompts), ...options });
    const { ids, mask } = await this.encodePrompts(prompts, { room: cfg.maxNewTokens, truncate });
    return collectAnswers(this, this.steps(ids, mask, cfg), ids.length, stop);
  }

  /** The continuation of each prompt as text (see generate). */
  async generateText(prompts, options) {
    return (await this.generate(prompts, options)).map((a) => a.text);
  }

  /** The assistant's answer to a conversation ([{role, content}, ...]); maxNewTokens 256 by default. */
  async chat(messages, options = {}) {
    return (await this.generate([messages], options))[0].text;
  }

  /**
   * One prompt's continuation as it grows: each piece is what the tokens so far add to the decoded
   * text (a piece that could begin a stop string waits), so the pieces join to generate's text.
   */
  async *stream(prompt, { stop = [], truncate = false, ...options } = {}) {
    const cfg = this.settings({ maxNewTokens: this.defaultSteps([prompt]), ...options });
    const { ids, mask } = await this.encodePrompts([prompt], { room: cfg.maxNewTokens, truncate });
    yield* answerPieces(this, this.steps(ids, mask, cfg), stop);
  }
}

/**
 * A seq2seq model (T5): text in, text out. Its source is tokenized as an encoder's (right padding,
 * truncation keeping the closing special token); the encoder and the cross projections run once,
 * then the decoder a token a row a step over a cache of `maxNewTokens` slots it writes into.
 */
export class Seq2SeqModel extends EncoderModel {
  constructor(bundle, file, tokenizer, sessions, ort) {
    super(bundle, file, tokenizer, sessions[file.graph], ort);
    this.sessions = sessions;
    this.stopIds = bundle.stop_ids;
  }

  /** Source ids (rows x width) and mask, padded on the right. */
  async encodePrompts(texts, { truncate = false } = {}) {
    const tokens = this.tokenize(texts, { truncate });
    const rows = Array.from({ length: tokens.batch }, (_, i) => i * tokens.width);
    return { ids: rows.map((r) => Array.from(tokens.ids.slice(r, r + tokens.width), Number)),
             mask: rows.map((r) => Array.from(tokens.mask.slice(r, r + tokens.width), Number)), tokens };
  }

  /** New tokens when none are asked for: twice the longest source plus 8, within max_len. */
  defaultSteps(width) { return Math.min(this.bundle.model.max_len, 2 * width + 8); }

  /** Decode after a tokenized source: each step's tokens, as CausalModel.steps gives them. */
  async *steps(tokens, options = {}) {
    const cfg = this.settings(options);
    const { Tensor } = this.ort;
    const { bos_id: bos, max_len: maxLen } = this.bundle.model;
    if (cfg.maxNewTokens > maxLen) throw new Error(`edgeattn: maxNewTokens ${cfg.maxNewTokens} exceeds max_len ${maxLen}`);
    const dims = [tokens.batch, tokens.width];
    const mask = new Tensor("int64", tokens.mask, dims);
    const source = await crossSource(this, { ids: new Tensor("int64", tokens.ids, dims), mask }, mask);
    const step = crossDecoder(this, source, cfg.maxNewTokens);
    this.promptLogits = await step(Array.from({ length: tokens.batch }, () => [bos]));
    yield* search(this, cfg, this.promptLogits, cfg.repetitionPenalty === 1 ? null : tokens.kept.map(() => []),
      (next) => step(next.map((t) => [t])));
  }

  /**
   * Each text's answer as {text, tokens}: up to the end-of-sequence token, or up to (not including) the
   * first of the `stop` strings; options as CausalModel.generate's.
   */
  async generate(texts, { stop = [], truncate = false, ...options } = {}) {
    const { tokens } = await this.encodePrompts(texts, { truncate });
    const cfg = this.settings({ maxNewTokens: this.defaultSteps(tokens.width), ...options });
    return collectAnswers(this, this.steps(tokens, cfg), tokens.batch, stop);
  }

  async generateText(texts, options) {
    return (await this.generate(texts, options)).map((a) => a.text);
  }

  /** One text's answer as it grows: each piece what the tokens so far add to the decoded answer. */
  async *stream(text, { stop = [], truncate = false, ...options } = {}) {
    const { tokens } = await this.encodePrompts([text], { truncate });
    const cfg = this.settings({ maxNewTokens: this.defaultSteps(tokens.width), ...options });
    yield* answerPieces(this, this.steps(tokens, cfg), stop);
  }
}

/** The byte-level alphabet's stand-in for a space (GPT-2's bytes_to_unicode: byte 0x20 is U+0120). */
const BYTE_SPACE = "\u0120";

/** Whether a prompt is a conversation (a list of {role, content} messages) rather than a text. */
function isConversation(prompt) {
  return Array.isArray(prompt) && prompt.length > 0 && prompt.every((m) => m && typeof m === "object" && "role" in m);
}
