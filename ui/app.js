// The dashboard's entry: hash routes (#/, #/jobs/ID, #/submit, #/overview), the token gate, and the
// context each view gets (timers and watches that stop when the view is left, error reporting).
import { onUnauthorized, request, setToken, token } from "./api.js";
import { jobsView } from "./jobs.js";
import { jobView } from "./job.js";
import { submitView } from "./submit.js";
import { overviewView } from "./overview.js";
import { el } from "./util.js";

const main = document.getElementById("main");
const status = document.getElementById("status");
const nav = document.getElementById("nav");
let current = null;
let locked = false;

function makeContext() {
  const leave = [];
  let alive = true;
  const ctx = {
    alive: () => alive,
    onLeave: (f) => leave.push(f),
    report(error) {
      if (!alive || (error && error.name === "AbortError") || (error && error.status === 401)) return;
      status.textContent = String(error && error.message ? error.message : error);
      status.className = "status-error";
    },
    /** Runs f now and then every ms after it finished, while the view is shown. */
    every(ms, f) {
      let timer = 0;
      const run = async () => {
        try {
          await f();
          if (status.className === "status-error") {
            status.textContent = "";
            status.className = "";
          }
        } catch (e) {
          ctx.report(e);
        }
        if (alive && !locked) timer = setTimeout(run, ms);
      };
      run();
      leave.push(() => clearTimeout(timer));
    },
    stop() {
      alive = false;
      for (const f of leave) f();
    },
  };
  return ctx;
}

function route() {
  if (current) current.stop();
  current = makeContext();
  if (locked) return;
  status.textContent = "";
  status.className = "";
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query = ""] = hash.split("?");
  const params = new URLSearchParams(query);
  for (const a of nav.querySelectorAll("a")) a.classList.toggle("active", a.getAttribute("href") === `#${path}`);
  const m = path.match(/^\/jobs\/([^/]+)$/);
  if (m) jobView(main, current, decodeURIComponent(m[1]));
  else if (path === "/submit") submitView(main, current);
  else if (path === "/overview") overviewView(main, current);
  else jobsView(main, current, params);
}

/** Shows only the token form: nothing of the server's data is on the page without the token. */
function lock() {
  if (locked) return;
  locked = true;
  if (current) current.stop();
  nav.hidden = true;
  const input = el("input#token-input", { type: "password", autocomplete: "off", "aria-label": "token", placeholder: "token" });
  const message = el("p.muted", { text: token() ? "That token was refused." : "This server needs a token." });
  const form = el(
    "form#token-form.token",
    {
      onsubmit: async (event) => {
        event.preventDefault();
        setToken(input.value.trim());
        const ok = await check();
        if (ok) {
          locked = false;
          nav.hidden = false;
          route();
        } else {
          message.textContent = "That token was refused.";
        }
      },
    },
    el("h1", { text: "Sign in" }),
    message,
    input,
    el("button.primary", { type: "submit", text: "Continue" }),
  );
  main.replaceChildren(form);
  input.focus();
}

/** Whether the API answers with the token we have (or without one, when the server needs none). */
async function check() {
  try {
    await request("GET", "/v1/jobs?limit=1", { accept: [200] });
    return true;
  } catch (error) {
    if (error.status === 401) return false;
    throw error;
  }
}

onUnauthorized(lock);
window.addEventListener("hashchange", route);

(async () => {
  // Nothing is drawn before the server said whether it needs a token.
  const ok = await check().catch(() => true);
  if (ok) route();
})();
