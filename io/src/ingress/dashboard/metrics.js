// Reads the Prometheus text of /metrics and turns successive samples into the Overview's
// series: request rate, error rate by registry code, and latency quantiles of the whole request.

const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

// [{name, labels, value}] of every sample line.
export function parse(text) {
  const out = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const brace = line.indexOf('{');
    const space = line.lastIndexOf(' ');
    if (space < 0) continue;
    const value = Number(line.slice(space + 1));
    let name;
    const labels = {};
    if (brace >= 0 && brace < space) {
      name = line.slice(0, brace);
      const close = line.lastIndexOf('}');
      for (const m of line.slice(brace + 1, close).matchAll(LABEL)) {
        labels[m[1]] = m[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
      }
    } else {
      name = line.slice(0, space).trim();
    }
    out.push({ name, labels, value });
  }
  return out;
}

// What one scrape contributes: totals by outcome and the `total` stage histogram.
export function sample(text, t) {
  const outcomes = new Map();
  const buckets = [];
  let active = null;
  for (const s of parse(text)) {
    if (s.name === 'sortie_requests_total') {
      const o = s.labels.outcome || 'unknown';
      outcomes.set(o, (outcomes.get(o) || 0) + s.value);
    } else if (s.name === 'sortie_request_stage_seconds_bucket' && s.labels.stage === 'total') {
      buckets.push([s.labels.le === '+Inf' ? Infinity : Number(s.labels.le), s.value]);
    } else if (s.name === 'sortie_active_requests') {
      active = s.value;
    }
  }
  buckets.sort((a, b) => a[0] - b[0]);
  return { t, outcomes, buckets, active };
}

// The q-quantile (seconds) of the observations between two cumulative histograms, by linear
// interpolation inside the bucket, as Prometheus' histogram_quantile does; null when empty.
export function quantile(q, before, after) {
  const prev = new Map(before.buckets);
  const cum = after.buckets.map(([le, v]) => [le, v - (prev.get(le) || 0)]);
  if (!cum.length || cum.some(([, v]) => v < 0)) return null;
  const total = cum[cum.length - 1][1];
  if (total <= 0) return null;
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const [le, c] of cum) {
    if (c >= rank) {
      if (le === Infinity) return lower;
      const inBucket = c - below;
      return inBucket > 0 ? lower + (le - lower) * ((rank - below) / inBucket) : le;
    }
    lower = le === Infinity ? lower : le;
    below = c;
  }
  return lower;
}

const sum = (m) => [...m.values()].reduce((a, b) => a + b, 0);

// Keeps the last `windowMs` of samples and derives the plotted series from them.
export class Sampler {
  constructor({ windowMs = 5 * 60_000, latencyWindow = 5 } = {}) {
    this.windowMs = windowMs;
    this.latencyWindow = latencyWindow;
    this.samples = [];
  }

  push(s) {
    const last = this.samples[this.samples.length - 1];
    // A restarted process starts its counters again: keep only the new run.
    if (last && sum(s.outcomes) < sum(last.outcomes)) this.samples = [];
    this.samples.push(s);
    const cut = s.t - this.windowMs;
    while (this.samples.length > 2 && this.samples[0].t < cut) this.samples.shift();
  }

  // Requests per second between consecutive samples.
  rate() {
    return this.pairs((a, b, dt) => (sum(b.outcomes) - sum(a.outcomes)) / dt);
  }

  // {code: points} of errors per second, for every code seen in the window.
  errors() {
    const codes = new Set();
    for (const s of this.samples) for (const o of s.outcomes.keys()) if (o !== 'ok') codes.add(o);
    const out = {};
    for (const code of [...codes].sort()) {
      out[code] = this.pairs((a, b, dt) => ((b.outcomes.get(code) || 0) - (a.outcomes.get(code) || 0)) / dt);
    }
    return out;
  }

  // Latency quantile in milliseconds over the last `latencyWindow` intervals at each point.
  latency(q) {
    const out = [];
    for (let i = 1; i < this.samples.length; i += 1) {
      const from = this.samples[Math.max(0, i - this.latencyWindow)];
      const v = quantile(q, from, this.samples[i]);
      out.push([this.samples[i].t, v === null ? null : v * 1000]);
    }
    return out;
  }

  pairs(f) {
    const out = [];
    for (let i = 1; i < this.samples.length; i += 1) {
      const a = this.samples[i - 1];
      const b = this.samples[i];
      const dt = (b.t - a.t) / 1000;
      out.push([b.t, dt > 0 ? Math.max(0, f(a, b, dt)) : null]);
    }
    return out;
  }
}
