// edgeattn's speech bundle (Whisper) for the browser and Node.js: mono samples at the model's rate
// in, the transcript and its segments' times out, as edgeattn's Python runtime hears them (greedy,
// beams, the temperature fallback, prompts and conditioning on the text heard).
// The log-mel features are computed here (the bundle's mel filters, a mixed-radix FFT), the audio
// encoder and cross projections run once a window, then the decoder a token a step over a cache of
// fixed capacity it writes into, under Whisper's rules (suppressed tokens, timestamp pairs, the
// first timestamp's limit); audio longer than a window is heard window after window, each starting
// where the last one's final complete segment ends. load() in edgeattn.mjs returns a SpeechModel.
//
//   const model = await load("./bundle/", ort);
//   const { text, segments } = await model.transcribe(samples, { timestamps: true });  // 16 kHz mono
//   for await (const segment of model.segments(samples)) console.log(segment.start, segment.text);
import { BundleModel, choose, crossDecoder, crossSource, repeatSource, uniform } from "./edgeattn.mjs";

/** Seconds a timestamp token stands for, and the feature frames an audio position covers. */
const TIME_PRECISION = 0.02;
const INPUT_STRIDE = 2;

/** A mixed-radix FFT of size n: its factors and the twiddles exp(-2 pi i k / n). */
function fftPlan(n) {
  const factors = [];
  let m = n;
  for (const p of [4, 2, 3, 5]) while (m % p === 0) { factors.push(p); m /= p; }
  for (let p = 7; m > 1; p += 2) while (m % p === 0) { factors.push(p); m /= p; }
  const cos = new Float64Array(n);
  const sin = new Float64Array(n);
  for (let k = 0; k < n; k++) {
    cos[k] = Math.cos((2 * Math.PI * k) / n);
    sin[k] = -Math.sin((2 * Math.PI * k) / n);
  }
  return { n, factors, cos, sin, tRe: new Float64Array(n), tIm: new Float64Array(n) };
}

/** The DFT of the real `x` (every `stride`-th value from `at`, `n` of them) into re/im from `out`. */
function fftInto(plan, x, at, stride, n, re, im, out, depth) {
  if (n === 1) {
    re[out] = x[at];
    im[out] = 0;
    return;
  }
  const p = plan.factors[depth];
  const m = n / p;
  for (let q = 0; q < p; q++) fftInto(plan, x, at + q * stride, stride * p, m, re, im, out + q * m, depth + 1);
  const { cos, sin, tRe, tIm } = plan;
  const N = plan.n;
  const step = N / n;
  for (let k = 0; k < m; k++) {
    for (let q = 0; q < p; q++) { // each part's k-th value times its twiddle
      const w = (q * k * step) % N;
      const yr = re[out + q * m + k];
      const yi = im[out + q * m + k];
      tRe[q] = yr * cos[w] - yi * sin[w];
      tIm[q] = yr * sin[w] + yi * cos[w];
    }
    for (let s = 0; s < p; s++) { // the parts' DFT of size p gives X[k + s m]
      let sr = 0;
      let si = 0;
      for (let q = 0; q < p; q++) {
        const w = (q * s * m * step) % N;
        sr += tRe[q] * cos[w] - tIm[q] * sin[w];
        si += tRe[q] * sin[w] + tIm[q] * cos[w];
      }
      re[out + k + s * m] = sr;
      im[out + k + s * m] = si;
    }
  }
}

/**
 * Whisper's log-mel features of mono `samples` (Float32Array at the model's rate) by `features`
 * (the export's settings) and `filters` (n_mels x (n_fft / 2 + 1), Float32Array): {data (n_mels x
 * frames, row-major), frames}. With `padToWindow` one window (cut or padded with zeros), else every
 * frame of the audio (long audio, cut into windows afterwards), as edgeattn's LogMel computes them.
 */
export function logMel(samples, features, filters, padToWindow = true) {
  const { n_fft: nFft, hop, n_mels: nMels } = features;
  const windowSamples = features.chunk_seconds * features.rate;
  let x = Float32Array.from(samples);
  if (padToWindow) {
    const padded = new Float32Array(windowSamples);
    padded.set(x.subarray(0, windowSamples));
    x = padded;
  }
  if (x.length < 2) throw new Error("edgeattn: audio of fewer than 2 samples has no spectrogram");
  const half = Math.floor(nFft / 2);
  const padded = new Float32Array(x.length + 2 * half);
  padded.set(x, half);
  if (x.length > half) { // reflected at both ends, the edge samples not repeated
    for (let j = 1; j <= half; j++) {
      padded[half - j] = x[j];
      padded[half + x.length - 1 + j] = x[x.length - 1 - j];
    }
  }
  const count = 1 + Math.floor((padded.length - nFft) / hop);
  const frames = count - 1; // the last frame is dropped, as Whisper's extractor drops it
  const bins = Math.floor(nFft / 2) + 1;
  const window = new Float32Array(nFft);
  for (let k = 0; k < nFft; k++) window[k] = 0.5 - 0.5 * Math.cos((2 * Math.PI * k) / nFft);
  const plan = fftPlan(nFft);
  const frame = new Float32Array(nFft);
  const re = new Float64Array(nFft);
  const im = new Float64Array(nFft);
  const power = new Float32Array(bins);
  const logs = new Float32Array(nMels * frames);
  let top = -Infinity;
  for (let f = 0; f < frames; f++) {
    for (let k = 0; k < nFft; k++) frame[k] = padded[f * hop + k] * window[k];
    fftInto(plan, frame, 0, 1, nFft, re, im, 0, 0);
    for (let b = 0; b < bins; b++) power[b] = re[b] * re[b] + im[b] * im[b];
    for (let m = 0; m < nMels; m++) {
      let sum = 0;
      const row = m * bins;
      for (let b = 0; b < bins; b++) sum += power[b] * filters[row + b];
      const value = Math.log10(Math.max(Math.fround(sum), 1e-10));
      logs[m * frames + f] = value;
      if (value > top) top = value;
    }
  }
  const floor = Math.fround(top) - 8;
  for (let i = 0; i < logs.length; i++) logs[i] = (Math.max(logs[i], floor) + 4) / 4;
  return { data: logs, frames };
}

/**
 * A window's generated tokens (no prompt, no end token) as segments {start, end, tokens} in seconds
 * from `offset`, and the feature frames to move on by (as edgeattn's split_segments and transformers'
 * _retrieve_segment): to the end of the window's `frames` when the tokens end on a single timestamp
 * or hold no pair, else to the last complete segment's end.
 */
export function splitSegments(tokens, begin, offset, frames, frameSeconds) {
  const stamps = tokens.map((t) => t >= begin);
  const n = tokens.length;
  const singleEnding = n >= 2 ? !stamps[n - 2] && stamps[n - 1] : n === 1 && stamps[0];
  const pairs = [];
  for (let i = 0; i < n - 1; i++) if (stamps[i] && stamps[i + 1]) pairs.push(i + 1);
  if (!pairs.length) {
    const times = tokens.filter((t) => t >= begin);
    let last = (frames * frameSeconds) / TIME_PRECISION;
    if (times.length && times.at(-1) !== begin) last = times.at(-1) - begin;
    return { segments: [{ start: offset, end: offset + last * TIME_PRECISION, tokens: [...tokens] }], advance: frames };
  }
  const slices = [...pairs];
  if (singleEnding) slices.push(n);
  else slices[slices.length - 1] += 1;
  const segments = [];
  let previous = 0;
  slices.forEach((cut, i) => {
    const piece = tokens.slice(previous, cut);
    const endAt = i < slices.length - 1 || singleEnding ? piece.length - 1 : piece.length - 2;
    segments.push({ start: offset + (piece[0] - begin) * TIME_PRECISION,
                    end: offset + (piece[endAt] - begin) * TIME_PRECISION, tokens: piece });
    previous = cut;
  });
  return { segments, advance: singleEnding ? frames : (tokens[previous - 2] - begin) * INPUT_STRIDE };
}

/** Seconds rounded to the millisecond, as the Python runtime rounds them. */
function ms(seconds) {
  return Math.round(seconds * 1000) / 1000;
}

/** How a window may be prompted after earlier text (transformers' prompt_condition_type). */
const CONDITION_TYPES = ["first-segment", "all-segments"];
/** The widest beam search (the Python runtime's MAX_BEAMS). */
const MAX_BEAMS = 64;

/**
 * Checked search options, as the Python runtime's SearchOptions: numBeams (lengthPenalty),
 * temperature (one, or several tried in turn while a window's tokens compress more than
 * compressionRatioThreshold or average a log-probability under logprobThreshold),
 * noSpeechThreshold (with logprobThreshold: a silent window is skipped), topK, seed.
 */
export function searchOptions({ numBeams = 1, lengthPenalty = 1, temperature = 0, compressionRatioThreshold = null,
                                logprobThreshold = null, noSpeechThreshold = null, topK = 50, seed } = {}) {
  const temperatures = Array.isArray(temperature) ? temperature : [temperature];
  if (!temperatures.length || !temperatures.every((t) => Number.isFinite(t) && t >= 0)) {
    throw new Error(`edgeattn: temperature is a number or a list of them, 0 or more, not ${JSON.stringify(temperature)}`);
  }
  if (!Number.isInteger(numBeams) || numBeams < 1 || numBeams > MAX_BEAMS) {
    throw new Error(`edgeattn: numBeams is a whole number from 1 to ${MAX_BEAMS}, not ${numBeams}`);
  }
  if (!Number.isInteger(topK) || topK < 0) throw new Error(`edgeattn: topK is 0 (every token) or more, not ${topK}`);
  for (const [name, v] of Object.entries({ lengthPenalty, compressionRatioThreshold, logprobThreshold, noSpeechThreshold })) {
    if (v !== null && !Number.isFinite(v)) throw new Error(`edgeattn: ${name} is a number, not ${v}`);
  }
  if (noSpeechThreshold !== null && logprobThreshold === null) {
    throw new Error("edgeattn: noSpeechThreshold needs logprobThreshold: a window is silence when its no-speech probability is high and its log-probability low");
  }
  return { numBeams, lengthPenalty, temperatures, compressionRatioThreshold, logprobThreshold, noSpeechThreshold, topK, seed };
}

/** Log-probabilities (float64) of a row of scores. */
function logSoftmax(row) {
  let top = -Infinity;
  for (const v of row) if (v > top) top = v;
  let total = 0;
  for (const v of row) total += Math.exp(v - top);
  const norm = top + Math.log(total);
  return Float64Array.from(row, (v) => v - norm);
}

/** Scores below the k-th largest at -Infinity (transformers' top-k warper; 0: all kept). */
function topKOnly(scores, k) {
  if (!k || k >= scores.length) return scores;
  const kth = Float64Array.from(scores).sort()[scores.length - k];
  return scores.map((v) => (v < kth ? -Infinity : v));
}

/** The `count` best continuations of the beams (beam score + log-probability), best first, equal scores by index. */
function topCandidates(logp, scores, count) {
  const best = []; // {beam, token, score, index}, best first
  const vocab = logp[0].length;
  logp.forEach((row, beam) => {
    if (scores[beam] === -Infinity) return;
    for (let token = 0; token < vocab; token++) {
      const score = scores[beam] + row[token];
      if (best.length === count && !(score > best[count - 1].score)) continue;
      let at = best.length;
      while (at > 0 && best[at - 1].score < score) at--;
      best.splice(at, 0, { beam, token, score });
      if (best.length > count) best.pop();
    }
  });
  return best;
}

/** Keep the `width` best finished hypotheses, best first (a stable sort: earlier ones first among equals). */
function addHypothesis(finished, score, tokens, width) {
  finished.push({ score, tokens });
  finished.sort((a, b) => b.score - a.score);
  finished.splice(width);
}

/** How much zlib shrinks the tokens written as little-endian integers of the vocabulary's width (transformers' measure). */
export async function tokenCompressionRatio(tokens, vocab) {
  if (!tokens.length) return 0;
  const width = Math.floor(Math.log2(vocab) / 8) + 1;
  const bytes = new Uint8Array(tokens.length * width);
  tokens.forEach((t, i) => { for (let b = 0; b < width; b++) bytes[i * width + b] = (t >> (8 * b)) & 255; });
  const stream = new Blob([bytes]).stream().pipeThrough(new CompressionStream("deflate"));
  return bytes.length / (await new Response(stream).arrayBuffer()).byteLength;
}

/** The model load() returns for a speech bundle: its settings and mel filters read beside bundle.json. */
export async function open({ bundle, file, tokenizer, sessions, ort, root, readBytes }) {
  const bytes = await readBytes(new URL(bundle.mel_filters.file, root));
  const filters = new Float32Array(bytes.slice().buffer); // float32, little-endian
  const [rows, cols] = bundle.mel_filters.shape;
  if (filters.length !== rows * cols) throw new Error(`edgeattn: ${bundle.mel_filters.file} holds ${filters.length} values, not ${rows} x ${cols}`);
  return new SpeechModel(bundle, file, tokenizer, sessions, ort, filters);
}

/** A Whisper model: 16 kHz mono samples (Float32Array) in, the transcript with its segments' times out. */
export class SpeechModel extends BundleModel {
  constructor(bundle, file, tokenizer, sessions, ort, filters) {
    super(bundle, file, tokenizer, sessions[file.graph], ort);
    this.sessions = sessions;
    this.features = bundle.features; // the export's feature settings
    this.decoding = bundle.decoding; // and decoding settings (its generation config's), as the Python runtime reads them
    this.filters = filters;
    this.eos = this.decoding.eos;
    this.noTimestamps = this.decoding.no_timestamps;
    this.timestampBegin = this.noTimestamps === null ? null : this.noTimestamps + 1;
    this.languages = this.decoding.languages;
    this.multilingual = this.decoding.multilingual;
    this.rate = this.features.rate;
    this.windowSamples = this.features.chunk_seconds * this.rate;
    this.windowFrames = this.windowSamples / this.features.hop;
  }

  /** The log-mel features of `samples` (see logMel): one window, or every frame of longer audio. */
  logMel(samples, padToWindow = true) {
    return logMel(samples, this.features, this.filters, padToWindow);
  }

  /** The token of a language (a code such as "fr", or a token "<|fr|>"). */
  languageId(language) {
    const token = language.startsWith("<|") ? language : `<|${language.toLowerCase()}|>`;
    if (!(token in this.languages)) {
      const known = Object.keys(this.languages).map((t) => t.slice(2, -2)).sort().join(", ") || "none: it is English-only";
      throw new Error(`edgeattn: this model has no language ${JSON.stringify(language)} (its languages: ${known})`);
    }
    return this.languages[token];
  }

  /** A window's first tokens: start, the language and task (multilingual models), no-timestamps unless `timestamps`. */
  prompt(language, task, timestamps) {
    const d = this.decoding;
    const tokens = [d.start];
    if (this.multilingual) {
      const tasks = d.tasks;
      if (!(task in tasks)) throw new Error(`edgeattn: the task is one of ${Object.keys(tasks).join(", ")}, not ${task}`);
      tokens.push(typeof language === "number" ? language : this.languageId(language), tasks[task]);
    } else if (!(language == null || language === "en") || task !== "transcribe") {
      throw new Error("edgeattn: this model is English-only: it transcribes English, nothing else");
    }
    if (timestamps && this.noTimestamps === null) throw new Error("edgeattn: this model has no timestamp tokens");
    if (!timestamps && this.noTimestamps !== null) tokens.push(this.noTimestamps);
    return tokens;
  }

  /** `scores` of a row whose whole sequence is `tokens` (its prompt `begin` long), with what Whisper's rules forbid at -Infinity. */
  rules(tokens, scores, begin, timestamps) {
    const d = this.decoding;
    const forbid = (from, to) => scores.fill(-Infinity, from, to);
    if (tokens.length === begin) for (const t of d.begin_suppress) scores[t] = -Infinity;
    for (const t of d.suppress) scores[t] = -Infinity;
    if (!timestamps) return scores;
    const tb = this.timestampBegin;
    scores[this.noTimestamps] = -Infinity;
    const sampled = tokens.slice(begin);
    const last = sampled.length >= 1 && sampled.at(-1) >= tb;
    const penultimate = sampled.length < 2 || sampled.at(-2) >= tb;
    if (last) {
      if (penultimate) forbid(tb, scores.length); // a pair closed: text next
      else forbid(0, this.eos); // a pair opened: its closing timestamp (or the end) next
    }
    const stamps = sampled.filter((t) => t >= tb);
    if (stamps.length) forbid(tb, last && !penultimate ? stamps.at(-1) : stamps.at(-1) + 1); // never back in time
    if (tokens.length === begin) { // the first token is a timestamp, not too late
      forbid(0, tb);
      if (d.max_initial_timestamp_index != null) forbid(tb + d.max_initial_timestamp_index + 1, scores.length);
    }
    // timestamps next where their probability together beats the likeliest text token's (the
    // softmax's normaliser is common to both sides, so the scores compare as they are)
    let top = -Infinity;
    for (let k = tb; k < scores.length; k++) if (scores[k] > top) top = scores[k];
    let mass = 0;
    if (top > -Infinity) for (let k = tb; k < scores.length; k++) mass += Math.exp(scores[k] - top);
    const stampMass = top + Math.log(mass);
    let textBest = -Infinity;
    for (let k = 0; k < tb; k++) if (scores[k] > textBest) textBest = scores[k];
    if (stampMass > textBest) forbid(0, tb);
    return scores;
  }

  /** One window's features (n_mels x frames, zero-padded) as the decoder's cross keys/values (see crossSource). */
  async source(window) {
    const features = new this.ort.Tensor("float32", window, [1, this.features.n_mels, this.windowFrames]);
    return crossSource(this, { features });
  }

  /** A decoder over `source` with a cache of `capacity` slots: `step(ids)` feeds tokens, gives the last one's logits. */
  decoder(source, capacity) {
    // the updated caches are the next step's (fetching them into the inputs' own tensors, in place,
    // answered otherwise on onnxruntime-web's wasm: its tokens parted from the Python runtime's)
    const step = crossDecoder(this, source, capacity);
    return async (ids) => (await step([ids]))[0];
  }

  /**
   * One window searched as `search` says (see searchOptions), after the tokens `prefix` (a prompt,
   * the text heard before): each temperature in turn until the tokens pass the thresholds (or the
   * last); its tokens (no start sequence, no end token), language (detected from the start token
   * alone where none is given), mean log-probability, the temperature kept, the no-speech
   * probability (with a no-speech threshold) and whether it is silence.
   */
  async searchWindow(window, language, task, timestamps, maxNewTokens, prefix = [], search = searchOptions(),
                     random = uniform(search.seed)) {
    const source = await this.source(window);
    const d = this.decoding;
    const detect = this.multilingual && language == null;
    const silence = search.noSpeechThreshold != null;
    let spoken = language;
    let noSpeech = null;
    let first = null;
    if (detect || (silence && !prefix.length)) first = await this.decoder(source, 1)([d.start]); // after the start token alone
    if (detect) {
      const ids = Object.values(this.languages).sort((a, b) => a - b);
      spoken = ids.reduce((best, id) => (first[id] > first[best] ? id : best), ids[0]);
    }
    if (silence) { // after the start token where the window has it
      if (this.noTimestamps === null) throw new Error("edgeattn: this model has no no-speech token: it takes no noSpeechThreshold");
      if (prefix.length) first = await this.decoder(source, prefix.length + 1)([...prefix, d.start]);
      noSpeech = Math.exp(logSoftmax(first)[this.noTimestamps - 1]);
    }
    const base = [...prefix, ...this.prompt(spoken, task, timestamps)];
    const limit = Math.min(this.bundle.model.max_len, d.max_length) - base.length;
    const steps = maxNewTokens ?? limit;
    if (!(steps >= 1) || steps > limit) {
      throw new Error(`edgeattn: a window holds at most ${this.bundle.model.max_len} tokens: a prompt of ` +
        `${base.length} leaves ${limit} new ones, not ${steps}`);
    }
    let found;
    for (const [attempt, temperature] of search.temperatures.entries()) {
      found = temperature === 0 && search.numBeams > 1
        ? await this.beams(source, base, steps, timestamps, search)
        : await this.sample(source, base, steps, timestamps, temperature, search.topK, random);
      found.temperature = temperature;
      if (attempt === search.temperatures.length - 1 || !(await this.failed(found.tokens, found.logprob, search))) break;
    }
    const silent = search.noSpeechThreshold != null && noSpeech !== null && found.logprob < search.logprobThreshold &&
      noSpeech > search.noSpeechThreshold;
    const tokens = found.tokens.at(-1) === this.eos ? found.tokens.slice(0, -1) : found.tokens;
    const name = Object.entries(this.languages).find(([, id]) => id === base[prefix.length + 1]);
    return { tokens, language: this.multilingual && name ? name[0].slice(2, -2) : null, logprob: found.logprob,
             temperature: found.temperature, noSpeech, silent };
  }

  /**
   * Greedy (temperature 0) or sampled tokens after `base` (the end token kept), sampled from the
   * `topK` likeliest at `temperature`, and their mean log-probability under the rules' scores at
   * temperature 1 (the end token counted), as the Python runtime measures a window.
   */
  async sample(source, base, steps, timestamps, temperature, topK, random) {
    const step = this.decoder(source, base.length + steps);
    const sequence = [...base];
    let logits = await step(base);
    let sum = 0;
    for (let k = 0; k < steps; k++) {
      let scores = this.rules(sequence, logits, base.length, timestamps); // logits: this step's own copy
      let token = 0;
      if (temperature === 0) {
        for (let v = 1; v < scores.length; v++) if (scores[v] > scores[token]) token = v;
      } else {
        token = choose(scores, { strategy: "sample", temperature, topK, topP: 1 }, random);
        scores = topKOnly(scores, topK);
      }
      sum += logSoftmax(scores)[token];
      sequence.push(token);
      if (token === this.eos || k + 1 === steps) break;
      logits = await step([token]);
    }
    const tokens = sequence.slice(base.length);
    return { tokens, logprob: sum / Math.max(1, tokens.length) };
  }

  /**
   * Beam search of `search.numBeams` beams after `base`, as the Python runtime's (its shared core's
   * beam_steps for one row): the best hypothesis (its end token kept) and its length-normalised score.
   */
  async beams(source, base, steps, timestamps, search) {
    const n = search.numBeams;
    const lp = search.lengthPenalty;
    const step = crossDecoder(this, repeatSource(this, source, n), base.length + steps);
    let scores = Array.from({ length: n }, (_, j) => (j ? -Infinity : 0)); // the first step expands beam 0 alone
    let seqs = Array.from({ length: n }, () => []);
    const finished = [];
    let logits = await step(Array.from({ length: n }, () => base));
    let done = false;
    for (let t = 0; t < steps; t++) {
      const logp = logits.map((row, j) => this.rules([...base, ...seqs[j]], logSoftmax(row), base.length, timestamps));
      const order = topCandidates(logp, scores, 2 * n);
      const next = [];
      for (const [rank, { beam, token, score }] of order.entries()) {
        if (token === this.eos) {
          if (rank < n) addHypothesis(finished, score / (seqs[beam].length + 1) ** lp, [...seqs[beam], token], n);
          continue;
        }
        next.push({ beam, token, score });
        if (next.length === n) break;
      }
      done = finished.length === n &&
        Math.max(...next.map((c) => c.score)) / (t + 1) ** lp <= Math.min(...finished.map((h) => h.score));
      step.reorder(next.map((c) => c.beam));
      seqs = next.map((c) => [...seqs[c.beam], c.token]);
      scores = next.map((c) => c.score);
      if (done || t + 1 === steps) break;
      logits = await step(next.map((c) => [c.token]));
    }
    if (!done) { // out of steps: the live beams compete with what finished
      seqs.forEach((seq, j) => addHypothesis(finished, scores[j] / Math.max(1, seq.length) ** lp, seq, n));
    }
    const best = finished.reduce((a, h) => (h.score > a.score ? h : a)); // the first of equal scores
    return { tokens: best.tokens, logprob: best.score };
  }

  /** Whether a window's tokens (its end token included) call for the next temperature. */
  async failed(tokens, logprob, search) {
    if (search.compressionRatioThreshold != null &&
        await tokenCompressionRatio(tokens, this.bundle.model.vocab_size) > search.compressionRatioThreshold) return true;
    return search.logprobThreshold != null && logprob < search.logprobThreshold;
  }

  /** The prompt's tokens after <|startofprev|> (empty for none) and how windows are conditioned, checked. */
  context(prompt, condition, kind) {
    if (!CONDITION_TYPES.includes(kind)) throw new Error(`edgeattn: promptConditionType is one of ${CONDITION_TYPES.join(", ")}, not ${kind}`);
    if (kind === "all-segments" && !condition) {
      throw new Error("edgeattn: promptConditionType all-segments conditions each window on the text heard so far: set conditionOnPrevTokens too");
    }
    const prevSot = this.decoding.prev_sot;
    if ((condition || prompt?.trim()) && prevSot == null) {
      throw new Error("edgeattn: this model's generation config names no <|startofprev|> token to start a prompt or the text heard with");
    }
    let ids = [];
    if (prompt?.trim()) {
      ids = this.tokenizer.encode(" " + prompt.trim(), { add_special_tokens: false }).ids.map(Number);
      if (ids.some((t) => t >= this.eos)) throw new Error("edgeattn: a prompt is plain text: it holds no special tokens (<|...|>)");
      ids = [prevSot, ...ids.slice(-this.contextTokens)];
    }
    return { ids, condition, kind };
  }

  /** The most earlier tokens a window is decoded after (half its sequence, as transformers). */
  get contextTokens() { return Math.floor(this.bundle.model.max_len / 2) - 1; }

  /** What a window's start sequence follows: the prompt, or the text heard so far (see the Python runtime's _prefix). */
  prefix(context, said, conditioned) {
    if (!conditioned || !said.length) return [...context.ids];
    const begin = this.timestampBegin ?? this.bundle.model.vocab_size;
    const before = context.ids.length && context.kind === "all-segments" ? context.ids : [this.decoding.prev_sot];
    const tokens = said.flatMap((part) => (part.length > 2 && part.at(-2) >= begin ? part.slice(0, -1) : part));
    return [...before, ...tokens.slice(-this.contextTokens)];
  }

  /** The text of tokens (those from the end token on left out). */
  text(tokens) {
    return this.decode(tokens.filter((t) => t < this.eos));
  }

  /**
   * The transcript's segments as each window is decoded: {start, end, text, tokens, avgLogprob,
   * temperature, noSpeechProb}. Options: language (a code; detected from the first window when not
   * given, on a multilingual model), task ("transcribe", or "translate" into English), timestamps
   * (segments split at the model's timestamp tokens; always for audio longer than a window),
   * maxNewTokens (a window's), prompt (text the windows are decoded after: earlier words, names,
   * spelling), conditionOnPrevTokens (each window after the text heard before it; the prompt then
   * the first window's, or every window's with promptConditionType "all-segments"), and the search
   * options of searchOptions (numBeams, temperature fallback, thresholds, topK, seed).
   */
  async *segments(samples, { language = null, task = "transcribe", timestamps = true, maxNewTokens, onLanguage,
                             prompt = null, conditionOnPrevTokens = false, promptConditionType = "first-segment",
                             ...search } = {}) {
    if (!(samples instanceof Float32Array || Array.isArray(samples))) {
      throw new Error(`edgeattn: give mono samples at ${this.rate} Hz (a Float32Array); decode files with decodeWav or an AudioContext`);
    }
    const options = searchOptions(search);
    const random = uniform(options.seed);
    const context = this.context(prompt, conditionOnPrevTokens, promptConditionType);
    const longForm = samples.length > this.windowSamples;
    const { data, frames: count } = this.logMel(samples, !longForm);
    const nMels = this.features.n_mels;
    const window = this.windowFrames;
    const stamped = timestamps || longForm;
    const duration = samples.length / this.rate;
    const total = longForm ? count : window;
    const frameSeconds = this.features.hop / this.rate;
    // the segments heard so far (a first-segment prompt counts as one), and whether the next window
    // is decoded after them (not after a window sampled at 0.5 or above)
    const said = context.ids.length && context.kind === "first-segment" ? [context.ids.slice(1)] : [];
    let conditioned = context.condition;
    let seek = 0;
    let first = true;
    while (seek < total) {
      const frames = Math.min(window, total - seek);
      const piece = new Float32Array(nMels * window);
      for (let m = 0; m < nMels; m++) piece.set(data.subarray(m * count + seek, m * count + seek + frames), m * window);
      const found = await this.searchWindow(piece, language, task, stamped, maxNewTokens,
        this.prefix(context, said, conditioned), options, random);
      conditioned = context.condition && found.temperature < 0.5;
      if (onLanguage && first) onLanguage(found.language);
      first = false;
      language ??= found.language; // detected once, from the first window
      if (found.silent) { // no speech: on to the next window
        seek += frames;
        continue;
      }
      const offset = seek * frameSeconds;
      const { segments, advance } = stamped
        ? splitSegments(found.tokens, this.timestampBegin, offset, frames, frameSeconds)
        : { segments: [{ start: offset, end: duration, tokens: found.tokens }], advance: frames };
      for (const s of segments) {
        said.push(s.tokens);
        yield { start: ms(s.start), end: ms(s.end), text: this.text(s.tokens), tokens: s.tokens,
                avgLogprob: Math.round(found.logprob * 1e6) / 1e6, temperature: found.temperature,
                noSpeechProb: found.noSpeech };
      }
      seek += Math.max(advance, 1);
    }
  }

  /**
   * The transcript of `samples` (mono, at the model's rate): {text, segments, language, duration};
   * options as segments' (timestamps off by default: one segment for a clip of a window or less).
   */
  async transcribe(samples, { timestamps = false, ...options } = {}) {
    let language = options.language ?? null;
    const segments = [];
    for await (const s of this.segments(samples, { ...options, timestamps, onLanguage: (l) => { language ??= l; } })) {
      segments.push(s);
    }
    return { text: this.text(segments.flatMap((s) => s.tokens)), segments, language,
             duration: samples.length / this.rate };
  }
}

/**
 * The samples of a WAV file's bytes (PCM 16, 24 or 32 bits, or float 32), channels averaged:
 * {samples: Float32Array, rate}. Resample to the model's rate before transcribing (in a page, an
 * AudioContext at that rate decodes and resamples any format the browser reads).
 */
export function decodeWav(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const tag = (at) => String.fromCharCode(...bytes.subarray(at, at + 4));
  if (bytes.length < 12 || tag(0) !== "RIFF" || tag(8) !== "WAVE") throw new Error("edgeattn: not a WAV file (no RIFF/WAVE header)");
  let format = null;
  for (let at = 12; at + 8 <= bytes.length;) {
    const size = view.getUint32(at + 4, true);
    if (tag(at) === "fmt ") {
      format = { code: view.getUint16(at + 8, true), channels: view.getUint16(at + 10, true),
                 rate: view.getUint32(at + 12, true), bits: view.getUint16(at + 22, true) };
      if (format.code === 0xfffe && size >= 40) format.code = view.getUint16(at + 32, true); // WAVE_FORMAT_EXTENSIBLE
    } else if (tag(at) === "data") {
      if (!format) throw new Error("edgeattn: a WAV file whose data comes before its format");
      const { code, channels, bits, rate } = format;
      const width = bits / 8;
      const frames = Math.floor(Math.min(size, bytes.length - at - 8) / (width * channels));
      const read = code === 3 && bits === 32 ? (o) => view.getFloat32(o, true)
        : code === 1 && bits === 16 ? (o) => view.getInt16(o, true) / 32768
        : code === 1 && bits === 24 ? (o) => ((view.getUint8(o) | (view.getUint8(o + 1) << 8) | (view.getInt8(o + 2) << 16)) / 8388608)
        : code === 1 && bits === 32 ? (o) => view.getInt32(o, true) / 2147483648 : null;
      if (!read) throw new Error(`edgeattn: WAV format ${code} at ${bits} bits is not read here (PCM 16/24/32 or float 32)`);
      const samples = new Float32Array(frames);
      for (let f = 0; f < frames; f++) {
        let sum = 0;
        for (let c = 0; c < channels; c++) sum += read(at + 8 + (f * channels + c) * width);
        samples[f] = sum / channels;
      }
      return { samples, rate };
    }
    at += 8 + size + (size % 2);
  }
  throw new Error("edgeattn: a WAV file without a data chunk");
}
