// A job's node tree, drawn as an indented tree with fixed-height rows of which only those in view
// exist in the DOM: a 10,000-node job costs the same to draw as a 30-node one.
import { el, formatMs } from "./util.js";

const ROW_HEIGHT = 26;
const OVERSCAN = 8;

export class NodeTree {
  /** onSelect(node) is called when a row is clicked. */
  constructor(onSelect) {
    this.onSelect = onSelect;
    this.nodes = [];
    this.depth = new Map();
    this.hasChildren = new Set();
    this.collapsed = new Set();
    this.visible = [];
    this.selected = null;
    this.spacer = el("div.tree-spacer");
    this.viewport = el("div.tree-viewport", { tabindex: 0, "aria-label": "nodes" }, this.spacer);
    this.viewport.addEventListener("scroll", () => this.schedule());
    this.frame = 0;
  }

  get element() {
    return this.viewport;
  }

  /** Replaces the nodes (in tree order, as GET /v1/jobs/{id}/nodes gives them) and redraws. */
  setNodes(nodes) {
    this.nodes = nodes;
    this.depth = new Map();
    this.hasChildren = new Set();
    for (const node of nodes) {
      const parentDepth = node.parent === null ? -1 : this.depth.get(node.parent) ?? -1;
      this.depth.set(node.id, parentDepth + 1);
      if (node.parent !== null) this.hasChildren.add(node.parent);
    }
    this.computeVisible();
    this.render();
  }

  computeVisible() {
    const visible = [];
    let hiddenBelow = Infinity;
    for (const node of this.nodes) {
      const depth = this.depth.get(node.id);
      if (depth > hiddenBelow) continue;
      hiddenBelow = Infinity;
      visible.push(node);
      if (this.collapsed.has(node.id)) hiddenBelow = depth;
    }
    this.visible = visible;
    this.spacer.style.height = `${visible.length * ROW_HEIGHT}px`;
    // As tall as the rows up to the stylesheet's max-height; a small job gets no empty box.
    this.viewport.style.height = `${Math.max(4, visible.length) * ROW_HEIGHT + 2}px`;
  }

  toggle(id) {
    if (this.collapsed.has(id)) this.collapsed.delete(id);
    else this.collapsed.add(id);
    this.computeVisible();
    this.render();
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.render();
    });
  }

  render() {
    const height = this.viewport.clientHeight || 600;
    const first = Math.max(0, Math.floor(this.viewport.scrollTop / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(this.visible.length, Math.ceil((this.viewport.scrollTop + height) / ROW_HEIGHT) + OVERSCAN);
    const rows = [];
    for (let i = first; i < last; i++) rows.push(this.row(this.visible[i], i));
    this.spacer.replaceChildren(...rows);
  }

  row(node, index) {
    const depth = this.depth.get(node.id);
    const toggle = this.hasChildren.has(node.id)
      ? el("button.toggle", {
          text: this.collapsed.has(node.id) ? "▸" : "▾",
          title: this.collapsed.has(node.id) ? "expand" : "collapse",
          onclick: (event) => {
            event.stopPropagation();
            this.toggle(node.id);
          },
        })
      : el("span.toggle");
    const row = el(
      `div.tree-row.state-row-${node.state}${this.selected === node.id ? ".selected" : ""}`,
      {
        role: "treeitem",
        "aria-level": depth + 1,
        dataset: { nodeId: node.id, state: node.state },
        style: { top: `${index * ROW_HEIGHT}px` },
        onclick: () => {
          this.selected = node.id;
          this.render();
          this.onSelect(node);
        },
      },
      el("span.indent", { style: { width: `${depth * 18}px` } }),
      toggle,
      el(`span.dot.state-${node.state}`, { title: node.state }),
      el("span.node-id", { text: node.id }),
      el("span.node-type", { text: node.type }),
      el(`span.node-state.fg-${node.state}`, { text: node.state }),
      el("span.node-elapsed", { text: formatMs(node.elapsed_ms) }),
      el("span.node-attempts", { text: node.attempts ? `×${node.attempts}` : "", title: "attempts" }),
      el("span.node-status", { text: node.status ?? "", title: "HTTP status" }),
      node.recovered ? el("span.recovered", { text: "recovered", title: "failed, then recovered with its recover value" }) : null,
    );
    return row;
  }
}
