// The JSON API: same-origin fetches with the session cookie; non-GET requests carry the
// CSRF header. A 401 anywhere (except the login call itself) reports "not logged in".

export class ApiError extends Error {
  constructor(status, message, body = null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.body = body;
  }
}

let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

/**
 * api(path, {method, body, auth}) → parsed JSON (or null). Throws ApiError; status 0 means
 * the server could not be reached. auth: false skips the global 401 handling.
 */
export async function api(path, { method = 'GET', body, auth = true } = {}) {
  const init = { method, credentials: 'same-origin', headers: { Accept: 'application/json' } };
  if (method !== 'GET') {
    init.headers['X-Flowtide-CSRF'] = '1';
    init.headers['Content-Type'] = 'application/json';
    if (body !== undefined) init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, `Cannot reach the server (${err.message})`);
  }
  let data = null;
  const text = await res.text().catch(() => '');
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!res.ok) {
    const msg = (data && data.error && data.error.message) || res.statusText || `HTTP ${res.status}`;
    const err = new ApiError(res.status, String(msg), data);
    if (res.status === 401 && auth) onUnauthorized(err);
    throw err;
  }
  return data;
}

export const enc = encodeURIComponent;

/**
 * openStream(path, {signal}) → the Response of a text/event-stream GET, status 200 (its
 * body not read yet). Throws ApiError like api(): status 0 when unreachable or aborted.
 */
export async function openStream(path, { signal } = {}) {
  let res;
  try {
    res = await fetch(path, {
      credentials: 'same-origin', cache: 'no-store', signal, headers: { Accept: 'text/event-stream' },
    });
  } catch (err) {
    throw new ApiError(0, `Cannot reach the server (${err.message})`);
  }
  if (res.ok) return res;
  let data = null;
  try { data = JSON.parse(await res.text()); } catch { data = null; }
  const msg = (data && data.error && data.error.message) || res.statusText || `HTTP ${res.status}`;
  const err = new ApiError(res.status, String(msg), data);
  if (res.status === 401) onUnauthorized(err);
  throw err;
}
