// Reward by policy version on the listing: per version (the oldest that sampled each rollout), a
// bar of the mean reward over its scored rollouts and a dot of its completion rate, drawn as
// inline SVG (no chart library), with the counts in a table beneath. A version's bar filters
// the listing on it.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const CHART = { width: 900, height: 200, left: 48, right: 48, top: 12, bottom: 28 };

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  node.append(...children.filter((child) => child !== null && child !== undefined));
  return node;
}

function versionName(version) {
  return version === null ? "none" : String(version);
}

function rewardRange(versions) {
  // Bars start at 0; the axis spans 0 to 1 unless the rewards go past it.
  const means = versions.map((v) => v.mean_reward).filter((m) => m !== null);
  const lo = Math.min(0, ...means);
  const hi = Math.max(lo === 0 ? 1 : 0, ...means);
  return hi > lo ? [lo, hi] : [lo, lo + 1];
}

function versionChart(versions) {
  const { width, height, left, right, top, bottom } = CHART;
  const [lo, hi] = rewardRange(versions);
  const plotW = width - left - right;
  const plotH = height - top - bottom;
  const y = (value) => top + plotH * (1 - (value - lo) / (hi - lo));
  const slot = plotW / versions.length;
  const barW = Math.max(1, Math.min(40, slot * 0.6));
  const every = Math.ceil(versions.length / 20); // at most 20 labels under the axis
  const marks = [];
  const dots = [];
  versions.forEach((v, k) => {
    const x = left + slot * (k + 0.5);
    const name = versionName(v.policy_version);
    const tip = `version ${name}: mean reward ${num(v.mean_reward)} over ${v.scored} scored of ${v.n} rollouts; ran to the end ${percent(v.success_rate)}`;
    if (v.mean_reward !== null) {
      const top0 = Math.min(y(v.mean_reward), y(0));
      marks.push(svg("rect", {
        class: "bar", x: x - barW / 2, y: top0, width: barW, height: Math.max(1, Math.abs(y(v.mean_reward) - y(0))),
        "data-chart-version": name, "data-mean": v.mean_reward, "data-n": v.n, "data-scored": v.scored, "data-completed": v.success_rate,
        onclick: v.policy_version === null ? null : () => filterVersion(v.policy_version),
      }, svg("title", { text: tip })));
    }
    const dotY = top + plotH * (1 - v.success_rate);
    dots.push(`${x},${dotY}`);
    marks.push(svg("circle", { class: "completion", cx: x, cy: dotY, r: 3.5, "data-chart-version": name }, svg("title", { text: tip })));
    if (k % every === 0) marks.push(svg("text", { class: "tick", x, y: height - 10, "text-anchor": "middle", text: name }));
  });
  return svg("svg", { id: "versions-chart", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": "mean reward and completion rate per policy version" },
    svg("line", { class: "axis", x1: left, x2: width - right, y1: y(0), y2: y(0) }),
    svg("text", { class: "tick", x: left - 6, y: y(hi) + 4, "text-anchor": "end", text: num(hi, 2) }),
    svg("text", { class: "tick", x: left - 6, y: y(lo) + 4, "text-anchor": "end", text: num(lo, 2) }),
    svg("text", { class: "tick completion-axis", x: width - right + 6, y: top + 4, text: "100%" }),
    svg("text", { class: "tick completion-axis", x: width - right + 6, y: top + plotH + 4, text: "0%" }),
    versions.length > 1 ? svg("polyline", { class: "completion", points: dots.join(" ") }) : null,
    ...marks);
}

function versionTable(versions) {
  return el("table", { class: "grid versions" },
    el("thead", {}, el("tr", {}, ...["policy version", "rollouts", "scored", "mean reward", "ran to the end"].map((h, k) => el("th", { class: k ? "num" : null, text: h })))),
    el("tbody", {}, ...versions.map((v) => el("tr", { "data-version-row": versionName(v.policy_version) },
      el("td", { text: versionName(v.policy_version) }),
      el("td", { class: "num", text: num(v.n) }),
      el("td", { class: "num", text: num(v.scored) }),
      el("td", { class: "num", text: num(v.mean_reward) }),
      el("td", { class: "num", text: percent(v.success_rate) })))));
}

function renderVersions(versions) {
  const legend = el("p", { class: "legend" },
    el("span", { class: "swatch bar-swatch" }), " mean reward (scored rollouts) ",
    el("span", { class: "swatch completion-swatch" }), " ran to the end: completed or truncated (right axis, 0 to 100%)");
  fill(document.getElementById("versions"), versions.length ? [legend, versionChart(versions), versionTable(versions)] : el("p", { class: "muted", text: "no rollouts yet" }));
}
