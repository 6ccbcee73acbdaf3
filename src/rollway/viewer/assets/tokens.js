// The token stream of each sample, a page at a time: the prompt, then every response token under
// its loss mask, shaded by logprob (the default), by entropy (where the run recorded it) or by
// the mask alone; logprobs printed beside the tokens on request. The choice is in the address
// (?shade=entropy&logprobs=1), so a link shows the same view.
"use strict";

let pageTokens = 4096;
let samples = [];
const shownPages = new Map(); // segment -> [page, texts]: what each sample shows now
const view = { shade: "logprob", printLogprobs: false, hasEntropy: false };
//: Entropy (nats) shaded fully red: past it a step is about as uncertain as it gets for a shade.
const ENTROPY_RED = 3;

function readView() {
  const params = new URLSearchParams(location.search);
  if (["logprob", "entropy", "mask"].includes(params.get("shade"))) view.shade = params.get("shade");
  view.printLogprobs = params.get("logprobs") === "1";
}

function writeView() {
  const params = new URLSearchParams(location.search);
  params.set("shade", view.shade);
  if (view.printLogprobs) params.set("logprobs", "1"); else params.delete("logprobs");
  history.replaceState(null, "", `?${params}${location.hash}`);
}

function shown(text) {
  // Whitespace a reader would miss: a newline shows as ↵ then breaks, a tab as →.
  return text.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
}

function heat(fraction) {
  // 1: green, 0.5: yellow, 0: red.
  return `hsl(${Math.round(120 * Math.min(1, Math.max(0, fraction)))} 70% 82%)`;
}

function shade(sample, j) {
  if (view.shade === "mask") return "hsl(215 80% 86%)";
  if (view.shade === "entropy") return heat(1 - sample.entropy[j] / ENTROPY_RED);
  return heat(Math.exp(sample.logprobs[j]));
}

function tokenNode(sample, texts, id, i) {
  const text = texts[id];
  const node = document.createElement("span");
  node.className = "tok";
  node.textContent = text === undefined ? `${id} ` : shown(text);
  const tip = [`#${i}`, `id ${id}`];
  if (text !== undefined) tip.push(JSON.stringify(text));
  if (i < sample.prompt_len) {
    node.classList.add("prompt");
    tip.push("prompt");
  } else {
    const j = i - sample.prompt_len - sample.response_offset;
    const mask = sample.loss_mask[j];
    node.dataset.mask = String(mask);
    tip.push(`mask ${mask}`);
    if (mask === 1) {
      node.style.background = shade(sample, j);
      tip.push(`logprob ${sample.logprobs[j].toFixed(4)} (p ${Math.exp(sample.logprobs[j]).toFixed(3)})`);
      if (sample.entropy) tip.push(`entropy ${sample.entropy[j].toFixed(3)} nats`);
    }
    if (sample.policy_versions && sample.policy_versions[j] >= 0) tip.push(`policy version ${sample.policy_versions[j]}`);
  }
  if (i === sample.drift_at) node.classList.add("drift");
  node.title = tip.join(" · ");
  return node;
}

function streamMarks(sample) {
  const marks = new Map();
  const add = (at, node) => { if (!marks.has(at)) marks.set(at, []); marks.get(at).push(node); };
  add(sample.prompt_len, el("span", { class: "mark boundary", text: "response ▸" }));
  for (const turn of sample.turns) {
    add(turn.start, el("span", { class: "mark turn", "data-turn": turn.index, text: `turn ${turn.index}${turn.reissued ? " (reissued)" : ""}` }));
  }
  if (sample.drift_at !== null) add(sample.drift_at, el("span", { class: "mark drift-mark", text: "drift ▸" }));
  return marks;
}

function renderSample(sample, texts) {
  // One page of the sample's stream: positions are the whole stream's (sample.offset on).
  shownPages.set(sample.segment, [sample, texts]);
  const marks = streamMarks(sample);
  const prompt = document.createDocumentFragment();
  const response = document.createDocumentFragment();
  sample.ids.forEach((id, k) => {
    const i = sample.offset + k;
    const target = i < sample.prompt_len ? prompt : response;
    for (const mark of marks.get(i) || []) target.append(mark);
    target.append(tokenNode(sample, texts, id, i));
    const j = i - sample.prompt_len - sample.response_offset;
    if (view.printLogprobs && i >= sample.prompt_len && sample.loss_mask[j] === 1) {
      target.append(el("sub", { class: "lp", text: sample.logprobs[j].toFixed(2) }));
    }
  });
  const responseLen = sample.length - sample.prompt_len;
  const header = `segment ${sample.segment}: prompt ${num(sample.prompt_len)} tokens, response ${num(responseLen)} (${num(sample.sampled)} sampled, mask 1; ${num(responseLen - sample.sampled)} mask 0)`;
  const blocks = [el("h3", { text: header }), tokenPager(sample)];
  if (sample.offset < sample.prompt_len) {
    const shownPrompt = Math.min(sample.prompt_len, sample.offset + sample.ids.length) - sample.offset;
    blocks.push(el("details", { class: "prompt-block" }, el("summary", { text: `prompt (${num(sample.prompt_len)} tokens${shownPrompt < sample.prompt_len ? `, ${num(shownPrompt)} on this page` : ""})` }), el("div", { class: "stream" }, prompt)));
  }
  blocks.push(el("div", { class: "stream" }, response));
  return el("div", { class: "sample", "data-segment": sample.segment, "data-offset": sample.offset }, ...blocks);
}

function tokenPager(sample) {
  // A long sample comes a page at a time: the page lays out only the tokens it shows.
  if (sample.length <= pageTokens && sample.offset === 0) return null;
  const last = sample.offset + sample.ids.length;
  const go = (offset) => el("button", { type: "button", text: offset < sample.offset ? "◀ earlier" : "later ▶", onclick: () => showPage(sample.segment, offset) });
  return el("div", { class: "pager" },
    sample.offset > 0 ? go(Math.max(0, sample.offset - pageTokens)) : null,
    el("span", { class: "muted", text: ` tokens ${num(sample.offset)}–${num(last)} of ${num(sample.length)} ` }),
    last < sample.length ? go(last) : null);
}

async function showPage(segment, offset) {
  const page = await getJSON(`/api/rollouts/${encodeURIComponent(key)}/tokens?segment=${segment}&offset=${offset}`);
  const fresh = renderSample(page, page.texts);
  document.querySelector(`.sample[data-segment="${segment}"]`).replaceWith(fresh);
  fresh.scrollIntoView();
}

function showTurn(turn) {
  // The page of the sample that holds the turn's first completion token.
  const sample = samples.find((s) => s.segment === turn.segment);
  const span = sample && sample.turns.find((t) => t.index === turn.index);
  if (span) showPage(turn.segment, Math.floor(span.start / pageTokens) * pageTokens);
}

function shadeLegend() {
  const swatch = (background, text) => el("span", { class: "tok m1", style: `background: ${background}`, text });
  if (view.shade === "mask") return [swatch("hsl(215 80% 86%)", "mask 1 (sampled, trained on)")];
  if (view.shade === "entropy") return [swatch(heat(1), "entropy 0"), swatch(heat(0.5), `${ENTROPY_RED / 2} nats`), swatch(heat(0), `≥ ${ENTROPY_RED} nats`)];
  return [swatch(heat(1), "mask 1, p = 1"), swatch(heat(0.5), "p = 0.5"), swatch(heat(0), "p = 0")];
}

function rerenderTokens() {
  writeView();
  document.getElementById("samples").dataset.shade = view.shade;
  fill(document.getElementById("shade-legend"), shadeLegend());
  for (const [segment, [page, texts]] of shownPages) {
    document.querySelector(`.sample[data-segment="${segment}"]`)?.replaceWith(renderSample(page, texts));
  }
}

function wireShading() {
  // Entropy only where the run recorded it (record_entropy=True): else the choice is off.
  view.hasEntropy = samples.some((s) => s.entropy !== null);
  if (view.shade === "entropy" && !view.hasEntropy) view.shade = "logprob";
  const entropy = document.getElementById("shade-entropy");
  entropy.disabled = !view.hasEntropy;
  document.getElementById("entropy-note").hidden = view.hasEntropy;
  for (const radio of document.querySelectorAll("input[name=shade]")) {
    radio.checked = radio.value === view.shade;
    radio.addEventListener("change", () => { view.shade = radio.value; rerenderTokens(); });
  }
  const print = document.getElementById("print-logprobs");
  print.checked = view.printLogprobs;
  print.addEventListener("change", () => { view.printLogprobs = print.checked; rerenderTokens(); });
  document.getElementById("samples").dataset.shade = view.shade;
  fill(document.getElementById("shade-legend"), shadeLegend());
}

function renderTokens(detail) {
  pageTokens = detail.page_tokens;
  samples = detail.samples;
  readView();
  wireShading();
  const t = detail.trajectory;
  document.getElementById("tokenizer").textContent = detail.tokenizer ? `tokens decoded with ${detail.tokenizer}` : "no tokenizer loaded: token ids shown";
  document.getElementById("samples").replaceChildren(
    ...(samples.length ? samples.map((s) => renderSample(s, detail.texts)) : [el("p", { class: "muted", text: t && !t.has_token_ids ? "this engine gave no token ids" : "no samples" })]));
}
