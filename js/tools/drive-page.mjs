#!/usr/bin/env node
// Drives the page of `seq2onnx web` in headless Chromium (puppeteer-core), as a user would: waits
// for the model, types the sentences into the textarea, sets beam size and hypotheses, presses
// Translate, and reads each n-best back from the DOM. commands/browser_host.py runs it (verify-host
// --host browser and the browser tests).
//
// Reads one JSON object on stdin: {url, chromium, sentences: [..], runs: [{beamSize, numHypotheses,
// sourceLang?, targetLang?}],
// screenshot?: path (taken after the last run), timeoutMs?, fill?: set the text box at once instead of
// typing each key (many sentences), weights?: false to read only the heatmaps' source pieces}. Writes one JSON object on stdout:
// {runs: [{beamSize, numHypotheses, status, results: [{source, hypotheses: [{text, score, shown, tokens}]}],
//         attention: [{index, weights, rows, sourcePieces}] (the heatmaps)}],
//  loadStatus, requests: [every URL the page asked for], errors: [console errors and page errors],
//  languageFields: how many language fields the page shows (2 for a multilingual model, else 0),
//  loadMs: from navigation to the page's ready (or error) state; each run's ms: from the click to done}.
import puppeteer from "puppeteer-core";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString("utf-8"));
const timeout = job.timeoutMs ?? 120000;

const browser = await puppeteer.launch({
  executablePath: job.chromium,
  headless: true,
  // the page translates on its main thread: a long translation (a large model, long outputs) holds
  // input events for as long, so DevTools calls wait up to the job's timeout, not puppeteer's 180 s
  protocolTimeout: timeout,
  // root in a container has no user namespaces for the sandbox; no GPU on a test machine
  args: ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
});
const report = { runs: [], loadStatus: null, requests: [], errors: [] };
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1000, height: 900 });
  page.on("request", (request) => report.requests.push(request.url()));
  page.on("console", (message) => {
    if (message.type() === "error") report.errors.push(message.text());
  });
  page.on("pageerror", (error) => report.errors.push(String(error)));
  const started = performance.now();
  await page.goto(job.url, { waitUntil: "load", timeout });
  const settled = (states) =>
    `["${states.join('","')}"].includes(document.getElementById("status").dataset.state)`;
  await page.waitForFunction(settled(["ready", "error"]), { timeout, polling: 50 });
  report.loadMs = Math.round(performance.now() - started);
  report.loadStatus = await page.$eval("#status", (el) => ({
    state: el.dataset.state,
    text: el.textContent,
  }));
  if (report.loadStatus.state === "ready") {
    if (job.fill) {
      await page.$eval(
        "#source",
        (el, v) => {
          el.value = v;
        },
        job.sentences.join("\n"),
      );
    } else {
      await page.click("#source");
      await page.keyboard.type(job.sentences.join("\n"));
    }
    for (const run of job.runs) {
      await page.$eval(
        "#beam",
        (el, v) => {
          el.value = String(v);
        },
        run.beamSize,
      );
      await page.$eval(
        "#nbest",
        (el, v) => {
          el.value = String(v);
        },
        run.numHypotheses,
      );
      // a multilingual model's language fields (shown only for one): "" keeps the bundle's default
      report.languageFields = await page.$$eval(".langs", (labels) => labels.filter((l) => !l.hidden).length);
      await page.$eval(
        "#srclang",
        (el, v) => {
          el.value = v;
        },
        run.sourceLang ?? "",
      );
      await page.$eval(
        "#tgtlang",
        (el, v) => {
          el.value = v;
        },
        run.targetLang ?? "",
      );
      await page.$eval("#status", (el) => {
        el.dataset.state = "waiting";
      });
      const clicked = performance.now();
      await page.click("#translate");
      await page.waitForFunction(settled(["done", "error"]), { timeout, polling: 50 });
      const ms = Math.round(performance.now() - clicked);
      const status = await page.$eval("#status", (el) => ({ state: el.dataset.state, text: el.textContent }));
      const results = await page.$$eval("#results .result", (articles) =>
        articles.map((a) => ({
          source: a.querySelector(".source").textContent,
          hypotheses: [...a.querySelectorAll(".hyp")].map((li) => ({
            text: li.querySelector(".text").textContent,
            score: Number(li.dataset.score),
            shown: li.querySelector(".score").textContent,
            tokens: JSON.parse(li.dataset.tokens),
          })),
        })),
      );
      const attention = await page.$$eval(
        "#heatmaps table.heatmap",
        (tables, withWeights) =>
          tables.map((t) => ({
            index: Number(t.dataset.index),
            weights: withWeights ? JSON.parse(t.dataset.weights) : null,
            rows: t.querySelectorAll("tr").length - 1,
            sourcePieces: [...t.querySelectorAll("th.src")].map((th) => th.textContent),
          })),
        job.weights !== false,
      );
      report.runs.push({ ...run, status, results, attention, ms });
    }
  }
  if (job.screenshot) await page.screenshot({ path: job.screenshot, fullPage: true });
} finally {
  await browser.close();
}
process.stdout.write(`${JSON.stringify(report)}\n`);
