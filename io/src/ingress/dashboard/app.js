// Entry point: sign-in, navigation between views, and the timers that sample /metrics and
// refresh the visible view.

import { call, errorText, onUnauthorized, paths, session } from './api.js';
import { byId, announce } from './dom.js';
import { Sampler, sample } from './metrics.js';
import * as views from './views.js';

const SAMPLE_MS = 2000;

const sampler = new Sampler();
sampler.intervalMs = SAMPLE_MS;

const all = {
  overview: views.overview(sampler),
  config: views.config(),
  history: views.history(),
  workers: views.workers(),
  rollouts: views.rollouts(),
  requests: views.requests(),
};

let current = null;
let viewTimer = 0;
let sampleTimer = 0;
let signedIn = false;

async function sampleOnce() {
  try {
    const res = await call('GET', paths.metrics, { accept: 'text/plain' });
    if (res.ok) {
      sampler.push(sample(res.text, Date.now()));
      if (current === 'overview') all.overview.drawPlots();
    }
  } catch {
    // The gateway may be restarting; the next tick tries again.
  }
}

function stopTimers() {
  clearInterval(viewTimer);
  clearInterval(sampleTimer);
  viewTimer = 0;
  sampleTimer = 0;
}

async function run(f) {
  try {
    await f();
  } catch (e) {
    announce(`Request failed: ${e.message}`);
  }
}

function route(focus) {
  if (!signedIn) return;
  const name = location.hash.replace(/^#/, '') || 'overview';
  const view = all[name] ? name : 'overview';
  current = view;
  for (const n of Object.keys(all)) byId(`view-${n}`).hidden = n !== view;
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.view === view) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.title = `${byId(`h-${view}`).textContent} · Sortie admin`;
  clearInterval(viewTimer);
  const v = all[view];
  run(v.show);
  if (v.refresh && v.intervalMs) {
    viewTimer = setInterval(() => { if (!document.hidden) run(v.refresh); }, v.intervalMs);
  }
  if (focus) byId('main').focus();
}

function showSignIn(message) {
  signedIn = false;
  current = null;
  stopTimers();
  byId('nav').hidden = true;
  byId('who').hidden = true;
  for (const n of Object.keys(all)) {
    const section = byId(`view-${n}`);
    section.hidden = true;
  }
  // Nothing the API returned stays on the page after signing out.
  for (const id of ['overview-cards', 'config-body', 'history-body', 'workers-body', 'rollouts-body', 'requests-body']) {
    byId(id).replaceChildren();
  }
  sampler.samples = [];
  byId('sign-in').hidden = false;
  const err = byId('sign-in-error');
  err.textContent = message || '';
  err.hidden = !message;
  document.title = 'Sign in · Sortie admin';
  byId('token').focus();
}

function start() {
  signedIn = true;
  byId('sign-in').hidden = true;
  byId('nav').hidden = false;
  byId('who').hidden = false;
  byId('who-actor').textContent = session.actor ? `Signed in as ${session.actor}` : 'Signed in (unattributed)';
  sampleOnce();
  sampleTimer = setInterval(sampleOnce, SAMPLE_MS);
  route(false);
}

onUnauthorized(() => {
  session.clear();
  showSignIn('The admin API no longer accepts the token (401). Sign in again.');
});

byId('sign-in-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const token = byId('token').value.trim();
  const actor = byId('actor').value.trim();
  const err = byId('sign-in-error');
  if (!token) return;
  if (actor && !/^[ -~]{1,256}$/.test(actor)) {
    err.textContent = 'The operator name must be printable ASCII, up to 256 characters.';
    err.hidden = false;
    return;
  }
  let res;
  try {
    res = await call('GET', paths.config, { token });
  } catch (x) {
    err.textContent = `Could not reach the admin API: ${x.message}`;
    err.hidden = false;
    return;
  }
  if (res.status === 401) {
    err.textContent = 'The admin API did not accept that token (401 admin_auth_required).';
    err.hidden = false;
    byId('token').select();
    return;
  }
  if (!res.ok) {
    err.textContent = `The admin API answered ${errorText(res)}.`;
    err.hidden = false;
    return;
  }
  session.save(token, actor);
  byId('token').value = '';
  err.hidden = true;
  start();
});

byId('sign-out').addEventListener('click', () => {
  session.clear();
  showSignIn();
  announce('Signed out.');
});

window.addEventListener('hashchange', () => route(true));

if (session.token) {
  // A reload keeps the tab's session; check the token is still good before showing data.
  call('GET', paths.config).then((res) => {
    if (res.ok) start();
    else if (res.status !== 401) showSignIn(`The admin API answered ${errorText(res)}.`);
  }, (x) => showSignIn(`Could not reach the admin API: ${x.message}`));
} else {
  showSignIn();
}
