// The page's logic: loads the bundle served beside it (./bundle/) into the browser host and shows
// each source line's n-best with scores. The DOM keeps each score at full precision in
// data-score (tests/test_web.py compares it with the Python runtime's); the page shows 4 decimals.
import { ort, Translator } from "./host/index-web.js";

const $ = (id) => document.getElementById(id);
let translator = null;

function setStatus(state, text) {
  const status = $("status");
  status.dataset.state = state;
  status.textContent = text;
}

function readInteger(id, label, low, high) {
  const value = Number($(id).value);
  if (!(Number.isInteger(value) && value >= low && value <= high)) {
    throw new RangeError(
      `${label} is ${JSON.stringify($(id).value)}; give a whole number from ${low} to ${high}`,
    );
  }
  return value;
}

function describe(meta) {
  const m = meta.model;
  return (
    `Model: ${m.n_encoder_layers} encoder + ${m.n_decoder_layers} decoder layers, d_model ${m.d_model}, ` +
    `${m.n_heads} heads, vocabularies ${m.src_vocab_size} / ${m.tgt_vocab_size}, ${meta.dtype}`
  );
}

async function load() {
  const start = performance.now();
  try {
    translator = await Translator.load(new URL("./bundle/", window.location.href).href);
  } catch (e) {
    setStatus("error", `Cannot load the model: ${e.message}`);
    throw e;
  }
  const meta = translator.bundle.meta;
  $("model").textContent = describe(meta);
  $("beam").value = String(meta.decoding.beam_size);
  $("lp").value = String(meta.decoding.length_penalty);
  showLanguages(translator.tokens.languages);
  $("translate").disabled = false;
  const seconds = ((performance.now() - start) / 1000).toFixed(1);
  setStatus(
    "ready",
    `Ready: loaded and checked in ${seconds} s (onnxruntime-web ${ort.env.versions?.web ?? ""}, WebAssembly).`,
  );
}

/** A multilingual model (NLLB, M2M100, mBART-50) gets source and target language fields, its codes listed. */
function showLanguages(languages) {
  const codes = Object.keys(languages ?? {}).sort();
  if (!codes.length) return;
  $("languages").replaceChildren(
    ...codes.map((code) => Object.assign(document.createElement("option"), { value: code })),
  );
  for (const label of document.querySelectorAll(".langs")) label.hidden = false;
}

/** The language fields' codes as translateBatch options; an empty field keeps the bundle's default. */
function languageOptions() {
  const options = {};
  for (const [id, key] of [
    ["srclang", "sourceLang"],
    ["tgtlang", "targetLang"],
  ]) {
    const code = $(id).value.trim();
    if (code) options[key] = code;
  }
  return options;
}

function render(sources, results) {
  const list = $("results");
  list.replaceChildren();
  sources.forEach((source, i) => {
    const article = document.createElement("article");
    article.className = "result";
    article.dataset.index = String(i);
    const head = document.createElement("p");
    head.className = "source";
    head.textContent = source;
    const ol = document.createElement("ol");
    ol.className = "nbest";
    results[i].hypotheses.forEach((text, k) => {
      const li = document.createElement("li");
      li.className = "hyp";
      li.dataset.score = String(results[i].scores[k]);
      li.dataset.tokens = JSON.stringify(results[i].tokenIds[k]);
      const span = document.createElement("span");
      span.className = "text";
      span.textContent = text;
      const score = document.createElement("span");
      score.className = "score";
      score.textContent = results[i].scores[k].toFixed(4);
      li.append(span, score);
      ol.append(li);
    });
    article.append(head, ol);
    list.append(article);
  });
}

/** Shows a piece: SentencePiece's "▁" (a word's start) stays visible; an empty piece shows as "·". */
const showPiece = (piece) => piece || "·";

/** One heatmap per source: its best hypothesis's target pieces down, source pieces across. */
function renderAttention(sources, results) {
  const box = $("heatmaps");
  box.replaceChildren();
  sources.forEach((source, i) => {
    const weights = results[i].attention[0];
    const tokens = results[i].tokenIds[0];
    const sourcePieces = [...translator.sourceTokenizer.pieces(source), "</s>"];
    const targetPieces = tokens.map((id) => translator.targetTokenizer.decode([id]));
    const table = document.createElement("table");
    table.className = "heatmap";
    table.dataset.index = String(i);
    table.dataset.weights = JSON.stringify(weights);
    const head = document.createElement("tr");
    head.append(document.createElement("th"));
    for (const piece of sourcePieces) {
      const th = document.createElement("th");
      th.className = "src";
      th.textContent = showPiece(piece);
      head.append(th);
    }
    table.append(head);
    weights.forEach((row, j) => {
      const tr = document.createElement("tr");
      const th = document.createElement("th");
      th.className = "tgt";
      th.textContent = showPiece(targetPieces[j]);
      tr.append(th);
      for (const w of row) {
        const td = document.createElement("td");
        const shade = Math.round(255 * (1 - w));
        td.style.background = `rgb(${shade}, ${shade}, 255)`;
        td.style.color = w > 0.55 ? "#fff" : "#223";
        td.title = w.toFixed(4);
        td.textContent = String(Math.round(100 * w));
        tr.append(td);
      }
      table.append(tr);
    });
    const caption = document.createElement("p");
    caption.className = "source";
    caption.textContent = source;
    box.append(caption, table);
  });
}

async function onTranslate(event) {
  event.preventDefault();
  if (!translator) return;
  const sources = $("source")
    .value.split(/\r?\n/)
    .filter((line) => line.trim() !== "");
  let options;
  try {
    const beamSize = readInteger("beam", "Beam size", 1, 32);
    const numHypotheses = readInteger("nbest", "Hypotheses", 1, beamSize);
    const lengthPenalty = Number($("lp").value);
    if (!(Number.isFinite(lengthPenalty) && lengthPenalty >= 0)) {
      throw new RangeError(`Length penalty is ${JSON.stringify($("lp").value)}; give a number of at least 0`);
    }
    options = {
      beamSize,
      numHypotheses,
      lengthPenalty,
      returnScores: true,
      returnAttention: true,
      ...languageOptions(),
    };
  } catch (e) {
    setStatus("error", e.message);
    return;
  }
  if (!sources.length) {
    setStatus("error", "Nothing to translate: type one sentence per line.");
    return;
  }
  $("translate").disabled = true;
  setStatus("busy", `Translating ${sources.length} line(s)…`);
  const start = performance.now();
  try {
    const results = await translator.translateBatch(sources, options);
    render(sources, results);
    renderAttention(sources, results);
    const ms = Math.round(performance.now() - start);
    setStatus(
      "done",
      `Translated ${sources.length} line(s) in ${ms} ms (beam ${options.beamSize}, ` +
        `${options.numHypotheses} hypothes${options.numHypotheses === 1 ? "is" : "es"} each).`,
    );
  } catch (e) {
    setStatus("error", `Cannot translate: ${e.message}`);
  } finally {
    $("translate").disabled = false;
  }
}

$("form").addEventListener("submit", onTranslate);
load().catch((e) => console.error(e));
