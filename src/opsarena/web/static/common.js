// Shared by the scoreboard pages: DOM building without innerHTML, and formatting.
"use strict";

// A field a record or an event does not have is null or undefined: no page ever prints
// that as "null" or "undefined". `el` and `fill` leave such children out (the DOM's own
// append and replaceChildren would write them as text), `say` reads them as "-".

function absent(value) {
  return value === null || value === undefined;
}

function nodes(children) {
  return children.flat(Infinity).filter((child) => !absent(child) && child !== false)
    .map((child) => (child instanceof Node ? child : document.createTextNode(String(child))));
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (absent(value) || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  node.append(...nodes(children));
  return node;
}

// `node`'s children replaced by `children` (absent ones left out).
function fill(node, ...children) {
  node.replaceChildren(...nodes(children));
  return node;
}

// A template tag: say`${a} of ${b}` is the template with an absent value read as "-".
function say(strings, ...values) {
  return strings.reduce((text, part, i) => text + String(absent(values[i - 1]) ? "-" : values[i - 1]) + part);
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
