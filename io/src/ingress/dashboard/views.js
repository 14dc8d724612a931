// The dashboard's views. Each one is {show(), refresh(), intervalMs}; they read the admin API
// and render its values as text.

import { call, errorText, paths } from './api.js';
import { h, fill, byId, table, badge, when, announce } from './dom.js';
import { pretty, lineOf, diffView } from './diff.js';
import { plot } from './plot.js';

// Re-renders `el` and gives focus back to the control that had it (matched by data-key), so an
// auto-refresh does not throw a keyboard user back to the top.
function rerender(el, ...children) {
  const key = el.contains(document.activeElement) ? document.activeElement.dataset.key : undefined;
  fill(el, ...children);
  if (key) {
    const again = [...el.querySelectorAll('[data-key]')].find((x) => x.dataset.key === key);
    if (again) again.focus();
  }
}

function alertBox(title, ...body) {
  return h('div', { class: 'alert', role: 'alert' }, h('h3', {}, title), ...body);
}

function failed(el, what, res) {
  fill(el, alertBox(`Could not load ${what}`, h('p', {}, errorText(res))));
}

function recordLine(r) {
  return `revision ${r.revision} · ${r.action} by ${r.actor} · ${when(r.created_at)}`;
}

// ---------------------------------------------------------------- Overview

export function overview(sampler) {
  const cards = byId('overview-cards');
  const drawPlots = () => {
    const now = Date.now();
    // The x axis covers the samples taken so far (at least 30 s), up to the sampler's window.
    const first = sampler.samples.length ? sampler.samples[0].t : now;
    const windowMs = Math.min(sampler.windowMs, Math.max(30_000, now - first));
    plot(byId('plot-rate'), {
      title: 'Request rate', unit: 'req/s', now, windowMs,
      series: [{ name: 'all', points: sampler.rate() }],
    });
    const errs = sampler.errors();
    plot(byId('plot-errors'), {
      title: 'Errors by code', unit: 'err/s', now, windowMs,
      series: Object.entries(errs).map(([name, points]) => ({ name, points })),
      empty: 'No errors in the window.',
    });
    plot(byId('plot-latency'), {
      title: 'Latency (total)', unit: 'ms', now, windowMs,
      series: [{ name: 'p50', points: sampler.latency(0.5) }, { name: 'p99', points: sampler.latency(0.99) }],
    });
    const n = sampler.samples.length;
    byId('metrics-note').textContent = n
      ? `Sampled from /metrics every ${sampler.intervalMs / 1000} s in this page; ${n} sample${n === 1 ? '' : 's'} kept (at most ${Math.round(sampler.windowMs / 60000)} min). Latency quantiles are over the last ${sampler.latencyWindow * sampler.intervalMs / 1000} s.`
      : 'Waiting for the first /metrics sample…';
  };
  const refresh = async () => {
    const [cfg, workers, reqs, rollouts] = await Promise.all([
      call('GET', paths.config), call('GET', paths.workers), call('GET', paths.requests), call('GET', paths.rollouts),
    ]);
    const card = (label, big, ...sub) => h('div', { class: 'card' },
      h('div', { class: 'label' }, label), h('div', { class: 'big' }, big), ...sub.map((x) => h('div', { class: 'sub' }, x)));
    const out = [];
    if (cfg.ok) {
      const r = cfg.json;
      out.push(card('Active revision', `#${r.revision}`, `${r.action} by ${r.actor}`, when(r.created_at)));
    } else out.push(card('Active revision', '?', errorText(cfg)));
    if (workers.ok) {
      const items = workers.json.items || [];
      const counts = new Map();
      const bump = (k) => counts.set(k, (counts.get(k) || 0) + 1);
      for (const w of items) {
        bump(w.state);
        if (w.draining) bump('draining');
        if (!w.enabled) bump('disabled');
      }
      const used = items.reduce((a, w) => a + (w.capacity?.active || 0), 0);
      const max = items.reduce((a, w) => a + (w.capacity?.max || 0), 0);
      out.push(card('Workers', String(items.length),
        h('span', { 'data-testid': 'worker-states' }, [...counts].map(([k, v]) => badge(`${v} ${k}`,
          k === 'connected' ? 'ok' : k === 'draining' ? 'warn' : k === 'disabled' || k === 'disconnected' ? 'bad' : 'muted'))),
        `Capacity in use: ${used} of ${max}`));
    } else out.push(card('Workers', '?', errorText(workers)));
    if (reqs.ok) out.push(card('Active requests', String((reqs.json.items || []).length)));
    else out.push(card('Active requests', '?', errorText(reqs)));
    if (rollouts.ok) {
      const r = rollouts.json;
      const pending = (r.entries || []).filter((e) => e.status !== 'applied').length;
      out.push(card('Rollout', String(r.control?.status ?? '?'), `config version ${r.config_version}`,
        `${(r.entries || []).length - pending} applied, ${pending} pending`));
    }
    fill(cards, out);
    drawPlots();
  };
  return { show: refresh, refresh, intervalMs: 5000, drawPlots };
}

// ---------------------------------------------------------------- Config

export function config() {
  const el = byId('config-body');
  // The revision the editor is based on: {record, etag}.
  let base = null;
  let editor;
  let panel;
  let meta;

  const select = (line) => {
    const lines = editor.value.split('\n');
    const text = lines[line] || '';
    const indent = text.length - text.trimStart().length;
    const start = lines.slice(0, line).reduce((a, l) => a + l.length + 1, 0) + indent;
    editor.focus();
    editor.setSelectionRange(start, start + text.length - indent);
    const lh = parseFloat(getComputedStyle(editor).lineHeight) || 18;
    editor.scrollTop = Math.max(0, line * lh - editor.clientHeight / 3);
  };

  const parseEditor = () => {
    try {
      return { value: JSON.parse(editor.value) };
    } catch (e) {
      return { error: e.message };
    }
  };

  const load = async (note) => {
    const res = await call('GET', paths.config);
    if (!res.ok) return failed(el, 'the configuration', res);
    base = { record: res.json, etag: res.etag };
    editor = h('textarea', {
      id: 'config-editor', spellcheck: 'false', autocomplete: 'off', 'aria-label': 'Snapshot JSON',
      'aria-describedby': 'config-meta config-panel', wrap: 'off',
      value: pretty(base.record.snapshot).text,
    });
    editor.addEventListener('input', () => editor.removeAttribute('aria-invalid'));
    meta = h('p', { class: 'meta', id: 'config-meta' }, `Editing ${recordLine(base.record)}`);
    panel = h('div', { id: 'config-panel' });
    fill(el,
      meta,
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'primary', id: 'config-review', onclick: review }, 'Review changes'),
        h('button', { type: 'button', id: 'config-format', onclick: format }, 'Format'),
        h('button', { type: 'button', id: 'config-reload', onclick: () => load('Reloaded the active configuration.') }, 'Reload active')),
      panel,
      h('div', { class: 'editor-grid' }, editor));
    if (note) fill(panel, h('div', { class: 'notice', role: 'status' }, note));
  };

  const format = () => {
    const p = parseEditor();
    if (p.error) return fill(panel, alertBox('Not valid JSON', h('p', {}, p.error)));
    editor.value = pretty(p.value).text;
    return fill(panel);
  };

  const review = async () => {
    const p = parseEditor();
    if (p.error) {
      editor.setAttribute('aria-invalid', 'true');
      return fill(panel, alertBox('Not valid JSON', h('p', {}, p.error)));
    }
    // The diff is against the snapshot active now, which may be newer than the editor's base.
    const cur = await call('GET', paths.config);
    if (!cur.ok) return fill(panel, alertBox('Could not read the active configuration', h('p', {}, errorText(cur))));
    const d = diffView(cur.json.snapshot, p.value, { label: 'Changes against the active snapshot' });
    const newer = cur.json.revision !== base.record.revision
      ? h('div', { class: 'notice' }, `The active configuration is now revision ${cur.json.revision} (${cur.json.action} by ${cur.json.actor}); your edit is based on revision ${base.record.revision}. Saving will be refused until you reload or keep your edit on top of it.`)
      : null;
    return fill(panel,
      h('h3', {}, `Changes against active revision ${cur.json.revision}`),
      newer,
      d.node,
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'primary', id: 'config-save', disabled: d.changed === 0, onclick: save },
          `Save as revision ${base.record.revision + 1}`),
        h('button', { type: 'button', onclick: () => { fill(panel); editor.focus(); } }, 'Back to editing'),
        d.changed === 0 ? h('span', { class: 'hint' }, 'Nothing to save.') : null));
  };

  const save = async () => {
    const res = await call('PUT', paths.config, { body: editor.value, ifMatch: base.etag });
    if (res.ok) {
      announce(`Saved revision ${res.json.revision}.`);
      return load(`Saved: revision ${res.json.revision} is active.`);
    }
    if (res.status === 409) return conflict();
    if (res.status === 422 && res.json) return invalid(res.json);
    return fill(panel, alertBox(`Not saved (HTTP ${res.status})`, h('p', {}, errorText(res))));
  };

  // Someone else saved first: show who, and their change against the editor's base.
  const conflict = async () => {
    const cur = await call('GET', paths.config);
    if (!cur.ok) return fill(panel, alertBox('Not saved: the configuration changed', h('p', {}, errorText(cur))));
    const theirs = cur.json;
    const d = diffView(base.record.snapshot, theirs.snapshot, { label: 'Their change' });
    const keep = () => {
      base = { record: theirs, etag: cur.etag };
      meta.textContent = `Editing on top of ${recordLine(theirs)}`;
      return review();
    };
    return fill(panel, h('div', { class: 'alert', role: 'alert', id: 'config-conflict' },
      h('h3', {}, 'Not saved: someone else saved first (409 revision_conflict)'),
      h('p', {}, `Your edit is based on revision ${base.record.revision}. Revision ${theirs.revision} is now active: ${theirs.action} by ${theirs.actor}, ${when(theirs.created_at)}.`),
      h('p', {}, `Their change (revision ${base.record.revision} → ${theirs.revision}):`),
      d.node,
      h('div', { class: 'actions' },
        h('button', { type: 'button', onclick: () => load(`Loaded revision ${theirs.revision}; your edit was discarded.`) }, 'Load theirs, discard mine'),
        h('button', { type: 'button', onclick: keep }, `Keep my edit on top of revision ${theirs.revision}`))));
  };

  // A 422: the message at its JSON path, and the line selected in the editor.
  const invalid = (body) => {
    editor.setAttribute('aria-invalid', 'true');
    const path = typeof body.path === 'string' ? body.path : '';
    let line = null;
    const p = parseEditor();
    if (path && p.value !== undefined) {
      const pr = pretty(p.value);
      if (pr.text !== editor.value) editor.value = pr.text;
      line = lineOf(pr.at, path);
    }
    let message = String(body.message || body.error || 'invalid snapshot');
    // The API's message starts with the path; it is shown once, as the path.
    if (path && message.startsWith(`${path}: `)) message = message.slice(path.length + 2);
    fill(panel, h('div', { class: 'alert', role: 'alert', id: 'config-invalid' },
      h('h3', {}, 'Not saved: the snapshot is invalid (422)'),
      path ? h('p', {}, 'At ', h('code', { class: 'json-path' }, path), ': ', message) : h('p', {}, message),
      line !== null ? h('p', {}, `Line ${line + 1}: `, h('code', {}, editor.value.split('\n')[line].trim())) : null,
      line !== null ? h('div', { class: 'actions' }, h('button', { type: 'button', onclick: () => select(line) }, 'Show in editor')) : null));
    if (line !== null) select(line);
  };

  return { show: () => load(), refresh: null };
}

// ---------------------------------------------------------------- History

export function history() {
  const el = byId('history-body');
  const show = async (note) => {
    const [hist, cfg] = await Promise.all([call('GET', paths.history), call('GET', paths.config)]);
    if (!hist.ok) return failed(el, 'the history', hist);
    if (!cfg.ok) return failed(el, 'the configuration', cfg);
    const items = hist.json.items || [];
    const active = cfg.json.revision;
    const byRev = new Map(items.map((r) => [r.revision, r]));
    const option = (r, sel) => h('option', { value: String(r.revision), selected: sel }, `#${r.revision} · ${r.action} by ${r.actor}`);
    const from = h('select', { id: 'diff-from' }, items.map((r, i) => option(r, i === Math.min(1, items.length - 1))));
    const to = h('select', { id: 'diff-to' }, items.map((r, i) => option(r, i === 0)));
    const out = h('div', { id: 'history-diff' });
    const redraw = () => {
      const a = byRev.get(Number(from.value));
      const b = byRev.get(Number(to.value));
      if (!a || !b) return fill(out);
      return fill(out, h('h3', {}, `Revision ${a.revision} → ${b.revision}`),
        diffView(a.snapshot, b.snapshot, { label: `Diff of revisions ${a.revision} and ${b.revision}` }).node);
    };
    from.addEventListener('change', redraw);
    to.addEventListener('change', redraw);

    const rollback = async (r) => {
      if (!window.confirm(`Roll back to revision ${r.revision}? Its snapshot becomes active as a new revision.`)) return;
      const res = await call('POST', paths.rollback, { ifMatch: cfg.etag, body: JSON.stringify({ config_version: r.revision }) });
      if (res.ok) {
        announce(`Rolled back: revision ${res.json.revision} is active.`);
        show(h('div', { class: 'notice', role: 'status' }, `Rolled back to revision ${r.revision}: revision ${res.json.revision} is active.`));
      } else if (res.status === 409) {
        show(alertBox('Not rolled back: the configuration changed since this list was loaded (409)', h('p', {}, 'The list is refreshed; check the newest revision and try again.')));
      } else {
        show(alertBox(`Not rolled back (HTTP ${res.status})`, h('p', {}, errorText(res))));
      }
    };
    const rows = items.map((r) => ({
      attrs: { class: r.revision === active ? 'active-rev' : '', 'data-revision': String(r.revision) },
      cells: [
        { cell: [`#${r.revision} `, r.revision === active ? badge('active', 'ok') : null], class: 'num' },
        r.action, r.actor, when(r.created_at),
        r.revision === active ? '' : h('button', { type: 'button', 'data-key': `rb-${r.revision}`, onclick: () => rollback(r) }, `Roll back to #${r.revision}`),
      ],
    }));
    fill(el,
      note || null,
      table('Configuration history, newest first', ['Revision', 'Action', 'Actor', 'When', ''], rows, 'No history.'),
      items.length > 1 ? h('div', { class: 'history-pick' },
        h('div', {}, h('label', { for: 'diff-from' }, 'From'), from),
        h('div', {}, h('label', { for: 'diff-to' }, 'To'), to)) : null,
      out);
    return redraw();
  };
  return { show: () => show(), refresh: null };
}

// ---------------------------------------------------------------- Workers

export function workers() {
  const el = byId('workers-body');
  let note = null;
  const refresh = async () => {
    const res = await call('GET', paths.workers);
    if (!res.ok) return failed(el, 'the workers', res);
    const items = res.json.items || [];
    const act = async (w, action) => {
      if (action === 'disable' && !window.confirm(`Disable worker ${w.worker_id}? It takes no new requests until enabled.`)) return;
      const r = await call('POST', paths.worker(w.worker_id, action), { ifMatch: w.etag });
      if (r.ok) {
        note = null;
        announce(`Worker ${w.worker_id}: ${action} done.`);
      } else if (r.status === 409) {
        note = alertBox(`Worker ${w.worker_id} changed since the list was loaded (409)`, h('p', {}, 'The list is refreshed; check its state and try again.'));
      } else {
        note = alertBox(`${action} ${w.worker_id} failed (HTTP ${r.status})`, h('p', {}, errorText(r)));
      }
      await refresh();
    };
    const rows = items.map((w) => {
      const cap = w.capacity || { active: 0, max: 0, available: 0 };
      const states = [badge(w.state, w.state === 'connected' ? 'ok' : w.state === 'disconnected' ? 'bad' : 'muted')];
      if (w.draining) states.push(badge('draining', 'warn'));
      if (!w.enabled) states.push(badge('disabled', 'bad'));
      const id = w.worker_id;
      return {
        attrs: { 'data-worker': id },
        cells: [
          [h('strong', {}, id), h('div', { class: 'hint' }, `${w.executor}${w.session ? ` · session ${w.session}` : ''}`)],
          states,
          h('span', { class: 'cap' },
            h('meter', { min: '0', max: String(Math.max(cap.max, 1)), value: String(cap.active), 'aria-label': `${id} capacity in use` }),
            h('span', {}, `${cap.active} / ${cap.max}`)),
          when(w.last_seen),
          (w.pools || []).join(', ') || '—',
          (w.tags || []).length ? w.tags.map((t) => badge(t)) : '—',
          h('div', { class: 'actions' },
            w.draining
              ? h('button', { type: 'button', 'data-key': `undrain-${id}`, onclick: () => act(w, 'undrain') }, 'Undrain')
              : h('button', { type: 'button', 'data-key': `drain-${id}`, onclick: () => act(w, 'drain') }, 'Drain'),
            w.enabled
              ? h('button', { type: 'button', class: 'danger', 'data-key': `disable-${id}`, onclick: () => act(w, 'disable') }, 'Disable')
              : h('button', { type: 'button', 'data-key': `enable-${id}`, onclick: () => act(w, 'enable') }, 'Enable')),
        ],
      };
    });
    return rerender(el, note,
      table('Workers by id', ['Worker', 'State', 'Capacity', 'Last seen', 'Pools', 'Tags', 'Actions'], rows, 'No workers.'));
  };
  return { show: () => { note = null; return refresh(); }, refresh, intervalMs: 5000 };
}

// ---------------------------------------------------------------- Rollouts

export function rollouts() {
  const el = byId('rollouts-body');
  const refresh = async () => {
    const res = await call('GET', paths.rollouts);
    if (!res.ok) return failed(el, 'the rollout', res);
    const r = res.json;
    const entries = r.entries || [];
    const pending = entries.filter((e) => e.status !== 'applied').length;
    return rerender(el,
      h('div', { class: 'cards' },
        h('div', { class: 'card' }, h('div', { class: 'label' }, 'Config version'), h('div', { class: 'big' }, `#${r.config_version}`)),
        h('div', { class: 'card' }, h('div', { class: 'label' }, 'Control'), h('div', { class: 'big' }, String(r.control?.status ?? '?'))),
        h('div', { class: 'card' }, h('div', { class: 'label' }, 'Workers'), h('div', { class: 'big' }, `${entries.length - pending} / ${entries.length}`), h('div', { class: 'sub' }, `applied; ${pending} pending`))),
      h('h3', {}, 'Per worker'),
      table('Rollout entries', ['Worker', 'Status'], entries.map((e) => [e.worker_id,
        badge(e.status, e.status === 'applied' ? 'ok' : 'warn')]), 'No workers take part in this rollout.'));
  };
  return { show: refresh, refresh, intervalMs: 3000 };
}

// ---------------------------------------------------------------- Active requests

export function requests() {
  const el = byId('requests-body');
  let auto = true;
  let note = null;
  const refresh = async () => {
    const res = await call('GET', paths.requests);
    if (!res.ok) return failed(el, 'the active requests', res);
    const items = res.json.items || [];
    const cancel = async (it) => {
      if (!window.confirm(`Cancel request ${it.request_id}? The caller gets a 499 cancelled answer.`)) return;
      const r = await call('DELETE', paths.request(it.request_id));
      if (r.status === 204) {
        note = h('div', { class: 'notice', role: 'status' }, `Cancelled ${it.request_id}.`);
      } else if (r.status === 404) {
        note = h('div', { class: 'notice', role: 'status' }, `${it.request_id} had already finished.`);
      } else {
        note = alertBox(`Could not cancel ${it.request_id} (HTTP ${r.status})`, h('p', {}, errorText(r)));
      }
      await refresh();
    };
    const toggle = h('label', { class: 'hint' },
      h('input', { type: 'checkbox', id: 'requests-auto', checked: auto, 'data-key': 'auto', onchange: (e) => { auto = e.target.checked; } }),
      ' Auto-refresh every 2 s');
    return rerender(el,
      h('div', { class: 'actions' }, toggle,
        h('button', { type: 'button', 'data-key': 'refresh', onclick: refresh }, 'Refresh now'),
        h('span', { class: 'hint' }, `${items.length} active · updated ${new Date().toLocaleTimeString()}`)),
      note,
      table('Active requests', ['Request', 'Deployment', ''], items.map((it) => ({
        attrs: { 'data-request': it.request_id },
        cells: [h('code', {}, it.request_id), it.deployment_id,
          h('button', { type: 'button', class: 'danger', 'data-key': `cancel-${it.request_id}`, onclick: () => cancel(it) }, 'Cancel')],
      })), 'No requests in flight.'));
  };
  return { show: () => { note = null; return refresh(); }, refresh: () => (auto ? refresh() : null), intervalMs: 2000 };
}
