// Small DOM and formatting helpers shared by the views.

/** el("div#id.a.b", {title: "x", onclick: f}, child, "text", …): an element, with classes from the tag. */
export function el(tag, attrs = {}, ...children) {
  const [nameAndId, ...classes] = tag.split(".");
  const [name, id] = nameAndId.split("#");
  const node = document.createElement(name || "div");
  if (id) node.id = id;
  if (classes.length) node.className = classes.join(" ");
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    // Through the CSSOM: the Content-Security-Policy refuses style attributes.
    else if (key === "style") Object.assign(node.style, value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function formatTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleString();
}

export function formatMs(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

export const pretty = (value) => JSON.stringify(value, null, 2);

export function stateBadge(state) {
  return el(`span.state.state-${state}`, { text: state });
}

/** A progress bar of a job's `progress`, one segment per settled state. */
export function progressBar(progress) {
  const total = Math.max(1, progress.total);
  const bar = el("div.progress", { role: "progressbar", "aria-valuenow": progress.percent, "aria-valuemax": 100 });
  for (const state of ["succeeded", "failed", "cancelled", "skipped", "running"]) {
    const n = progress[state] || 0;
    if (n > 0) bar.append(el(`span.seg.state-${state}`, { style: { width: `${(100 * n) / total}%` }, title: `${n} ${state}` }));
  }
  return bar;
}

/**
 * Where each JSON Pointer of `text` stands: a map pointer → [start, end) offsets of its value.
 * `text` must be valid JSON (JSON.parse accepted it).
 */
export function jsonPointerRanges(text) {
  const ranges = new Map();
  let i = 0;
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const escape = (key) => key.replace(/~/g, "~0").replace(/\//g, "~1");
  const string = () => {
    const start = i++;
    while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    i++;
    return JSON.parse(text.slice(start, i));
  };
  const value = (pointer) => {
    ws();
    const start = i;
    const c = text[i];
    if (c === "{") {
      i++;
      ws();
      if (text[i] === "}") i++;
      else
        for (;;) {
          ws();
          const key = string();
          ws();
          i++; // ':'
          value(`${pointer}/${escape(key)}`);
          ws();
          if (text[i++] === "}") break;
        }
    } else if (c === "[") {
      i++;
      ws();
      if (text[i] === "]") i++;
      else
        for (let n = 0; ; n++) {
          value(`${pointer}/${n}`);
          ws();
          if (text[i++] === "]") break;
        }
    } else if (c === '"') {
      string();
    } else {
      while (i < text.length && !",}] \t\n\r".includes(text[i])) i++;
    }
    ranges.set(pointer, [start, i]);
  };
  value("");
  return ranges;
}

/** The range of `pointer` in `text`, or of its nearest parent that is there (a missing field). */
export function rangeOfPointer(text, pointer) {
  let ranges;
  try {
    ranges = jsonPointerRanges(text);
  } catch {
    return null;
  }
  let p = pointer || "";
  for (;;) {
    if (ranges.has(p)) return { pointer: p, range: ranges.get(p) };
    if (p === "") return null;
    p = p.slice(0, p.lastIndexOf("/"));
  }
}
