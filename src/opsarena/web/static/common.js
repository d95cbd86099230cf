// Shared by the scoreboard pages: DOM building without innerHTML, and formatting.
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function duration(ms) {
  if (ms === null || ms === undefined) return "-";
  const seconds = ms / 1000;
  if (Math.abs(seconds) < 60) return seconds.toFixed(1) + "s";
  const minutes = Math.floor(seconds / 60);
  return minutes + "m" + (seconds - minutes * 60).toFixed(1).padStart(4, "0") + "s";
}

function wallTime(iso) {
  return iso ? iso.replace("T", " ").slice(0, 19) : "-";
}

function liveStatus(node, on, text) {
  node.className = "live " + (on ? "on" : "off");
  node.textContent = text;
}
