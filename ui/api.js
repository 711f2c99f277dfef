// The jobserver API as the dashboard uses it: one fetch wrapper that adds the bearer token and turns
// answers into {status, body, headers}; a 401 asks the page for the token (see onUnauthorized).
const TOKEN_KEY = "jobserver.token";

let unauthorizedHandler = () => {};

export function onUnauthorized(handler) {
  unauthorizedHandler = handler;
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** An answer that is not 2xx, with the API error's code, message and path when the body has them. */
export class ApiError extends Error {
  constructor(status, body) {
    const e = body && typeof body === "object" && body.error ? body.error : {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || "";
    this.path = e.path;
    this.details = e.details || [];
  }
}

/**
 * Sends one request. `as` is "json" (default) or "text". Resolves with {status, body, headers} for any
 * status in `accept` (default: 2xx and 304); rejects with ApiError otherwise, after calling the
 * unauthorized handler on a 401.
 */
export async function request(method, path, { body, as = "json", accept, signal, headers = {} } = {}) {
  const h = { ...headers };
  const t = token();
  if (t) h["Authorization"] = `Bearer ${t}`;
  let payload;
  if (body !== undefined) {
    h["Content-Type"] = "application/json";
    payload = typeof body === "string" ? body : JSON.stringify(body);
  }
  const response = await fetch(path, { method, headers: h, body: payload, signal, cache: "no-store" });
  const text = response.status === 204 || response.status === 304 ? "" : await response.text();
  let parsed = text;
  if (as === "json" && text) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text;
    }
  }
  const ok = accept ? accept.includes(response.status) : response.ok || response.status === 304;
  if (!ok) {
    if (response.status === 401) unauthorizedHandler();
    throw new ApiError(response.status, parsed);
  }
  return { status: response.status, body: parsed, headers: response.headers };
}

export const getJSON = async (path, options) => (await request("GET", path, options)).body;

/**
 * Whether the server has `method path`: a route that does not exist is 404, one that exists answers
 * anything else to a request with an id that names no job (405 for another method, 404 only if
 * the route exists and the job does not, which the probe avoids by using another method).
 * Remembered per route for the page's life.
 */
const routeCache = new Map();
export function routeExists(method, pattern) {
  const key = `${method} ${pattern}`;
  if (!routeCache.has(key)) {
    // Probed with another method than the route's: 405 (with Allow naming it) means it is there.
    const probeMethod = method === "GET" ? "DELETE" : "GET";
    const path = pattern.replace("{id}", "00000000000000000000000000");
    routeCache.set(
      key,
      fetch(path, { method: probeMethod, headers: token() ? { Authorization: `Bearer ${token()}` } : {} })
        .then((r) => r.status === 405 && (r.headers.get("Allow") || "").split(/,\s*/).includes(method))
        .catch(() => false),
    );
  }
  return routeCache.get(key);
}
