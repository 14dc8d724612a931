// Line plots as SVG built from DOM nodes (no inline style, no canvas): fixed time window,
// y axis from zero to a rounded maximum, a legend with the latest values as text.

import { h } from './dom.js';

const NS = 'http://www.w3.org/2000/svg';
const W = 420;
const H = 150;
const PAD = { l: 44, r: 8, t: 10, b: 22 };

function s(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// 1, 2, 5 × 10^n at or above v.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

export function fmt(v, unit) {
  if (v === null || v === undefined || Number.isNaN(v)) return '—';
  const digits = v >= 100 ? 0 : v >= 10 ? 1 : 2;
  return `${v.toFixed(digits)}${unit ? ` ${unit}` : ''}`;
}

// Draws into `figure`: series is [{name, points: [[t, v | null]]}].
export function plot(figure, { title, unit, series, now, windowMs, empty }) {
  const t0 = now - windowMs;
  const values = series.flatMap((x) => x.points.map((p) => p[1])).filter((v) => v !== null);
  const max = niceMax(Math.max(0, ...values));
  const x = (t) => PAD.l + ((t - t0) / windowMs) * (W - PAD.l - PAD.r);
  const y = (v) => H - PAD.b - (v / max) * (H - PAD.t - PAD.b);
  const latest = series.map((sr) => {
    const p = [...sr.points].reverse().find((q) => q[1] !== null);
    return p ? p[1] : null;
  });
  const summary = series.length
    ? series.map((sr, i) => `${sr.name} ${fmt(latest[i], unit)}`).join(', ')
    : empty;
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${title}: ${summary}` });
  for (const f of [0, 0.5, 1]) {
    const gy = y(max * f);
    svg.append(s('line', { class: f ? 'grid' : 'axis', x1: PAD.l, x2: W - PAD.r, y1: gy, y2: gy }));
    svg.append(s('text', { x: PAD.l - 6, y: gy + 4, 'text-anchor': 'end' }, fmt(max * f)));
  }
  svg.append(s('line', { class: 'axis', x1: PAD.l, x2: PAD.l, y1: PAD.t, y2: H - PAD.b }));
  const span = windowMs < 120_000 ? `${Math.round(windowMs / 1000)} s` : `${Math.round(windowMs / 60_000)} min`;
  svg.append(s('text', { x: PAD.l, y: H - 6 }, `−${span}`));
  svg.append(s('text', { x: W - PAD.r, y: H - 6, 'text-anchor': 'end' }, 'now'));
  series.forEach((sr, i) => {
    // A null breaks the line (no requests in that interval for a latency series).
    let run = [];
    const flush = () => {
      if (run.length === 1) run.push([run[0][0] + 0.5, run[0][1]]);
      if (run.length) {
        svg.append(s('polyline', { class: `s${i % 6}`, points: run.map((p) => `${p[0].toFixed(1)},${p[1].toFixed(1)}`).join(' ') }));
      }
      run = [];
    };
    for (const [t, v] of sr.points) {
      if (t < t0) continue;
      if (v === null) flush(); else run.push([x(t), y(v)]);
    }
    flush();
    // A dot on the newest value, so that a fresh series is visible before it has a line.
    const last = [...sr.points].reverse().find((p) => p[1] !== null && p[0] >= t0);
    if (last) svg.append(s('circle', { class: `dot s${i % 6}`, cx: x(last[0]).toFixed(1), cy: y(last[1]).toFixed(1), r: 3 }));
  });
  const legend = series.length
    ? h('ul', { class: 'legend' }, series.map((sr, i) => h('li', { 'data-series': sr.name },
      h('span', { class: `swatch s${i % 6}`, 'aria-hidden': 'true' }), `${sr.name}: `,
      h('span', { class: 'value' }, fmt(latest[i], unit)))))
    : h('p', { class: 'hint' }, empty);
  figure.replaceChildren(h('figcaption', {}, h('span', {}, title), h('span', { class: 'hint' }, unit)), svg, legend);
}
