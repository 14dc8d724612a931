#!/usr/bin/env python3
"""Browser tests of the operator dashboard at /admin/, driven by Playwright in headless Chromium.

Run by tests/it/dashboard.rs against a real `sortie serve`; the gateway, its upstreams and the
tokens come in through the environment (see `Env`). Every case opens a fresh tab (so a fresh
sessionStorage), checks that the page logs no console error it did not expect and makes no
request outside the admin listener, and saves a screenshot. Exit status 0 when every case passed.
"""

import json
import os
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from playwright.sync_api import expect, sync_playwright

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
TIMEOUT_MS = 20_000


class Env:
    admin = os.environ["SORTIE_ADMIN_URL"]          # http://127.0.0.1:PORT
    api = os.environ["SORTIE_API_URL"]
    admin_token = os.environ["SORTIE_ADMIN_TOKEN"]
    deployment_token = os.environ["SORTIE_DEPLOYMENT_TOKEN"]
    fast_url = os.environ["SORTIE_FAST_URL"]        # answers at once
    slow_url = os.environ["SORTIE_SLOW_URL"]        # holds the request until the test ends
    refused_url = os.environ["SORTIE_REFUSED_URL"]  # a closed loopback port
    worker = os.environ["SORTIE_WORKER"]            # a worker id to drain and undrain
    shots = os.environ["SORTIE_SCREENSHOTS"]
    chromium = os.environ.get("SORTIE_CHROMIUM", "/usr/bin/chromium")


def http(base, method, path, token, body=None, headers=None, timeout=30):
    """One call; returns (status, headers, parsed JSON or text)."""
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, dict(e.headers), e.read()
    try:
        return status, hdrs, json.loads(raw) if raw else None
    except ValueError:
        return status, hdrs, raw.decode("utf-8", "replace")


def admin(method, path, body=None, headers=None):
    return http(Env.admin, method, path, Env.admin_token, body, headers)


def through_gateway(url, timeout=60):
    body = json.dumps({"method": "GET", "url": url})
    return http(Env.api, "POST", "/api/v1/requests", Env.deployment_token, body,
                {"Content-Type": "application/json"}, timeout)


def active_config():
    status, hdrs, rec = admin("GET", "/api/v1/admin/config")
    assert status == 200, (status, rec)
    return rec, hdrs.get("ETag") or hdrs.get("etag")


def wait_for(what, f, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        v = f()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Case:
    """One test: a fresh tab with console, page-error and request guards."""

    def __init__(self, ctx, name, allowed_statuses=(), viewport=(1280, 800)):
        self.name = name
        self.page = ctx.new_page()
        self.page.set_viewport_size({"width": viewport[0], "height": viewport[1]})
        self.page.set_default_timeout(TIMEOUT_MS)
        self.errors = []
        self.outside = []
        self.api_calls = []
        self.allowed = tuple(f"status of {s}" for s in allowed_statuses)
        origin = urlsplit(Env.admin)
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("request", self._request)

        def guard(route):
            u = urlsplit(route.request.url)
            if (u.scheme, u.netloc) != (origin.scheme, origin.netloc):
                self.outside.append(route.request.url)
                route.abort()
            else:
                route.continue_()
        self.page.route("**/*", guard)
        self.page.on("dialog", lambda d: d.accept())

    def _console(self, msg):
        if msg.type != "error":
            return
        # Chromium logs every non-2xx answer to fetch; the statuses a case provokes on purpose
        # (401 for a wrong token, 409, 422) are expected, anything else is a failure.
        if "Failed to load resource" in msg.text and any(a in msg.text for a in self.allowed):
            return
        self.errors.append(f"console error: {msg.text}")

    def _request(self, req):
        u = urlsplit(req.url)
        if u.path.startswith("/api/") or u.path == "/metrics":
            self.api_calls.append((req.method, u.path, req.headers.get("authorization")))

    def shot(self, suffix=""):
        path = os.path.join(Env.shots, f"{self.name}{suffix}.png")
        self.page.screenshot(path=path, full_page=True)
        return path

    def sign_in(self, token=None, actor="alice"):
        p = self.page
        p.goto(Env.admin + "/admin/")
        p.fill("#token", token or Env.admin_token)
        p.fill("#actor", actor)
        p.click("#sign-in-form button[type=submit]")
        expect(p.locator("#nav")).to_be_visible()

    def view(self, name):
        self.page.click(f"#nav a[data-view={name}]")
        expect(self.page.locator(f"#view-{name}")).to_be_visible()

    def finish(self):
        self.shot()
        assert not self.errors, "\n".join(self.errors)
        assert not self.outside, f"requests outside the admin listener: {self.outside}"
        for method, path, auth in self.api_calls:
            assert auth == f"Bearer {Env.admin_token}" or path == "/api/v1/admin/config", \
                f"{method} {path} sent {auth!r}"
        cookies = self.page.context.cookies()
        assert not cookies, f"the page set cookies: {cookies}"
        self.page.close()


# ------------------------------------------------------------------------------------- cases

def case_sign_in(ctx):
    c = Case(ctx, "sign-in", allowed_statuses=(401,))
    p = c.page
    p.goto(Env.admin + "/admin/")
    expect(p.locator("#sign-in")).to_be_visible()
    # Keyboard only: the token field has focus, Tab reaches the actor field, Enter submits.
    expect(p.locator("#token")).to_be_focused()
    p.keyboard.type("not-the-token")
    p.keyboard.press("Tab")
    expect(p.locator("#actor")).to_be_focused()
    p.keyboard.type("alice")
    p.keyboard.press("Enter")
    expect(p.locator("#sign-in-error")).to_contain_text("did not accept")
    expect(p.locator("#nav")).to_be_hidden()
    assert p.evaluate("sessionStorage.getItem('sortie.admin.token')") is None
    c.shot("-wrong-token")

    p.fill("#token", Env.admin_token)
    p.keyboard.press("Enter")
    expect(p.locator("#nav")).to_be_visible()
    expect(p.locator("#overview-cards")).to_contain_text("Active revision")
    expect(p.locator("#who-actor")).to_have_text("Signed in as alice")
    assert p.evaluate("sessionStorage.getItem('sortie.admin.token')") == Env.admin_token
    assert p.evaluate("localStorage.length") == 0
    assert p.evaluate("document.cookie") == ""
    # A reload keeps the tab's session; signing out forgets the token and the data shown.
    p.reload()
    expect(p.locator("#nav")).to_be_visible()
    p.click("#sign-out")
    expect(p.locator("#sign-in")).to_be_visible()
    assert p.evaluate("sessionStorage.getItem('sortie.admin.token')") is None
    expect(p.locator("#overview-cards")).to_be_empty()
    c.finish()


def case_overview_plots(ctx):
    c = Case(ctx, "overview")
    p = c.page
    c.sign_in()
    expect(p.locator("#metrics-note")).to_contain_text("sample")
    stop = threading.Event()
    failures = []

    def load():
        # A little load: bounded in count and time, loopback only; one in four is refused.
        n = 0
        while not stop.is_set() and n < 2000:
            url = Env.refused_url if n % 4 == 3 else Env.fast_url
            status, _, body = through_gateway(url, timeout=10)
            if url == Env.fast_url and status != 200:
                failures.append((status, body))
            n += 1
            time.sleep(0.02)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        rate = p.locator("#plot-rate li[data-series=all] .value")
        wait_for("the request-rate plot to show traffic",
                 lambda: rate.text_content() not in ("—", "0.00 req/s"))
        expect(p.locator("#plot-errors li[data-series=upstream_connection_refused]")).to_be_visible()
        expect(p.locator("#plot-latency li[data-series=p50] .value")).not_to_have_text("—")
        expect(p.locator("#plot-latency li[data-series=p99] .value")).not_to_have_text("—")
        wait_for("plot lines", lambda: p.locator("#plot-rate polyline").count() >= 1)
        first = p.locator("#plot-rate polyline").first.get_attribute("points")
        # The plot keeps moving: later samples redraw it with more points.
        line = p.locator("#plot-rate polyline").first
        wait_for("the plot to update", lambda: line.get_attribute("points") != first)
        wait_for("a few samples under load", lambda: len(line.get_attribute("points").split()) >= 6,
                 timeout=60)
    finally:
        stop.set()
        t.join(timeout=30)
    assert not failures, failures[:3]
    expect(p.locator("#overview-cards")).to_contain_text("connected")
    c.finish()


def edit_snapshot(p, change):
    """Parses the editor's JSON, applies `change`, writes it back."""
    editor = p.locator("#config-editor")
    snap = json.loads(editor.input_value())
    change(snap)
    editor.fill(json.dumps(snap, indent=2))
    return snap


def case_config_save(ctx):
    c = Case(ctx, "config-save")
    p = c.page
    c.sign_in()
    before, _ = active_config()
    c.view("config")
    expect(p.locator("#config-meta")).to_contain_text(f"revision {before['revision']}")
    edit_snapshot(p, lambda s: s.update(default_timeout_ms=45000))
    p.click("#config-review")
    diff = p.locator("#config-panel .diff")
    expect(diff.locator(".add")).to_contain_text('"default_timeout_ms": 45000')
    expect(diff.locator(".del")).to_contain_text(f'"default_timeout_ms": {before["snapshot"]["default_timeout_ms"]}')
    c.shot("-diff")
    p.click("#config-save")
    expect(p.locator("#config-panel")).to_contain_text(f"revision {before['revision'] + 1} is active")
    after, _ = active_config()
    assert after["revision"] == before["revision"] + 1, after
    assert after["snapshot"]["default_timeout_ms"] == 45000, after
    assert after["actor"] == "alice", after
    c.finish()


def case_stale_save(ctx):
    c = Case(ctx, "config-conflict", allowed_statuses=(409,))
    p = c.page
    c.sign_in()
    c.view("config")
    base, etag = active_config()
    expect(p.locator("#config-meta")).to_contain_text(f"revision {base['revision']}")
    # A second client saves first.
    theirs = dict(base["snapshot"], default_timeout_ms=51000)
    status, _, rec = admin("PUT", "/api/v1/admin/config", json.dumps(theirs),
                           {"If-Match": etag, "X-Service-Actor": "bob", "Content-Type": "application/json"})
    assert status == 200, (status, rec)
    edit_snapshot(p, lambda s: s.update(default_timeout_ms=52000))
    p.click("#config-review")
    expect(p.locator("#config-panel .notice")).to_contain_text(f"now revision {rec['revision']}")
    p.click("#config-save")
    conflict = p.locator("#config-conflict")
    expect(conflict).to_contain_text("someone else saved first")
    expect(conflict).to_contain_text("by bob")
    expect(conflict.locator(".diff .add")).to_contain_text('"default_timeout_ms": 51000')
    c.shot("-409")
    now, _ = active_config()
    assert now["revision"] == rec["revision"], "the stale save must not be applied"
    # Keeping the edit on top of their revision saves it.
    conflict.locator("button", has_text="Keep my edit").click()
    p.click("#config-save")
    expect(p.locator("#config-panel")).to_contain_text(f"revision {rec['revision'] + 1} is active")
    final, _ = active_config()
    assert final["snapshot"]["default_timeout_ms"] == 52000, final
    c.finish()


def case_invalid_422(ctx):
    c = Case(ctx, "config-invalid", allowed_statuses=(422,))
    p = c.page
    c.sign_in()
    c.view("config")
    before, _ = active_config()
    edit_snapshot(p, lambda s: s["routing"]["rules"][0].update(pools=["nope"]))
    p.click("#config-review")
    p.click("#config-save")
    box = p.locator("#config-invalid")
    expect(box.locator(".json-path")).to_have_text("routing.rules[0].pools[0]")
    expect(box).to_contain_text('At routing.rules[0].pools[0]: unknown pool "nope"')
    editor = p.locator("#config-editor")
    expect(editor).to_have_attribute("aria-invalid", "true")
    expect(editor).to_be_focused()
    selected = p.evaluate("(() => { const e = document.getElementById('config-editor');"
                          " return e.value.slice(e.selectionStart, e.selectionEnd); })()")
    assert '"nope"' in selected, f"the editor selects {selected!r}, not the offending value"
    c.shot()
    after, _ = active_config()
    assert after["revision"] == before["revision"], "an invalid snapshot must not be activated"
    c.finish()


def case_rollback(ctx):
    c = Case(ctx, "history-rollback")
    p = c.page
    # An actor that looks like markup: the API's values must come back as text.
    actor = "<b>alice</b><img src=x>"
    c.sign_in(actor=actor)
    expect(p.locator("#who-actor")).to_have_text(f"Signed in as {actor}")
    before, etag = active_config()
    if before["revision"] < 2:
        # Run alone, this case first makes a revision to roll back from.
        snap = dict(before["snapshot"], default_timeout_ms=47000)
        status, _, before = admin("PUT", "/api/v1/admin/config", json.dumps(snap),
                                  {"If-Match": etag, "Content-Type": "application/json"})
        assert status == 200, (status, before)
    c.view("history")
    expect(p.locator(f"tr[data-revision='{before['revision']}']")).to_contain_text("active")
    # A diff between any two revisions.
    p.select_option("#diff-from", "1")
    p.select_option("#diff-to", str(before["revision"]))
    expect(p.locator("#history-diff h3")).to_have_text(f"Revision 1 → {before['revision']}")
    expect(p.locator("#history-diff .diff .del")).to_contain_text('"default_timeout_ms": 60000')
    c.shot("-diff")
    p.locator("tr[data-revision='1'] button").click()
    expect(p.locator("#history-body .notice")).to_contain_text("Rolled back to revision 1")
    after, _ = active_config()
    _, _, first = admin("GET", "/api/v1/admin/config/history")
    rev1 = next(r for r in first["items"] if r["revision"] == 1)
    assert after["revision"] == before["revision"] + 1, after
    assert after["action"] == "rollback" and after["actor"] == actor, after
    assert after["snapshot"] == rev1["snapshot"], after
    row = p.locator(f"tr[data-revision='{after['revision']}']")
    expect(row).to_contain_text("rollback")
    expect(row).to_contain_text(actor)
    assert p.locator("#view-history b, #view-history img, header b").count() == 0
    c.finish()


def worker_item(wid):
    status, _, body = admin("GET", "/api/v1/admin/workers")
    assert status == 200, body
    return next(w for w in body["items"] if w["worker_id"] == wid)


def case_workers(ctx):
    c = Case(ctx, "workers")
    p = c.page
    c.sign_in()
    c.view("workers")
    row = p.locator(f"tr[data-worker='{Env.worker}']")
    expect(row).to_contain_text("connected")
    expect(row.locator("meter")).to_have_count(1)
    row.get_by_role("button", name="Drain", exact=True).click()
    expect(row.locator(".badge", has_text="draining")).to_be_visible()
    assert worker_item(Env.worker)["draining"] is True
    c.shot("-draining")
    row.get_by_role("button", name="Undrain", exact=True).click()
    expect(row.locator(".badge", has_text="draining")).to_have_count(0)
    assert worker_item(Env.worker)["draining"] is False
    row.get_by_role("button", name="Disable", exact=True).click()
    expect(row.locator(".badge", has_text="disabled")).to_be_visible()
    assert worker_item(Env.worker)["enabled"] is False
    row.get_by_role("button", name="Enable", exact=True).click()
    expect(row.locator(".badge", has_text="disabled")).to_have_count(0)
    assert worker_item(Env.worker)["enabled"] is True
    c.finish()


def case_rollouts(ctx):
    c = Case(ctx, "rollouts")
    p = c.page
    c.sign_in()
    c.view("rollouts")
    rec, _ = active_config()
    expect(p.locator("#rollouts-body")).to_contain_text(f"#{rec['revision']}")
    expect(p.locator("#rollouts-body td", has_text=Env.worker)).to_be_visible()
    expect(p.locator("#rollouts-body .badge.ok").first).to_have_text("applied")
    c.finish()


def case_cancel(ctx):
    c = Case(ctx, "requests-cancel")
    p = c.page
    c.sign_in()
    c.view("requests")
    expect(p.locator("#requests-body")).to_contain_text("No requests in flight")
    result = {}
    t = threading.Thread(target=lambda: result.update(answer=through_gateway(Env.slow_url)), daemon=True)
    t.start()
    # The view refreshes itself: the slow request appears without a click.
    row = p.locator("tr[data-request]")
    expect(row).to_have_count(1)
    request_id = row.get_attribute("data-request")
    expect(row).to_contain_text("dep_test")
    c.shot("-active")
    row.get_by_role("button", name="Cancel", exact=True).click()
    expect(p.locator("#requests-body .notice")).to_contain_text(f"Cancelled {request_id}")
    t.join(timeout=30)
    status, _, body = result["answer"]
    assert status == 499 and body["code"] == "cancelled", (status, body)
    assert body["request_id"] == request_id, body
    expect(p.locator("tr[data-request]")).to_have_count(0)
    c.finish()


def case_narrow(ctx):
    c = Case(ctx, "narrow", viewport=(390, 844))
    p = c.page
    c.sign_in()
    expect(p.locator("#plot-rate svg")).to_be_visible()
    for view in ("overview", "config", "workers", "history", "requests"):
        c.view(view)
        p.wait_for_load_state("networkidle")
        width = p.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{view}: the page is {width}px wide in a 390px window"
    c.view("overview")
    # Keyboard reachable: tabbing from the top reaches every view's link.
    p.locator("body").focus()
    reached = set()
    for _ in range(20):
        p.keyboard.press("Tab")
        v = p.evaluate("document.activeElement.dataset.view || ''")
        if v:
            reached.add(v)
    assert reached >= {"overview", "config", "history", "workers", "rollouts", "requests"}, reached
    p.evaluate("document.activeElement.blur()")
    c.finish()


MODULES_JS = """
async () => {
  const m = await import('./metrics.js');
  const d = await import('./diff.js');
  const h = (pairs) => ({ buckets: pairs.map(([le, v]) => [le === '+Inf' ? Infinity : le, v]) });
  const before = h([[0.001, 0], [0.002, 0], [0.005, 0], ['+Inf', 0]]);
  const after = h([[0.001, 0], [0.002, 50], [0.005, 100], ['+Inf', 100]]);
  const text = 'sortie_requests_total{deployment="a\\\\\\"b",outcome="ok"} 7\\n'
    + 'sortie_requests_total{deployment="c",outcome="upstream_reset"} 2\\n'
    + 'sortie_request_stage_seconds_bucket{stage="total",le="0.001"} 3\\n'
    + 'sortie_request_stage_seconds_bucket{stage="total",le="+Inf"} 9\\n# HELP x\\nsortie_active_requests 4\\n';
  const s = m.sample(text, 1000);
  const sampler = new m.Sampler();
  sampler.push(m.sample('sortie_requests_total{deployment="a",outcome="ok"} 10\\n', 0));
  sampler.push(m.sample('sortie_requests_total{deployment="a",outcome="ok"} 30\\n'
    + 'sortie_requests_total{deployment="a",outcome="cancelled"} 4\\n', 2000));
  const pr = d.pretty({ a: { b: [1, 2] } });
  return {
    p50: m.quantile(0.5, before, after),
    p99: m.quantile(0.99, before, after),
    empty: m.quantile(0.5, before, before),
    label: m.parse(text)[0].labels.deployment,
    outcomes: [...s.outcomes.entries()],
    buckets: s.buckets.length,
    active: s.active,
    rate: sampler.rate(),
    errors: sampler.errors(),
    diff: d.diffLines(['a', 'b', 'c'], ['a', 'x', 'c']).map((x) => x.op + x.text),
    line: pr.at.get('a.b[1]'),
    fallback: d.lineOf(pr.at, 'a.c.d'),
    same: pr.text === JSON.stringify({ a: { b: [1, 2] } }, null, 2),
  };
}
"""


def case_modules(ctx):
    """The page's own modules, imported in the browser: quantiles, rates, parsing, diffs."""
    c = Case(ctx, "modules")
    p = c.page
    p.goto(Env.admin + "/admin/")
    r = p.evaluate(MODULES_JS)
    assert abs(r["p50"] - 0.002) < 1e-9, r
    assert abs(r["p99"] - 0.00494) < 1e-9, r
    assert r["empty"] is None, r
    assert r["label"] == 'a"b', r
    assert r["outcomes"] == [["ok", 7], ["upstream_reset", 2]], r
    assert r["buckets"] == 2 and r["active"] == 4, r
    assert r["rate"] == [[2000, 12]], r
    assert r["errors"] == {"cancelled": [[2000, 2]]}, r
    assert r["diff"] == [" a", "-b", "+x", " c"], r
    assert r["line"] == 4 and r["fallback"] == 1 and r["same"], r
    c.finish()


# Every visible text's contrast against its effective background (WCAG 2 relative luminance):
# at least 4.5:1, or 3:1 for large text (24px, or 18.66px bold).
CONTRAST_JS = """
() => {
  const rgba = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c.length >= 3 && (c.length < 4 || c[3] > 0.5)) return c;
    }
    return [255, 255, 255];
  };
  const bad = [];
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest('svg') || !el.checkVisibility || !el.checkVisibility()) continue;
    const text = [...el.childNodes].filter((n) => n.nodeType === 3).map((n) => n.textContent).join('').trim();
    if (!text) continue;
    const st = getComputedStyle(el);
    const a = lum(rgba(st.color));
    const b = lum(background(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const size = parseFloat(st.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(st.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) bad.push(`${el.tagName}.${el.className} "${text.slice(0, 30)}" ${ratio.toFixed(2)}`);
  }
  return bad;
}
"""


def case_contrast_and_keyboard(ctx):
    c = Case(ctx, "contrast", allowed_statuses=(401,))
    p = c.page
    p.goto(Env.admin + "/admin/")
    p.fill("#token", "wrong")
    p.keyboard.press("Enter")
    expect(p.locator("#sign-in-error")).to_be_visible()
    assert p.evaluate(CONTRAST_JS) == [], p.evaluate(CONTRAST_JS)
    c.sign_in()
    for view, ready in (("overview", "#overview-cards .card"), ("config", "#config-editor"),
                        ("history", "#history-diff .diff"), ("workers", "[data-worker] .badge"),
                        ("rollouts", "#rollouts-body .badge"), ("requests", "#requests-auto")):
        c.view(view)
        expect(p.locator(ready).first).to_be_visible()
        bad = p.evaluate(CONTRAST_JS)
        assert not bad, f"{view}: low contrast: {bad}"
    # A worker action by keyboard alone: focus the button, press Enter.
    c.view("workers")
    row = p.locator(f"tr[data-worker='{Env.worker}']")
    row.get_by_role("button", name="Drain", exact=True).focus()
    p.keyboard.press("Enter")
    expect(row.locator(".badge", has_text="draining")).to_be_visible()
    undrain = row.get_by_role("button", name="Undrain", exact=True)
    undrain.focus()
    p.keyboard.press("Enter")
    expect(row.locator(".badge", has_text="draining")).to_have_count(0)
    assert worker_item(Env.worker)["draining"] is False
    c.finish()


CASES = [case_modules, case_sign_in, case_overview_plots, case_config_save, case_stale_save, case_invalid_422,
         case_rollback, case_workers, case_rollouts, case_cancel, case_narrow,
         case_contrast_and_keyboard]


def main():
    only = set(sys.argv[1:])
    os.makedirs(Env.shots, exist_ok=True)
    failed = []
    with sync_playwright() as pw, tempfile.TemporaryDirectory(prefix="sortie-chromium-") as profile:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=Env.chromium, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800}, service_workers="block")
        try:
            for case in CASES:
                name = case.__name__.removeprefix("case_")
                if only and name not in only:
                    continue
                started = time.monotonic()
                try:
                    case(ctx)
                    print(f"ok   {name} ({time.monotonic() - started:.1f}s)", flush=True)
                except Exception:  # noqa: BLE001 - every failure is reported, then the next case runs
                    failed.append(name)
                    print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
                    for page in ctx.pages:
                        try:
                            page.screenshot(path=os.path.join(Env.shots, f"FAILED-{name}.png"), full_page=True)
                            page.close()
                        except Exception:  # noqa: BLE001
                            pass
        finally:
            ctx.close()
    print(f"screenshots in {Env.shots}")
    if failed:
        print(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
