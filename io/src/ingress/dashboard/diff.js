// JSON pretty-printing that remembers where each value starts, and a line diff for reviewing
// snapshot changes.

import { h } from './dom.js';

// Pretty-prints like JSON.stringify(value, null, 2) and records, for every JSON path in the
// admin API's notation (`routing.rules[0].pools[1]`), the line its value starts on. With
// `sortKeys`, object keys are sorted so that two documents diff by content, not key order.
export function pretty(value, { sortKeys = false } = {}) {
  const lines = [];
  const at = new Map();
  const walk = (v, path, indent, prefix, comma) => {
    at.set(path, lines.length);
    if (Array.isArray(v)) {
      if (!v.length) { lines.push(`${indent}${prefix}[]${comma}`); return; }
      lines.push(`${indent}${prefix}[`);
      v.forEach((x, i) => walk(x, `${path}[${i}]`, `${indent}  `, '', i < v.length - 1 ? ',' : ''));
      lines.push(`${indent}]${comma}`);
    } else if (v !== null && typeof v === 'object') {
      const keys = Object.keys(v);
      if (sortKeys) keys.sort();
      if (!keys.length) { lines.push(`${indent}${prefix}{}${comma}`); return; }
      lines.push(`${indent}${prefix}{`);
      keys.forEach((k, i) => walk(v[k], path ? `${path}.${k}` : k, `${indent}  `,
        `${JSON.stringify(k)}: `, i < keys.length - 1 ? ',' : ''));
      lines.push(`${indent}}${comma}`);
    } else {
      lines.push(`${indent}${prefix}${JSON.stringify(v)}${comma}`);
    }
  };
  walk(value, '', '', '', '');
  return { text: lines.join('\n'), lines, at };
}

// The line of `path`, or of its nearest ancestor present in the document (a 422 may name a
// field that is missing).
export function lineOf(at, path) {
  let p = path;
  while (p) {
    if (at.has(p)) return at.get(p);
    const cut = Math.max(p.lastIndexOf('.'), p.lastIndexOf('['));
    if (cut <= 0) break;
    p = p.slice(0, cut);
  }
  return at.has(p) ? at.get(p) : 0;
}

// Cells of the longest-common-subsequence table beyond which the middle of a change is shown
// as a whole replacement (keeps the page responsive on very large snapshots).
const MAX_CELLS = 4_000_000;

// A line diff: [{op: ' ' | '+' | '-', text}].
export function diffLines(a, b) {
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start += 1;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) { endA -= 1; endB -= 1; }
  const out = a.slice(0, start).map((text) => ({ op: ' ', text }));
  const midA = a.slice(start, endA);
  const midB = b.slice(start, endB);
  const n = midA.length;
  const m = midB.length;
  if (n * m > MAX_CELLS) {
    for (const text of midA) out.push({ op: '-', text });
    for (const text of midB) out.push({ op: '+', text });
  } else {
    // lcs[i][j]: length of the LCS of midA[i..] and midB[j..], in one flat array.
    const w = m + 1;
    const lcs = new Uint32Array((n + 1) * w);
    for (let i = n - 1; i >= 0; i -= 1) {
      for (let j = m - 1; j >= 0; j -= 1) {
        lcs[i * w + j] = midA[i] === midB[j]
          ? lcs[(i + 1) * w + j + 1] + 1
          : Math.max(lcs[(i + 1) * w + j], lcs[i * w + j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < n && j < m) {
      if (midA[i] === midB[j]) { out.push({ op: ' ', text: midA[i] }); i += 1; j += 1; }
      else if (lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) { out.push({ op: '-', text: midA[i] }); i += 1; }
      else { out.push({ op: '+', text: midB[j] }); j += 1; }
    }
    while (i < n) { out.push({ op: '-', text: midA[i] }); i += 1; }
    while (j < m) { out.push({ op: '+', text: midB[j] }); j += 1; }
  }
  for (const text of a.slice(endA)) out.push({ op: ' ', text });
  return out;
}

// A rendered diff of two JSON values, unchanged runs folded to `context` lines around changes.
export function diffView(before, after, { label = 'Differences', context = 3 } = {}) {
  const d = diffLines(pretty(before, { sortKeys: true }).lines, pretty(after, { sortKeys: true }).lines);
  const changed = d.filter((x) => x.op !== ' ').length;
  const pre = h('div', { class: 'diff', role: 'region', 'aria-label': label, tabindex: '0' });
  if (!changed) {
    pre.append(h('div', { class: 'gap' }, 'No differences.'));
    return { node: pre, changed };
  }
  const keep = d.map(() => false);
  d.forEach((x, i) => {
    if (x.op === ' ') return;
    for (let k = Math.max(0, i - context); k <= Math.min(d.length - 1, i + context); k += 1) keep[k] = true;
  });
  let skipped = 0;
  const flush = () => {
    if (skipped) pre.append(h('div', { class: 'gap' }, `… ${skipped} unchanged line${skipped === 1 ? '' : 's'}`));
    skipped = 0;
  };
  d.forEach((x, i) => {
    if (!keep[i]) { skipped += 1; return; }
    flush();
    const cls = x.op === '+' ? 'add' : x.op === '-' ? 'del' : 'same';
    pre.append(h('div', { class: cls }, `${x.op} ${x.text}`));
  });
  flush();
  return { node: pre, changed };
}
