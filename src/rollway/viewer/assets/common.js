// Helpers both pages share. Data goes into the page as text (textContent), never as HTML.
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

async function getJSON(url) {
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
  return body;
}

function num(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  return Number.isInteger(value) ? value.toLocaleString("en") : value.toFixed(digits);
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 60) return `${value.toFixed(2)} s`;
  const whole = Math.round(value);
  return `${Math.floor(whole / 60)} m ${whole % 60} s`;
}

function percent(value) {
  return value === null || value === undefined ? "–" : `${(100 * value).toFixed(1)}%`;
}

function statusChip(status) {
  return el("span", { class: `status status-${status}`, text: status });
}

// replaceChildren, leaving out the parts a page does not have (null).
function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((child) => child !== null && child !== undefined));
}

function fact(label, value) {
  return el("span", { class: "fact" }, el("b", { text: label }), " ", value);
}

// A sortable column per reward component (reward/<name>, a name user code chose: set as text),
// right after the header `after` of table `table`; a click sorts by it (`onSort(column)`).
function componentHeaders(table, after, names, onSort, title) {
  for (const th of document.querySelectorAll(`#${table} th[data-component]`)) th.remove();
  const anchor = document.querySelector(`#${table} ${after}`);
  for (const name of [...names].reverse()) {
    const th = el("th", { class: "num", "data-sort": `reward/${name}`, "data-component": name, title, text: `reward/${name}` });
    th.addEventListener("click", () => onSort(th.dataset.sort));
    anchor.after(th);
  }
}

// A row's cells for those columns: its value of each component ("–" where it has none).
function componentCells(names, components) {
  return names.map((name) => el("td", { class: "num", "data-component": name, text: num((components || {})[name]) }));
}

function markSorted(table, sort, order) {
  for (const th of document.querySelectorAll(`#${table} th[data-sort]`)) {
    th.classList.toggle("sorted", th.dataset.sort === sort);
    th.dataset.order = th.dataset.sort === sort ? order : "";
  }
}
