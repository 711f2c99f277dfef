// Submitting a job from pasted JSON; a 422's JSON Pointer `path` is marked in the text.
import { request } from "./api.js";
import { el, rangeOfPointer } from "./util.js";

const EXAMPLE = `{
  "name": "example",
  "graph": {
    "type": "list",
    "children": [
      { "id": "a", "type": "fetch", "url": "http://127.0.0.1:9/a" },
      { "id": "b", "type": "fetch", "url": "http://127.0.0.1:9/b" }
    ]
  }
}`;

let draft = EXAMPLE;

export function submitView(main, ctx) {
  const text = el("textarea#job-json", { spellcheck: "false", rows: 18, "aria-label": "job JSON" });
  text.value = draft;
  const error = el("div#submit-error.error-box", { hidden: true });
  const source = el("pre#submit-source.source", { hidden: true });
  const button = el("button#submit-job.primary", { text: "Submit", onclick: () => submit().catch(ctx.report) });
  text.addEventListener("input", () => {
    draft = text.value;
    source.hidden = true;
  });
  main.replaceChildren(
    el(
      "section.submit",
      {},
      el("h1", { text: "Submit a job" }),
      el("p.muted", { text: "Paste a job (API.md §1.1) and submit it; a mistake is marked where it is." }),
      text,
      el("div.actions", {}, button),
      error,
      source,
    ),
  );

  function showError(message, pointer) {
    error.hidden = false;
    error.replaceChildren(el("strong", { text: "Not submitted: " }), message, pointer !== undefined ? el("code", { text: ` at ${pointer || "/"}` }) : "");
    source.hidden = true;
    if (pointer === undefined) return;
    const found = rangeOfPointer(text.value, pointer);
    if (!found) return;
    const [start, end] = found.range;
    const value = text.value;
    source.replaceChildren(
      value.slice(0, start),
      el("mark#error-mark", { title: message, dataset: { pointer: found.pointer } }, value.slice(start, end)),
      value.slice(end),
    );
    source.hidden = false;
    text.focus();
    text.setSelectionRange(start, end);
    const mark = source.querySelector("mark");
    if (mark) mark.scrollIntoView({ block: "nearest" });
  }

  async function submit() {
    error.hidden = true;
    source.hidden = true;
    try {
      JSON.parse(text.value);
    } catch (e) {
      showError(`the text is not JSON: ${e.message}`);
      return;
    }
    const { status, body } = await request("POST", "/v1/jobs", { body: text.value, accept: [200, 201, 400, 413, 415, 422, 429, 503] });
    if (status === 200 || status === 201) {
      location.hash = `#/jobs/${body.id}`;
      return;
    }
    const e = (body && body.error) || {};
    showError(e.message || `HTTP ${status}`, status === 422 ? e.path ?? "" : undefined);
  }
}
