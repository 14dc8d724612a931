// DOM helpers. Every value that comes from the API becomes a text node or an attribute value,
// never markup: nothing here parses HTML.

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
}

// h('button', {class: 'primary', onclick: f}, 'Save') builds an element.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'value') el.value = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

// Replaces the children of `el`.
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export const byId = (id) => document.getElementById(id);

// A table with a header row; `rows` are arrays of cells (nodes, text, or {cell, class}).
export function table(caption, headers, rows, empty = 'Nothing to show.') {
  if (!rows.length) return h('div', { class: 'table-wrap' }, h('p', { class: 'empty' }, empty));
  return h('div', { class: 'table-wrap' },
    h('table', {},
      h('caption', { class: 'sr-only' }, caption),
      h('thead', {}, h('tr', {}, headers.map((x) => h('th', { scope: 'col' }, x)))),
      h('tbody', {}, rows.map((r) => {
        const tr = h('tr', r.attrs || {});
        for (const c of r.cells || r) {
          if (c && typeof c === 'object' && 'cell' in c) tr.append(h('td', { class: c.class }, c.cell));
          else tr.append(h('td', {}, c));
        }
        return tr;
      }))));
}

export function badge(text, kind = 'muted') {
  return h('span', { class: `badge ${kind}` }, text);
}

// "2026-11-23T13:00:00Z" → local time with the age, or the raw text when it does not parse.
export function when(ts) {
  if (!ts) return '—';
  const d = new Date(ts);
  if (Number.isNaN(d.getTime())) return String(ts);
  const age = Math.round((Date.now() - d.getTime()) / 1000);
  let rel;
  if (age < 0) rel = 'in the future';
  else if (age < 60) rel = `${age}s ago`;
  else if (age < 3600) rel = `${Math.floor(age / 60)} min ago`;
  else if (age < 86400) rel = `${Math.floor(age / 3600)} h ago`;
  else rel = `${Math.floor(age / 86400)} d ago`;
  return `${d.toLocaleString()} (${rel})`;
}

let statusTimer = 0;
// A short message in the polite live region.
export function announce(text) {
  const el = byId('status');
  el.textContent = text;
  clearTimeout(statusTimer);
  statusTimer = setTimeout(() => { el.textContent = ''; }, 6000);
}
