// The admin API client: the token lives in sessionStorage and goes out as a bearer token; no
// cookies are sent (credentials: 'omit') and every call stays on this origin.

const TOKEN = 'sortie.admin.token';
const ACTOR = 'sortie.admin.actor';

// Bumped whenever the signed-in session changes, so that an answer to a call made under an
// earlier session is never rendered (sign-out must leave nothing of the API's data on screen).
let epoch = 0;

export const session = {
  get token() { return sessionStorage.getItem(TOKEN); },
  get actor() { return sessionStorage.getItem(ACTOR) || ''; },
  save(token, actor) {
    epoch += 1;
    sessionStorage.setItem(TOKEN, token);
    if (actor) sessionStorage.setItem(ACTOR, actor); else sessionStorage.removeItem(ACTOR);
  },
  clear() {
    epoch += 1;
    sessionStorage.removeItem(TOKEN);
    sessionStorage.removeItem(ACTOR);
  },
};

let unauthorized = () => {};
// Called when the API answers 401 to the stored token (revoked or rotated).
export function onUnauthorized(f) { unauthorized = f; }

// One call. Resolves to {status, ok, etag, json, text}; rejects only on network failure. A call
// whose session ended before its answer came never settles: nothing waits on it any more.
export async function call(method, path, { body, ifMatch, token, accept } = {}) {
  const started = epoch;
  const headers = { Authorization: `Bearer ${token ?? session.token ?? ''}` };
  headers.Accept = accept || 'application/json';
  if (ifMatch) headers['If-Match'] = ifMatch;
  if (method !== 'GET' && session.actor) headers['X-Service-Actor'] = session.actor;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, {
    method, headers, body, credentials: 'omit', cache: 'no-store', redirect: 'error',
    referrerPolicy: 'no-referrer',
  });
  const text = await r.text();
  let json = null;
  if (text && (r.headers.get('Content-Type') || '').startsWith('application/json')) {
    try { json = JSON.parse(text); } catch { json = null; }
  }
  if (epoch !== started && token === undefined) return new Promise(() => {});
  const res = { status: r.status, ok: r.ok, etag: r.headers.get('ETag'), json, text };
  if (r.status === 401 && token === undefined) unauthorized(res);
  return res;
}

// The error text of a failed answer: the API's {"error": ...} (and message), or the status.
export function errorText(res) {
  const j = res.json;
  if (j && typeof j === 'object') {
    if (j.message && j.error) return `${j.error}: ${j.message}`;
    if (j.error) return String(j.error);
  }
  return `HTTP ${res.status}`;
}

export const paths = {
  config: '/api/v1/admin/config',
  history: '/api/v1/admin/config/history',
  rollback: '/api/v1/admin/config/rollback',
  rollouts: '/api/v1/admin/rollouts',
  workers: '/api/v1/admin/workers',
  worker: (id, action) => `/api/v1/admin/workers/${encodeURIComponent(id)}/${action}`,
  requests: '/api/v1/admin/requests',
  request: (id) => `/api/v1/admin/requests/${encodeURIComponent(id)}`,
  metrics: '/metrics',
};
