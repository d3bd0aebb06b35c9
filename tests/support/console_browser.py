"""The operator console (/console) in a real browser: headless Chromium, driven by selenium,
for tests/api/console.rs.

    console_browser.py CONFIG.json

CONFIG (written by the Rust test, which has set the server's state up beforehand):
  chromium, chromedriver   paths of the browser and its driver
  base                     the console's server, http://127.0.0.1:PORT
  token, wrong_token       the console token (its name is `operator`), and one that is not
  operator                 the token's name, recorded as the actor of a set-status
  shots                    the directory the screenshots are written to, one PNG per view
  story                    {provider, event_id, order_id, payload}: the webhook delivered a moment
                           before, its payload (text) carrying hostile text
  visible                  texts the payload's <pre> must show literally
  raw_forbidden            characters no page may show raw (U+202E, ESC)
  metadata_marker          a word of the story order's (hostile) metadata, to be shown
  hostile_order            {event_id, order_id, shown}: an event whose order id is hostile, and
                           that id as the console shows it (control characters escaped)
  email_error_marker       a word of the dead emails' (hostile) last error
  set_status               {status, other_status, reason}: the set-status made, and the one a
                           stale CSRF token tries
  retry_email, guard_email       {id, order_id}: dead emails; the first is retried, the second
                                 is the target of every refused attempt
  skip_forward, guard_forward    {id, order_id}: dead forwards, the same way

Each check prints `ok: WHAT`; the first that fails raises, with the page's URL and text, after a
screenshot `failure.png`; the exit status is then 1. A second server (Python's http.server, on
another port of 127.0.0.1: another origin, the same site) serves the pages that post to the
console from outside.
"""
import json
import os
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from html import escape
from urllib.parse import quote, unquote, urlsplit

from selenium import webdriver
from selenium.common.exceptions import (
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

WAIT = 10  # seconds, for a page to load after a click


def gone(element):
    """A wait condition: `element` is no longer in the document (the page it was on has been
    replaced). selenium's staleness_of, except that Chrome, asked about a node while its page is
    being replaced, sometimes answers "Node with given id does not belong to the document", a
    WebDriverException rather than a StaleElementReferenceException: that means gone too."""
    def check(_driver):
        try:
            element.is_enabled()
            return False
        except (StaleElementReferenceException, WebDriverException):
            return True
    return check


class Failed(Exception):
    pass


def href_path(link):
    """The path a link leads to, percent-decoded (however the console encoded it)."""
    return unquote(urlsplit(link.get_attribute("href")).path)


def check(condition, what):
    if not condition:
        raise Failed(what)


class Evil:
    """Another origin (same host, another port) whose pages post forms to the console and
    submit themselves: what a page of another site could make an operator's browser do."""

    def __init__(self):
        self.pages = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = pages.get(self.path, "not found").encode()
                self.send_response(200 if self.path in pages else 404)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def posting_page(self, name, action, fields):
        inputs = "".join(
            f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">' for k, v in fields.items()
        )
        self.pages[f"/{name}"] = (
            "<!doctype html><title>a page of another origin</title>"
            f'<form id="f" method="post" action="{escape(action)}">{inputs}</form>'
            '<script>document.getElementById("f").submit()</script>'
        )
        return f"{self.base}/{name}"


class Console:
    def __init__(self, cfg):
        self.cfg = cfg
        self.base = cfg["base"]
        self.shots = cfg["shots"]
        os.makedirs(self.shots, exist_ok=True)
        options = webdriver.ChromeOptions()
        options.binary_location = cfg["chromium"]
        for arg in [
            "--headless=new",
            "--no-sandbox",  # root in CI containers
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--window-size=1280,1000",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ]:
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # Its own fresh profile (a temporary directory chromedriver makes): no session.
        self.driver = webdriver.Chrome(service=Service(cfg["chromedriver"]), options=options)
        self.driver.set_page_load_timeout(20)
        self.csp_violations = []

    # -- navigation ---------------------------------------------------------------------------

    def url(self, path):
        return self.base + path

    def path(self):
        """The current page's path (and query), on the console's origin."""
        current = self.driver.current_url
        check(current.startswith(self.base + "/"), f"on the console's origin: {current}")
        return current[len(self.base):]

    def bare_path(self):
        return self.path().split("?")[0]

    def open(self, path):
        self.driver.get(self.url(path))
        self.collect_logs()

    def submit(self, form):
        """Submits `form` with its submit button, as a person would, and waits for the next
        page."""
        html = self.driver.find_element(By.TAG_NAME, "html")
        button = form.find_element(
            By.CSS_SELECTOR, "button:not([type]), button[type=submit], input[type=submit]"
        )
        button.click()
        try:
            WebDriverWait(self.driver, WAIT).until(gone(html))
        except TimeoutException:
            raise Failed("submitting the form loaded no new page")
        self.collect_logs()

    def wait_for_origin(self, origin):
        WebDriverWait(self.driver, WAIT).until(lambda d: d.current_url.startswith(origin + "/"))
        WebDriverWait(self.driver, WAIT).until(
            lambda d: d.execute_script("return document.readyState") == "complete"
        )
        self.collect_logs()

    def shot(self, name):
        self.driver.save_screenshot(os.path.join(self.shots, f"{name}.png"))

    # -- reading ------------------------------------------------------------------------------

    def one(self, css, within=None):
        found = (within or self.driver).find_elements(By.CSS_SELECTOR, css)
        check(len(found) == 1, f"exactly one {css} on {self.driver.current_url} (found {len(found)})")
        return found[0]

    def has(self, css):
        return len(self.driver.find_elements(By.CSS_SELECTOR, css)) > 0

    def text(self, css):
        """The text of `css` as its nodes hold it (textContent: not what CSS makes visible)."""
        return self.driver.execute_script("return arguments[0].textContent", self.one(css))

    def data_rows(self, table):
        """The rows of `table` (a CSS selector) that hold data: those with a <td>."""
        rows = self.one(table).find_elements(By.CSS_SELECTOR, "tr")
        return [r for r in rows if r.find_elements(By.TAG_NAME, "td")]

    def page_text(self):
        return self.driver.execute_script("return document.body ? document.body.textContent : ''")

    def collect_logs(self):
        try:
            entries = self.driver.get_log("browser")
        except Exception:
            return
        for entry in entries:
            message = entry.get("message", "")
            if "Content Security Policy" in message or "Content-Security-Policy" in message:
                self.csp_violations.append(message)

    # -- checks every page gets ---------------------------------------------------------------

    def inert(self, where):
        """Nothing from outside became script or markup: no script ran, no script element or
        image exists, no raw control or bidi character shows."""
        d = self.driver
        check(d.execute_script("return typeof window.__pwned") == "undefined", f"{where}: a script ran")
        check(d.execute_script("return document.scripts.length") == 0, f"{where}: a <script> element")
        check(len(d.find_elements(By.TAG_NAME, "img")) == 0, f"{where}: an <img> element")
        for marker in ["pwn-email", "pwn-order", "pwn-meta"]:
            check(not self.has(f"#{marker}"), f"{where}: an element #{marker} from outside text")
        text = self.page_text()
        for char in self.cfg["raw_forbidden"]:
            check(char not in text, f"{where}: a raw U+{ord(char):04X} in the page's text")
        check(not self.csp_violations, f"{where}: CSP violations: {self.csp_violations}")

    def logged_in_page(self, where):
        """The frame of every page of a session: nav links, the logout form with its csrf, the
        stylesheet (applied: CSP allows it), no script."""
        nav = self.one("nav")
        for href in ["/console", "/console/events", "/console/outbox"]:
            check(
                len(nav.find_elements(By.CSS_SELECTOR, f'a[href="{href}"]')) >= 1,
                f"{where}: a nav link to {href}",
            )
        logout = self.one('form#logout[method="post"][action="/console/logout"]')
        csrf = self.one('input[type="hidden"][name="csrf"]', within=logout).get_attribute("value")
        check(bool(csrf), f"{where}: the logout form's csrf has a value")
        for form in self.driver.find_elements(By.CSS_SELECTOR, 'form[method="post"]'):
            check(
                len(form.find_elements(By.CSS_SELECTOR, 'input[type="hidden"][name="csrf"]')) == 1,
                f"{where}: every POST form carries a hidden csrf ({form.get_attribute('outerHTML')[:200]})",
            )
        sheets = self.driver.execute_script(
            "return Array.from(document.styleSheets).map(s => [s.href, s.cssRules.length])"
        )
        check(
            any(href and href.endswith("/console/static/console.css") and rules > 0 for href, rules in sheets),
            f"{where}: /console/static/console.css applied ({sheets})",
        )
        self.inert(where)
        return csrf

    # -- the views ----------------------------------------------------------------------------

    def expect_login_page(self, where):
        check(self.bare_path() == "/console/login", f"{where}: at /console/login, not {self.path()}")
        form = self.one('form#login[method="post"][action="/console/login"]')
        self.one('input[name="token"][type="password"]', within=form)
        self.one('button[type="submit"]', within=form)
        return form

    def log_in(self, token):
        form = self.expect_login_page("the login page")
        field = self.one('input[name="token"]', within=form)
        field.clear()
        field.send_keys(token)
        self.submit(form)

    def quit(self):
        try:
            self.driver.quit()
        except Exception:
            pass


def run(cfg, c):
    story, hostile = cfg["story"], cfg["hostile_order"]
    ok = lambda what: print(f"ok: {what}", flush=True)

    # Without a session (this browser's profile is new): a page redirects to the login page.
    c.open("/console/outbox")
    c.expect_login_page("the outbox without a session")
    c.inert("login")
    c.shot("login")
    ok("without a session /console/outbox redirects to the login page")

    c.log_in(cfg["wrong_token"])
    c.expect_login_page("after a wrong token")
    check(c.has("#error"), "a wrong token shows #error")
    check(not c.has("nav"), "a wrong token logs nobody in")
    c.shot("login-wrong-token")
    ok("a wrong token shows #error")

    c.log_in(cfg["token"])
    check(c.path() == "/console", f"logged in, at the overview: {c.path()}")
    check(c.text("h1").strip() == "Overview", "<h1>Overview</h1>")
    for table in ["table#deliveries", "table#recent-refusals", "table#refusals", "table#outboxes", "#writer"]:
        c.one(table)
    deliveries, outboxes = c.text("#deliveries"), c.text("#outboxes")
    check("stripe" in deliveries and "processed" in deliveries, f"#deliveries: {deliveries!r}")
    # The one forged delivery, and only it: the last hour's table lists refusals that happened.
    recent = [[td.get_attribute("textContent").strip() for td in r.find_elements(By.TAG_NAME, "td")]
              for r in c.data_rows("table#recent-refusals")]
    check(recent == [["stripe", "unauthorized", "1"]], f"#recent-refusals: {recent!r}")
    since_start = [[td.get_attribute("textContent").strip() for td in r.find_elements(By.TAG_NAME, "td")]
                   for r in c.data_rows("table#refusals")]
    check(["stripe", "unauthorized", "1"] in since_start, f"#refusals: {since_start!r}")
    check("email" in outboxes and "forward" in outboxes, f"#outboxes: {outboxes!r}")
    c.logged_in_page("overview")
    c.shot("overview")
    ok("the overview: deliveries, refusals, outboxes, writer")

    # The events list, from the nav: the delivery of a moment before is the newest.
    c.one('nav a[href="/console/events"]').click()
    WebDriverWait(c.driver, WAIT).until(lambda d: c.has("table#events"))
    c.logged_in_page("events")
    c.one('form#filter')
    rows = c.driver.find_elements(By.CSS_SELECTOR, "table#events tr.event")
    check(len(rows) >= 2, f"the events list has the deliveries ({len(rows)} rows)")
    first = rows[0].get_attribute("textContent")
    check(story["event_id"] in first, f"the newest event first: {first!r}")
    hostile_rows = [r for r in rows if hostile["event_id"] in r.get_attribute("textContent")]
    check(len(hostile_rows) == 1, "the hostile order's event is listed")
    c.shot("events")
    ok("the events list: newest first, a hostile order id inert")

    link = c.one("a.event-link", within=rows[0])
    expected = f"/console/events/{story['provider']}/{quote(story['event_id'], safe='')}"
    check(href_path(link) == f"/console/events/{story['provider']}/{story['event_id']}",
          f"the event link: {link.get_attribute('href')}")
    html = c.driver.find_element(By.TAG_NAME, "html")
    link.click()
    WebDriverWait(c.driver, WAIT).until(gone(html))
    check(unquote(c.bare_path()) == unquote(expected), f"at {expected}: {c.path()}")
    check(story["event_id"] in c.text("h1"), "the event id in <h1>")
    payload = c.text("pre#payload")
    for visible in cfg["visible"]:
        check(visible in payload, f"the payload shows {visible!r} literally: {payload!r}")
    check(json.loads(payload) == json.loads(story["payload"]), "the payload shown is the payload received, as JSON")
    check(
        c.driver.execute_script("return document.getElementById('payload').children.length") == 0,
        "the payload's <pre> holds only text",
    )
    # What it did: the change of its order it made (the API's pending order, now paid).
    changes = [[td.get_attribute("textContent").strip() for td in r.find_elements(By.TAG_NAME, "td")]
               for r in c.data_rows("table#changes")]
    check(len(changes) == 1 and changes[0][1:3] == ["pending", "paid"], f"what the event did: {changes!r}")
    # The headers it came with that are no secret: the content type, never the signature.
    headers = json.loads(c.text("pre#headers"))
    check(headers.get("content-type") == "application/json", f"the headers kept: {headers!r}")
    check(not any("signature" in name for name in headers), f"no signature header kept: {headers!r}")
    c.logged_in_page("event")
    c.shot("event")
    ok("the event: its headers, and its hostile payload inert, as JSON text")

    c.one("a#order-link").click()
    WebDriverWait(c.driver, WAIT).until(lambda d: c.has("#set-status"))
    order_path = f"/console/orders/{quote(story['order_id'], safe='')}"
    check(unquote(c.bare_path()) == unquote(order_path), f"at {order_path}: {c.path()}")
    check(story["order_id"] in c.text("h1"), "the order id in <h1>")
    for table in ["#summary", "table#transitions", "table#events", "table#emails", "table#forwards"]:
        c.one(table)
    check(cfg["metadata_marker"] in c.page_text(), "the order's metadata is shown")
    check(
        any(href_path(a) == unquote(expected) for a in c.driver.find_elements(By.CSS_SELECTOR, "table#events a.event-link")),
        "the order's events link to the event",
    )
    transitions_before = len(c.data_rows("table#transitions"))
    c.logged_in_page("order")
    c.shot("order")
    ok("the order's story: summary, transitions, events, emails, forwards")

    # A set-status without a reason is refused (the browser's own check taken away first).
    form = c.one('form#set-status[method="post"]')
    check(unquote(form.get_attribute("action")) == c.url(unquote(order_path) + "/status"),
          f"set-status action: {form.get_attribute('action')}")
    Select(c.one('select[name="status"]', within=form)).select_by_value(cfg["set_status"]["status"])
    reason = c.one('input[name="reason"]', within=form)
    check(reason.get_attribute("required") is not None, "the reason is required")
    c.driver.execute_script("arguments[0].removeAttribute('required')", reason)
    c.submit(form)
    check(c.has("#error"), "an empty reason: #error")
    check(not c.has("#notice"), "an empty reason: no notice")
    c.shot("set-status-without-reason")
    ok("a set-status without a reason is refused")

    c.open(order_path)
    form = c.one("form#set-status")
    Select(c.one('select[name="status"]', within=form)).select_by_value(cfg["set_status"]["status"])
    c.one('input[name="reason"]', within=form).send_keys(cfg["set_status"]["reason"])
    c.submit(form)
    check(unquote(c.bare_path()) == unquote(order_path), f"back at the order after set-status: {c.path()}")
    check(c.has("#notice"), "a notice after set-status")
    rows = c.data_rows("table#transitions")
    check(len(rows) == transitions_before + 1, f"one transition more ({transitions_before} -> {len(rows)})")
    mine = [r.get_attribute("textContent") for r in rows if cfg["set_status"]["reason"] in r.get_attribute("textContent")]
    check(len(mine) == 1, "the new transition shows the reason")
    check(cfg["operator"] in mine[0] and cfg["set_status"]["status"] in mine[0],
          f"the new transition shows the operator and the status: {mine[0]!r}")
    c.logged_in_page("order after set-status")
    c.shot("order-status-set")
    ok("set-status: notice, the transition with the operator's name and the reason")

    # The outbox: the dead email retried and then sent, the dead forward skipped.
    c.one('nav a[href="/console/outbox"]').click()
    WebDriverWait(c.driver, WAIT).until(lambda d: c.has("table#emails"))
    c.one("table#forwards")
    retry, guard = cfg["retry_email"], cfg["guard_email"]
    skip, guard_fwd = cfg["skip_forward"], cfg["guard_forward"]
    for kind, row in [("email", retry), ("email", guard), ("forward", skip), ("forward", guard_fwd)]:
        tr = c.one(f"tr#{kind}-{row['id']}")
        check("dead" in tr.get_attribute("textContent"), f"{kind} {row['id']} is listed dead")
        for action in ["retry", "skip"]:
            form = c.one(f"form.{action}", within=tr)
            check(form.get_attribute("method") == "post", f"{kind} {row['id']}: {action} posts")
            check(form.get_attribute("action") == c.url(f"/console/outbox/{kind}/{row['id']}/{action}"),
                  f"{kind} {row['id']}: {action} form action {form.get_attribute('action')}")
    check(cfg["email_error_marker"] in c.one(f"tr#email-{retry['id']}").get_attribute("textContent"),
          "the dead email's last error is shown")
    c.logged_in_page("outbox")
    c.shot("outbox")
    ok("the outbox lists the dead emails and forwards, each with retry and skip")

    c.submit(c.one("form.retry", within=c.one(f"tr#email-{retry['id']}")))
    check(c.bare_path() == "/console/outbox", f"back at the outbox after a retry: {c.path()}")
    notice = c.text("#notice")
    check(f"email {retry['id']}" in notice and "dead -> pending" in notice, f"the retry's notice: {notice!r}")
    c.logged_in_page("outbox after a retry")
    c.shot("outbox-email-retried")
    ok(f"retry: {notice.strip()!r}")

    c.submit(c.one("form.skip", within=c.one(f"tr#forward-{skip['id']}")))
    check(c.bare_path() == "/console/outbox", f"back at the outbox after a skip: {c.path()}")
    notice = c.text("#notice")
    check(f"forward {skip['id']}" in notice and "skipped" in notice, f"the skip's notice: {notice!r}")
    check(not c.has(f"tr#forward-{skip['id']}"), "the skipped forward is no longer listed")
    c.shot("outbox-forward-skipped")
    ok(f"skip: {notice.strip()!r}")

    # The retried email is sent (the relay in serve, the email API accepting it this time), and
    # the skipped forward shows so, on their order's page.
    order_of_a = f"/console/orders/{quote(retry['order_id'], safe='')}"
    deadline = time.monotonic() + 15
    while True:
        c.open(order_of_a)
        rows = c.data_rows("table#emails")
        emails = [r.get_attribute("textContent") for r in rows]
        statuses = [c.one("td.status", within=r).get_attribute("textContent").strip() for r in rows]
        if statuses == ["sent"]:
            break
        check(time.monotonic() < deadline, f"the retried email is sent within 15 s: {emails!r}")
        time.sleep(0.3)
    # Every try the relay recorded, oldest first: the refusal that killed it, then the send.
    tries = [li.get_attribute("textContent") for li in rows[0].find_elements(By.CSS_SELECTOR, "ol.attempts li")]
    results = [r.get_attribute("textContent") for r in rows[0].find_elements(By.CSS_SELECTOR, "ol.attempts .result")]
    check(results == ["dead", "sent"], f"the email's tries, each with its result: {tries!r}")
    check("answered 422" in tries[0], f"the first try's error: {tries[0]!r}")
    check(not c.has("#pwn-email"), "the email API's error text made no element")
    ok(f"the retried email is sent, its tries listed: {results!r}")
    forwards = [r.get_attribute("textContent") for r in c.data_rows("table#forwards")]
    check(len(forwards) == 1 and "skipped" in forwards[0], f"the skipped forward shows skipped: {forwards!r}")
    c.logged_in_page("the retried email's order")
    c.shot("order-email-sent-forward-skipped")
    ok("the retried email is sent; the forward shows skipped")

    # A stale CSRF token: one session's token, used after logging out and in again.
    c.open("/console/outbox")
    old = c.logged_in_page("outbox")
    c.submit(c.one("form#logout"))
    c.open("/console/outbox")
    c.expect_login_page("after logging out")
    ok("logging out ends the session")

    # Without a session, a POST from the console's own origin: refused.
    c.driver.execute_script(
        """const f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];
           f.id = 'forged'; const i = document.createElement('input'); i.type = 'hidden';
           i.name = 'csrf'; i.value = arguments[1]; f.appendChild(i);
           const b = document.createElement('button'); b.type = 'submit'; b.textContent = 'go';
           f.appendChild(b); document.body.appendChild(f);""",
        c.url(f"/console/outbox/email/{guard['id']}/retry"),
        old,
    )
    c.submit(c.one("form#forged"))
    check(c.bare_path() == f"/console/outbox/email/{guard['id']}/retry", f"no redirect: {c.path()}")
    check(not c.has("#notice") and not c.has("nav"), "without a session nothing is done")
    c.shot("refused-without-session")
    ok(f"without a session a retry is refused (#error shown: {c.has('#error')})")

    c.open("/console/login")
    c.log_in(cfg["token"])
    c.open("/console/outbox")
    fresh = c.logged_in_page("outbox, logged in again")
    check(fresh != old, "a new session has a new csrf token")
    tr = c.one(f"tr#email-{guard['id']}")
    form = c.one("form.retry", within=tr)
    c.driver.execute_script("arguments[0].value = arguments[1]", c.one('input[name="csrf"]', within=form), old)
    c.submit(form)
    check(c.has("#error"), "a stale csrf: #error")
    check(not c.has("#notice"), "a stale csrf: no notice")
    c.shot("refused-stale-csrf")
    c.open(order_path)
    form = c.one("form#set-status")
    c.driver.execute_script("arguments[0].value = arguments[1]", c.one('input[name="csrf"]', within=form), old)
    Select(c.one('select[name="status"]', within=form)).select_by_value(cfg["set_status"]["other_status"])
    c.one('input[name="reason"]', within=form).send_keys("with a stale token")
    c.submit(form)
    check(c.has("#error") and not c.has("#notice"), "a set-status with a stale csrf: #error")
    ok("a stale csrf is refused (retry, set-status)")

    # From another origin (another port of 127.0.0.1: the same site, so the SameSite=Strict
    # cookie goes along), with the session's valid csrf: refused.
    evil = Evil()
    for kind, row, action in [("email", guard, "retry"), ("forward", guard_fwd, "skip")]:
        page = evil.posting_page(f"{kind}-{action}", c.url(f"/console/outbox/{kind}/{row['id']}/{action}"), {"csrf": fresh})
        c.driver.get(page)
        c.wait_for_origin(c.base)
        check(c.bare_path() == f"/console/outbox/{kind}/{row['id']}/{action}", f"the forged post answered: {c.path()}")
        check(c.has("#error") and not c.has("#notice"), f"a {action} of {kind} {row['id']} from another origin: #error")
        c.shot(f"refused-cross-origin-{kind}-{action}")
        ok(f"a {action} from another origin ({evil.base}) with a valid csrf is refused")
    evil.server.shutdown()

    # Nothing any of them tried happened.
    c.open("/console/outbox")
    for kind, row in [("email", guard), ("forward", guard_fwd)]:
        text = c.one(f"tr#{kind}-{row['id']}").get_attribute("textContent")
        check("dead" in text, f"{kind} {row['id']} is still dead: {text!r}")
    c.open(order_path)
    rows = c.data_rows("table#transitions")
    check(len(rows) == transitions_before + 1, "no transition from the refused set-status")
    c.logged_in_page("order after the refusals")
    ok("after the refusals the guard rows are still dead and the order unchanged")

    # The hostile order id: its event, and its order's page, inert.
    c.open(f"/console/events/stripe/{quote(hostile['event_id'], safe='')}")
    c.logged_in_page("the hostile order's event")
    link = c.one("a#order-link")
    check(href_path(link) == f"/console/orders/{hostile['order_id']}",
          f"the order link is the order's: {link.get_attribute('href')}")
    c.one("a#order-link").click()
    WebDriverWait(c.driver, WAIT).until(lambda d: c.has("#set-status"))
    check(hostile["shown"] in c.text("h1"), f"the hostile order id in <h1>, escaped: {c.text('h1')!r}")
    c.logged_in_page("the hostile order")
    c.shot("order-hostile-id")
    ok("a hostile order id is inert text on its event and order pages")


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    c = Console(cfg)
    try:
        run(cfg, c)
    except Exception as e:
        try:
            c.shot("failure")
            where = c.driver.current_url
            text = c.page_text()[:3000]
        except Exception:
            where, text = "?", "?"
        traceback.print_exc()
        print(f"FAILED: {e}\n  at {where}\n  page text: {text!r}", file=sys.stderr, flush=True)
        c.quit()
        sys.exit(1)
    c.quit()
    print("done", flush=True)


if __name__ == "__main__":
    main()
