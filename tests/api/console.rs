//! The operator console (`/console`): server-rendered pages behind a login token, for an operator
//! to read the deliveries, an order's story and the outboxes, and to set an order's status, retry
//! and skip outbox rows.
//!
//! Plain HTTP (ureq, no redirects followed) against the real `sekali serve` binary: the console is
//! off without tokens, takes its own tokens else the API's, sets a strict session cookie, sends
//! its security headers on every page, redirects a request without a session to the login page,
//! refuses a POST without a session, without the session's CSRF token or from another origin, and
//! shows what came from outside (payloads, order ids, last errors) as inert text. And one test in
//! a real browser (headless Chromium driven by selenium, tests/support/console_browser.py) that
//! works through it as an operator would, keeping a screenshot of each view under
//! `target/console-screenshots/<engine>/`. Without chromium, chromedriver and Python's selenium
//! that test says so and passes, unless SEKALI_REQUIRE_BROWSER=1 (as .ci/test sets).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;

/// The console's login token; its name is the operator's, recorded as a set-status's actor.
const OPERATOR: &str = "ops-rina";
const CONSOLE_TOKEN: &str = "tok-console-7c2f9a41";
/// The orders API's token (the console does not take it while it has tokens of its own).
const API_TOKEN: &str = "tok-console-shop-41d0";

// ---------------------------------------------------------------------------------------------
// Pages: fetching them, and reading their HTML
// ---------------------------------------------------------------------------------------------

/// One answer of the console: status, headers (names in lower case) and body.
#[derive(Debug)]
struct Page {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Page {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The path of a redirect's Location (an absolute URL's origin taken off).
    fn location(&self) -> String {
        let location = self
            .header("location")
            .unwrap_or_else(|| panic!("no Location in {self:?}"));
        match location.find("://") {
            Some(scheme) => {
                let rest = &location[scheme + 3..];
                rest.find('/')
                    .map_or("/".to_owned(), |p| rest[p..].to_owned())
            }
            None => location.to_owned(),
        }
    }

    /// The session cookie's `Set-Cookie`, if the answer sets it to a value.
    fn session_cookie(&self) -> Option<&str> {
        self.all("set-cookie").into_iter().find(|c| {
            c.strip_prefix("sekali_console=")
                .is_some_and(|rest| !rest.starts_with(';') && !rest.is_empty())
        })
    }

    fn tags(&self) -> Vec<Tag> {
        tags(&self.body)
    }

    /// The start tag with this id.
    fn by_id(&self, id: &str) -> Option<Tag> {
        self.tags().into_iter().find(|t| t.attr("id") == Some(id))
    }

    fn has_id(&self, id: &str) -> bool {
        self.by_id(id).is_some()
    }

    /// The text inside the element with this id, its tags taken out and entities decoded.
    fn text_of(&self, id: &str) -> String {
        let tag = self
            .by_id(id)
            .unwrap_or_else(|| panic!("no #{id} in {}", self.body));
        decode(&strip_tags(inner_html(&self.body, &tag)))
    }

    /// The value of the first hidden `csrf` input.
    fn csrf(&self) -> String {
        self.tags()
            .into_iter()
            .find(|t| t.name == "input" && t.attr("name") == Some("csrf"))
            .and_then(|t| t.attr("value").map(str::to_owned))
            .unwrap_or_else(|| panic!("no csrf input in {}", self.body))
    }
}

/// A start tag: its name (lower case), its attributes (values entity-decoded), and where it
/// ends in the page (the byte after its `>`).
#[derive(Debug, Clone)]
struct Tag {
    name: String,
    attrs: Vec<(String, String)>,
    start: usize,
    end: usize,
}

impl Tag {
    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn has_class(&self, class: &str) -> bool {
        self.attr("class")
            .is_some_and(|c| c.split_whitespace().any(|c| c == class))
    }
}

/// Every start tag of `html`, in order (comments, doctype and end tags skipped): enough HTML for
/// pages whose markup the console writes itself.
fn tags(html: &str) -> Vec<Tag> {
    let bytes = html.as_bytes();
    let mut tags = Vec::new();
    let mut i = 0;
    while let Some(offset) = html[i..].find('<') {
        let start = i + offset;
        i = start + 1;
        if html[start..].starts_with("<!--") {
            i = html[start..]
                .find("-->")
                .map_or(bytes.len(), |e| start + e + 3);
            continue;
        }
        if !bytes.get(i).is_some_and(u8::is_ascii_alphabetic) {
            continue;
        }
        let name_end = html[i..]
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '-')
            .map_or(bytes.len(), |e| i + e);
        let name = html[i..name_end].to_ascii_lowercase();
        let mut attrs = Vec::new();
        let mut j = name_end;
        loop {
            while bytes.get(j).is_some_and(u8::is_ascii_whitespace) || bytes.get(j) == Some(&b'/') {
                j += 1;
            }
            match bytes.get(j) {
                None => break,
                Some(b'>') => {
                    j += 1;
                    break;
                }
                _ => {}
            }
            let attr_end = html[j..]
                .find(|c: char| c.is_ascii_whitespace() || c == '=' || c == '>' || c == '/')
                .map_or(bytes.len(), |e| j + e);
            let attr = html[j..attr_end].to_ascii_lowercase();
            j = attr_end;
            let mut value = String::new();
            if bytes.get(j) == Some(&b'=') {
                j += 1;
                match bytes.get(j) {
                    Some(&quote @ (b'"' | b'\'')) => {
                        let close = html[j + 1..]
                            .find(quote as char)
                            .map_or(bytes.len(), |e| j + 1 + e);
                        value = decode(&html[j + 1..close]);
                        j = (close + 1).min(bytes.len());
                    }
                    _ => {
                        let close = html[j..]
                            .find(|c: char| c.is_ascii_whitespace() || c == '>')
                            .map_or(bytes.len(), |e| j + e);
                        value = decode(&html[j..close]);
                        j = close;
                    }
                }
            }
            if attr.is_empty() {
                j += 1; // a stray character: step over it
            } else {
                attrs.push((attr, value));
            }
        }
        tags.push(Tag {
            name,
            attrs,
            start,
            end: j,
        });
        i = j;
    }
    tags
}

/// The HTML inside the element `tag` starts: up to its matching end tag.
fn inner_html<'a>(html: &'a str, tag: &Tag) -> &'a str {
    let (open, close) = (format!("<{}", tag.name), format!("</{}", tag.name));
    let lower = html.to_ascii_lowercase();
    // The next `<name` or `</name` at or after `from` that is that tag, not a longer name.
    let next = |pattern: &str, from: usize| {
        let mut from = from;
        while let Some(p) = lower[from..].find(pattern) {
            let at = from + p;
            let after = lower.as_bytes().get(at + pattern.len());
            if after.is_none_or(|b| b.is_ascii_whitespace() || *b == b'>' || *b == b'/') {
                return Some(at);
            }
            from = at + pattern.len();
        }
        None
    };
    let mut depth = 1;
    let mut at = tag.end;
    loop {
        let next_open = next(&open, at);
        let next_close = next(&close, at);
        match (next_open, next_close) {
            (_, None) => return &html[tag.end..],
            (Some(o), Some(c)) if o < c => {
                depth += 1;
                at = o + open.len();
            }
            (_, Some(c)) => {
                depth -= 1;
                if depth == 0 {
                    return &html[tag.end..c];
                }
                at = c + close.len();
            }
        }
    }
}

fn strip_tags(html: &str) -> String {
    let mut text = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text
}

/// HTML character references decoded (the named ones an escaper writes, and numeric ones).
fn decode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let Some(semi) = rest.find(';').filter(|&s| s <= 10) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let entity = &rest[1..semi];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "nbsp" => Some('\u{a0}'),
            _ => entity
                .strip_prefix("#x")
                .or_else(|| entity.strip_prefix("#X"))
                .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                .or_else(|| entity.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `text` percent-encoded as one path segment.
fn segment(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .redirects(0)
        .timeout(Duration::from_secs(15))
        .build()
}

fn answer(result: Result<ureq::Response, ureq::Error>, what: &str) -> Page {
    let response = match result {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(e) => panic!("{what}: {e}"),
    };
    let status = response.status();
    let headers = response
        .headers_names()
        .into_iter()
        .flat_map(|name| {
            response
                .all(&name)
                .into_iter()
                .map(|v| (name.to_ascii_lowercase(), v.to_owned()))
                .collect::<Vec<_>>()
        })
        .collect();
    let body = response.into_string().unwrap_or_default();
    Page {
        status,
        headers,
        body,
    }
}

/// A client of the console on `port`, with the session cookie once logged in.
struct Console {
    port: u16,
    agent: ureq::Agent,
    cookie: Option<String>,
}

impl Console {
    fn new(port: u16) -> Console {
        Console {
            port,
            agent: agent(),
            cookie: None,
        }
    }

    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> ureq::Request {
        let mut request = self
            .agent
            .request(method, &format!("{}{path}", self.origin()));
        if let Some(cookie) = &self.cookie {
            request = request.set("Cookie", cookie);
        }
        for (name, value) in headers {
            request = request.set(name, value);
        }
        request
    }

    fn get(&self, path: &str) -> Page {
        self.get_with(path, &[])
    }

    fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Page {
        answer(
            self.request("GET", path, headers).call(),
            &format!("GET {path}"),
        )
    }

    fn post(&self, path: &str, form: &[(&str, &str)], headers: &[(&str, &str)]) -> Page {
        answer(
            self.request("POST", path, headers).send_form(form),
            &format!("POST {path}"),
        )
    }

    /// Logs in with `token`, keeping the session cookie; the login's answer.
    fn log_in(&mut self, token: &str) -> Page {
        let page = self.post("/console/login", &[("token", token)], &[]);
        if let Some(cookie) = page.session_cookie() {
            self.cookie = Some(cookie.split(';').next().unwrap().to_owned());
        }
        page
    }

    /// A session of the operator: logged in, the login checked.
    fn logged_in(port: u16) -> Console {
        let mut console = Console::new(port);
        let page = console.log_in(CONSOLE_TOKEN);
        assert_eq!(page.status, 303, "the login: {page:?}");
        assert!(console.cookie.is_some(), "a session cookie: {page:?}");
        console
    }

    /// The CSRF token of this session (from the overview's logout form).
    fn csrf(&self) -> String {
        let page = self.get("/console");
        assert_eq!(page.status, 200, "{page:?}");
        page.csrf()
    }
}

// ---------------------------------------------------------------------------------------------
// Servers and what they hold
// ---------------------------------------------------------------------------------------------

/// `sekali serve` with the console's tokens `console` and the API's `api` (each unset when
/// `None`, whatever this process's environment holds), more `env`, and `args`.
fn serve(
    console: Option<&str>,
    api: Option<&str>,
    env: &[(&str, &str)],
    args: &[&str],
) -> ServeProcess {
    let mut all: Vec<(&str, &str)> = PROVIDER_ENV.to_vec();
    let mut unset = Vec::new();
    match console {
        Some(tokens) => all.push(("SEKALI_CONSOLE_TOKENS", tokens)),
        None => unset.push("SEKALI_CONSOLE_TOKENS"),
    }
    match api {
        Some(tokens) => all.push(("SEKALI_API_TOKENS", tokens)),
        None => unset.push("SEKALI_API_TOKENS"),
    }
    all.extend_from_slice(env);
    ServeProcess::start_unsetting(None, &all, &unset, "warn", args)
}

fn console_tokens() -> String {
    format!("{OPERATOR}:{CONSOLE_TOKEN}")
}

fn api_tokens() -> String {
    format!("shop:{API_TOKEN}")
}

/// The console's server, sending nothing (`--no-relay`): its emails and forwards wait, pending.
/// Forwarding is on (to a port nothing listens on), so every order change has a forward row.
fn serve_console() -> ServeProcess {
    let secret = sekali::forward::new_secret().unwrap();
    let url = format!("http://127.0.0.1:{}/hooks", free_port());
    serve(
        Some(&console_tokens()),
        Some(&api_tokens()),
        &[
            ("SEKALI_FORWARD_URL", url.as_str()),
            ("SEKALI_FORWARD_SECRET", secret.as_str()),
        ],
        &["--no-relay"],
    )
}

/// The Stripe `payment_intent.succeeded` fixture for order `order_id`, as event `event_id`, with
/// its own PaymentIntent, paid by `email`, and `description` (where hostile text goes).
fn succeeded(event_id: &str, order_id: &str, email: &str, description: &str) -> String {
    let mut event: Value =
        serde_json::from_slice(&fixture("stripe/payment_intent.succeeded.json")).unwrap();
    event["id"] = json!(event_id);
    let object = &mut event["data"]["object"];
    object["id"] = json!(format!("pi_{}", event_id.trim_start_matches("evt_")));
    object["metadata"]["order_id"] = json!(order_id);
    object["receipt_email"] = json!(email);
    object["description"] = json!(description);
    // serde_json writes U+202E raw and ESC as \u001b: the bytes a provider could send.
    serde_json::to_string_pretty(&event).unwrap()
}

/// Delivers a signed Stripe event to `server`; it must be processed.
fn deliver(server: &ServeProcess, body: &str) {
    let answer = deliver_stripe(&agent(), server.port, body.as_bytes());
    assert_eq!(answer, (200, "processed".to_owned()), "{body}");
}

/// What hostile text the payloads carry: markup that would run script if it became markup, a
/// bidi override, ESC, BEL and a zero-width space.
const HOSTILE_SCRIPT: &str = "<script>window.__pwned=1</script>";
const HOSTILE_IMG: &str = r#"<img src=x onerror="window.__pwned=1">"#;

fn hostile_description() -> String {
    format!("{HOSTILE_SCRIPT}{HOSTILE_IMG} \u{202e}gnp.exe \u{1b}[31m red \u{7} \u{200b}.")
}

/// A hostile order id: markup, a bidi override and ESC.
const HOSTILE_ORDER: &str = "ord_<b id=\"pwn-order\">x</b>\u{202e}gnp\u{1b}[31m";

/// [`HOSTILE_ORDER`] as the console shows text from outside: control and bidi characters as
/// `\u{..}`.
fn hostile_order_shown() -> String {
    HOSTILE_ORDER
        .replace('\u{202e}', r"\u{202e}")
        .replace('\u{1b}', r"\u{1b}")
}

/// Characters no page may hold raw (each shown escaped instead).
const RAW_FORBIDDEN: [char; 4] = ['\u{202e}', '\u{1b}', '\u{7}', '\u{200b}'];

fn sekali_json_lines(args: &[&str]) -> Vec<Value> {
    let output = Command::new(sekali_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(output.status.success(), "sekali {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// The outbox rows (`sekali outbox list --json`) by id.
fn outbox_rows(db: &Database) -> HashMap<i64, Value> {
    rows_by_id(db, "outbox")
}

/// The forwarding rows (`sekali forward list --json`) by id.
fn forward_rows(db: &Database) -> HashMap<i64, Value> {
    rows_by_id(db, "forward")
}

/// `sekali {command} list --json` (outbox, forward): every row, by id.
fn rows_by_id(db: &Database, command: &str) -> HashMap<i64, Value> {
    let db = db.arg();
    let rows = sekali_json_lines(&[command, "list", "--db", &db, "--limit", "1000", "--json"]);
    rows.into_iter()
        .map(|r| (r["id"].as_i64().unwrap(), r))
        .collect()
}

/// Every outbox row's state, emails' and forwards'.
fn outbox_state(db: &Database) -> Rows {
    let mut rows = db.query(
        "SELECT 'email', id, status, attempts, next_attempt_at, last_error FROM email_outbox ORDER BY id",
    );
    rows.extend(db.query(
        "SELECT 'forward', id, status, attempts, next_attempt_at, last_error FROM forward_outbox ORDER BY id",
    ));
    rows
}

fn the_id(db: &Database, sql: &str) -> i64 {
    db.count(sql)
}

fn operator_transitions(db: &Database) -> Vec<Vec<Option<String>>> {
    db.query(
        "SELECT order_id, to_status, actor, reason FROM order_transitions \
         WHERE provider = 'operator' ORDER BY id",
    )
}

/// Checks the headers every console page carries: the CSP (nothing but styles from 'self', no
/// framing, forms only to 'self'), nosniff, no-store, HTML.
fn assert_security_headers(page: &Page, what: &str) {
    let csp = page
        .header("content-security-policy")
        .unwrap_or_else(|| panic!("{what}: no Content-Security-Policy: {:?}", page.headers));
    let directives: HashMap<String, Vec<String>> = csp
        .split(';')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            let mut parts = d.split_whitespace();
            let name = parts.next().unwrap().to_ascii_lowercase();
            (name, parts.map(str::to_owned).collect())
        })
        .collect();
    let directive = |name: &str| directives.get(name).map(Vec::as_slice);
    assert_eq!(
        directive("default-src"),
        Some(&["'none'".to_owned()][..]),
        "{what}: {csp}"
    );
    assert_eq!(
        directive("style-src"),
        Some(&["'self'".to_owned()][..]),
        "{what}: styles only from 'self': {csp}"
    );
    if let Some(scripts) = directive("script-src") {
        assert_eq!(
            scripts,
            ["'none'"],
            "{what}: no script from anywhere: {csp}"
        );
    }
    assert_eq!(
        directive("form-action"),
        Some(&["'self'".to_owned()][..]),
        "{what}: {csp}"
    );
    assert_eq!(
        directive("frame-ancestors"),
        Some(&["'none'".to_owned()][..]),
        "{what}: {csp}"
    );
    assert_eq!(
        page.header("x-content-type-options"),
        Some("nosniff"),
        "{what}"
    );
    let cache = page.header("cache-control").unwrap_or("");
    assert!(
        cache.split(',').any(|d| d.trim() == "no-store"),
        "{what}: Cache-Control {cache:?}"
    );
}

/// Checks an HTML page of the console: the security headers, its stylesheet and no script, no
/// inline style (the CSP would block it), and no raw control or bidi character.
fn assert_console_html(page: &Page, what: &str) {
    assert_security_headers(page, what);
    let content_type = page.header("content-type").unwrap_or("");
    assert!(
        content_type.starts_with("text/html"),
        "{what}: {content_type}"
    );
    let tags = page.tags();
    assert!(
        tags.iter().any(|t| t.name == "link"
            && t.attr("rel") == Some("stylesheet")
            && t.attr("href") == Some("/console/static/console.css")),
        "{what}: the stylesheet link: {}",
        page.body
    );
    for tag in &tags {
        assert!(
            tag.name != "script" && tag.name != "style" && tag.attr("style").is_none(),
            "{what}: no script, no inline style: {:?}",
            &page.body[tag.start..tag.end]
        );
        assert!(
            !tag.attrs.iter().any(|(n, _)| n.starts_with("on")),
            "{what}: no event handler attribute: {:?}",
            &page.body[tag.start..tag.end]
        );
    }
    for c in RAW_FORBIDDEN {
        assert!(
            !page.body.contains(c),
            "{what}: a raw U+{:04X} in the page",
            c as u32
        );
    }
}

/// Checks a page of a session: [`assert_console_html`], the nav links, the logout form with its
/// csrf, and a csrf in every POST form.
fn assert_session_page(page: &Page, what: &str) {
    assert_eq!(page.status, 200, "{what}: {page:?}");
    assert_console_html(page, what);
    let all = page.tags();
    let nav = all
        .iter()
        .find(|t| t.name == "nav")
        .unwrap_or_else(|| panic!("{what}: no <nav>: {}", page.body));
    let nav_html = inner_html(&page.body, nav);
    let links: Vec<String> = tags(nav_html)
        .into_iter()
        .filter(|t| t.name == "a")
        .filter_map(|t| t.attr("href").map(str::to_owned))
        .collect();
    for href in ["/console", "/console/events", "/console/outbox"] {
        assert!(
            links.iter().any(|l| l == href),
            "{what}: a nav link to {href}: {links:?}"
        );
    }
    let logout = page
        .by_id("logout")
        .unwrap_or_else(|| panic!("{what}: no #logout: {}", page.body));
    assert_eq!(
        (
            logout.name.as_str(),
            logout
                .attr("method")
                .map(str::to_ascii_lowercase)
                .as_deref(),
            logout.attr("action")
        ),
        ("form", Some("post"), Some("/console/logout")),
        "{what}"
    );
    for form in all.iter().filter(|t| {
        t.name == "form" && t.attr("method").map(str::to_ascii_lowercase).as_deref() == Some("post")
    }) {
        let inner = tags(inner_html(&page.body, form));
        let csrf: Vec<&Tag> = inner
            .iter()
            .filter(|t| t.name == "input" && t.attr("name") == Some("csrf"))
            .collect();
        assert!(
            csrf.len() == 1
                && csrf[0].attr("type") == Some("hidden")
                && csrf[0].attr("value").is_some_and(|v| v.len() >= 16),
            "{what}: a POST form without its hidden csrf: {:?}",
            &page.body[form.start..form.end]
        );
    }
}

/// Asserts a refusal: `status`, and an error page with `#error` (and its security headers).
fn assert_refused(page: &Page, status: u16, what: &str) {
    assert_eq!(page.status, status, "{what}: {page:?}");
    assert!(page.has_id("error"), "{what}: no #error: {}", page.body);
    assert!(!page.has_id("notice"), "{what}: a notice: {}", page.body);
    assert_console_html(page, what);
}

// ---------------------------------------------------------------------------------------------
// Plain HTTP
// ---------------------------------------------------------------------------------------------

/// Every console path, as an operator's browser would ask for it.
const CONSOLE_GETS: [&str; 8] = [
    "/console",
    "/console/",
    "/console/login",
    "/console/events",
    "/console/events/stripe/evt_x",
    "/console/orders/ord_x",
    "/console/outbox",
    "/console/static/console.css",
];

#[test]
fn the_console_takes_its_own_tokens_else_the_api_tokens_and_with_neither_is_not_there() {
    // Neither: every console path is 404, as if there were none.
    let off = serve(None, None, &[], &[]);
    let console = Console::new(off.port);
    for path in CONSOLE_GETS {
        assert_eq!(console.get(path).status, 404, "GET {path}");
    }
    for path in [
        "/console/login",
        "/console/logout",
        "/console/orders/ord_x/status",
        "/console/outbox/email/1/retry",
    ] {
        let page = console.post(path, &[("token", CONSOLE_TOKEN), ("csrf", "x")], &[]);
        assert_eq!(page.status, 404, "POST {path}");
    }
    drop(off);

    // The API's tokens only: the console takes them, the token's name as the operator's.
    let api_only = serve(None, Some(&api_tokens()), &[], &[]);
    let mut console = Console::new(api_only.port);
    assert_eq!(console.log_in(CONSOLE_TOKEN).status, 401);
    let login = console.log_in(API_TOKEN);
    assert_eq!(
        (login.status, login.location().as_str()),
        (303, "/console"),
        "{login:?}"
    );
    assert_session_page(
        &console.get("/console"),
        "the overview, logged in with the API's token",
    );
    drop(api_only);

    // Both: the console's own, and the API's no longer opens it.
    let both = serve(Some(&console_tokens()), Some(&api_tokens()), &[], &[]);
    let mut console = Console::new(both.port);
    assert_refused(
        &console.log_in(API_TOKEN),
        401,
        "the API's token at the console's login",
    );
    assert!(console.cookie.is_none());
    assert_eq!(console.log_in(CONSOLE_TOKEN).status, 303);
    assert_session_page(&console.get("/console"), "the overview");
}

/// The in-process server (the harness's Settings) has the console with `console_tokens` set,
/// and not without.
#[actix_web::test]
async fn settings_console_tokens_turn_the_console_on() {
    let client = awc::Client::builder().disable_redirects().finish();
    let off = spawn_app().await;
    let answer = client
        .get(format!("{}/console/login", off.address))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 404);
    off.stop().await;
    let on = spawn_app_with(|s| {
        s.console_tokens = sekali::config::parse_api_tokens(&console_tokens()).unwrap()
    })
    .await;
    let answer = client
        .get(format!("{}/console/login", on.address))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let answer = client
        .post(format!("{}/console/login", on.address))
        .send_form(&[("token", CONSOLE_TOKEN)])
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 303);
    on.stop().await;
}

/// The parts of a `Set-Cookie` after its value: attribute names in lower case, with values.
fn cookie_attributes(set_cookie: &str) -> HashMap<String, String> {
    set_cookie
        .split(';')
        .skip(1)
        .map(|a| {
            let (name, value) = a.split_once('=').unwrap_or((a, ""));
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect()
}

#[test]
fn login_sets_an_http_only_strict_session_cookie_secure_unless_on_loopback() {
    let server = serve(Some(&console_tokens()), Some(&api_tokens()), &[], &[]);
    let console = Console::new(server.port);

    let login = console.get("/console/login");
    assert_eq!(login.status, 200, "{login:?}");
    assert_console_html(&login, "the login page");
    let form = login
        .by_id("login")
        .unwrap_or_else(|| panic!("no #login: {}", login.body));
    assert_eq!(
        (
            form.name.as_str(),
            form.attr("method").map(str::to_ascii_lowercase).as_deref(),
            form.attr("action")
        ),
        ("form", Some("post"), Some("/console/login"))
    );
    let inside = tags(inner_html(&login.body, &form));
    assert!(
        inside.iter().any(|t| t.name == "input"
            && t.attr("name") == Some("token")
            && t.attr("type") == Some("password")),
        "{}",
        login.body
    );
    assert!(
        inside
            .iter()
            .any(|t| t.name == "button" && t.attr("type") == Some("submit")),
        "{}",
        login.body
    );

    // A wrong token: 401, the login page again with #error, no session.
    for wrong in [
        "tok-console-7c2f9a4",
        "",
        "ops-rina:tok-console-7c2f9a41",
        API_TOKEN,
    ] {
        let page = console.post("/console/login", &[("token", wrong)], &[]);
        assert_refused(&page, 401, &format!("the token {wrong:?}"));
        assert!(page.has_id("login"), "the login form again: {}", page.body);
        assert!(page.session_cookie().is_none(), "{page:?}");
    }

    // The right one: 303 to the overview, with the cookie.
    let mut cookies = Vec::new();
    for (host, secure) in [
        (None, false),
        (Some(format!("localhost:{}", server.port)), false),
        (Some("localhost".to_owned()), false),
        (Some(format!("[::1]:{}", server.port)), false),
        (Some("shop.example".to_owned()), true),
        (Some("console.shop.example:8443".to_owned()), true),
    ] {
        let headers: Vec<(&str, &str)> = host.iter().map(|h| ("Host", h.as_str())).collect();
        let page = console.post("/console/login", &[("token", CONSOLE_TOKEN)], &headers);
        assert_eq!(
            (page.status, page.location().as_str()),
            (303, "/console"),
            "Host {host:?}: {page:?}"
        );
        let cookie = page
            .session_cookie()
            .unwrap_or_else(|| panic!("Host {host:?}: no session cookie: {page:?}"));
        let attributes = cookie_attributes(cookie);
        assert_eq!(
            attributes.get("path").map(String::as_str),
            Some("/console"),
            "{cookie}"
        );
        assert!(attributes.contains_key("httponly"), "{cookie}");
        assert_eq!(
            attributes
                .get("samesite")
                .map(|s| s.to_ascii_lowercase())
                .as_deref(),
            Some("strict"),
            "{cookie}"
        );
        assert_eq!(
            attributes.contains_key("secure"),
            secure,
            "Secure for Host {host:?}: {cookie}"
        );
        assert!(!attributes.contains_key("domain"), "{cookie}");
        cookies.push(cookie.split(';').next().unwrap().to_owned());
    }
    cookies.sort();
    cookies.dedup();
    assert_eq!(cookies.len(), 6, "every login its own session");

    // The session opens the console.
    let mut session = Console::new(server.port);
    session.cookie = Some(cookies[0].clone());
    let overview = session.get("/console");
    assert_session_page(&overview, "the overview");
    assert_eq!(overview.text_of_h1(), "Overview");

    // A login from another origin is refused, its own origin is not.
    for origin in [
        "http://evil.example".to_owned(),
        format!("http://127.0.0.1:{}", free_port()),
        format!("http://localhost:{}", server.port),
        "null".to_owned(),
    ] {
        let page = console.post(
            "/console/login",
            &[("token", CONSOLE_TOKEN)],
            &[("Origin", &origin)],
        );
        assert_eq!(page.status, 403, "Origin {origin}: {page:?}");
        assert!(page.session_cookie().is_none(), "Origin {origin}: {page:?}");
    }
    let own = console.post(
        "/console/login",
        &[("token", CONSOLE_TOKEN)],
        &[("Origin", &console.origin())],
    );
    assert_eq!(own.status, 303, "{own:?}");
}

/// The origin check compares the host and port, not the scheme: behind a TLS proxy the browser
/// posts with `Origin: https://shop.example` while sekali serves plain `http://` (and a proxy
/// need not say so in `X-Forwarded-Proto`). A page cannot be served from the console's own host
/// and port under another scheme at the same time, so nothing is let in by it. Another host, or
/// another port, is refused (see the tests above).
#[test]
fn behind_a_tls_proxy_the_consoles_own_host_and_port_under_https_is_its_origin() {
    let server = serve_with_an_order();
    let db = server.db().clone();
    let mut console = Console::new(server.port);
    let through_tls = format!("https://127.0.0.1:{}", server.port);
    let login = console.post(
        "/console/login",
        &[("token", CONSOLE_TOKEN)],
        &[("Origin", &through_tls)],
    );
    assert_eq!(
        login.status, 303,
        "a login from Origin {through_tls}: {login:?}"
    );
    assert!(login.session_cookie().is_some(), "{login:?}");
    console.log_in(CONSOLE_TOKEN);
    let csrf = console.csrf();
    let set = console.post(
        "/console/orders/ord_console_1/status",
        &[("status", "cancelled"), ("reason", "r"), ("csrf", &csrf)],
        &[("Origin", &through_tls)],
    );
    assert_eq!(set.status, 303, "{set:?}");
    assert_eq!(operator_transitions(&db).len(), 1);
}

impl Page {
    fn text_of_h1(&self) -> String {
        let h1 = self
            .tags()
            .into_iter()
            .find(|t| t.name == "h1")
            .unwrap_or_else(|| panic!("no <h1>: {}", self.body));
        decode(&strip_tags(inner_html(&self.body, &h1)))
            .trim()
            .to_owned()
    }
}

/// A server holding one paid order (`ord_console_1`, its event `evt_console_1`) whose email and
/// forward wait, pending.
fn serve_with_an_order() -> ServeProcess {
    let server = serve_console();
    deliver(
        &server,
        &succeeded(
            "evt_console_1",
            "ord_console_1",
            "ana@example.com",
            "Order 1",
        ),
    );
    server
}

#[test]
fn every_console_page_sends_its_csp_nosniff_and_no_store_and_no_script() {
    let server = serve_with_an_order();
    let console = Console::logged_in(server.port);
    for path in [
        "/console",
        "/console/events",
        "/console/events?provider=stripe&since=1h",
        "/console/events/stripe/evt_console_1",
        "/console/orders/ord_console_1",
        "/console/outbox",
    ] {
        let page = console.get(path);
        assert_session_page(&page, path);
    }
    let overview = console.get("/console");
    assert_eq!(overview.text_of_h1(), "Overview");
    for id in ["deliveries", "refusals", "outboxes", "writer"] {
        assert!(
            overview.has_id(id),
            "#{id} on the overview: {}",
            overview.body
        );
    }
    // The error pages too.
    let unknown = console.get("/console/events/stripe/evt_never_delivered");
    assert_eq!(unknown.status, 404, "{unknown:?}");
    assert_console_html(&unknown, "an unknown event");
    let no_session = Console::new(server.port);
    let login = no_session.get("/console/login");
    assert_console_html(&login, "the login page");
    let wrong = no_session.post("/console/login", &[("token", "nope")], &[]);
    assert_refused(&wrong, 401, "a wrong token");
    let forbidden = console.post(
        "/console/orders/ord_console_1/status",
        &[("status", "cancelled"), ("reason", "r"), ("csrf", "wrong")],
        &[],
    );
    assert_refused(&forbidden, 403, "a wrong csrf");
    // Refused before any handler ran, by actix reading the request: a body that is not a form,
    // a path whose row id is not a number.
    let unreadable_form = answer(
        agent()
            .post(&format!("http://127.0.0.1:{}/console/login", server.port))
            .set("Content-Type", "application/json")
            .send_string(r#"{"token":"x"}"#),
        "a body that is not a form",
    );
    assert_eq!(unreadable_form.status, 415, "{unreadable_form:?}");
    assert_security_headers(&unreadable_form, "a form actix could not read");
    let unreadable_path = console.post(
        "/console/outbox/email/not-a-number/retry",
        &[("csrf", "x")],
        &[],
    );
    assert_eq!(unreadable_path.status, 404, "{unreadable_path:?}");
    assert_security_headers(&unreadable_path, "a path actix could not read");
    // The stylesheet: CSS, nosniff.
    let css = console.get("/console/static/console.css");
    assert_eq!(css.status, 200, "{css:?}");
    assert!(
        css.header("content-type")
            .unwrap_or("")
            .starts_with("text/css"),
        "{css:?}"
    );
    assert_eq!(css.header("x-content-type-options"), Some("nosniff"));
    assert!(!css.body.trim().is_empty());
}

/// Under `Referrer-Policy: no-referrer` (a header or a `<meta name="referrer">`) a browser sends
/// `Origin: null` with every form it posts (the Fetch standard's origin serialisation), which the
/// console's origin check must refuse: its own login and forms would then never work in a
/// browser. The browser test shows it; this one says it without a browser.
#[test]
fn the_referrer_policy_lets_a_browser_send_the_consoles_origin_with_its_forms() {
    let server = serve_with_an_order();
    let console = Console::logged_in(server.port);
    for (path, page) in [
        (
            "/console/login",
            Console::new(server.port).get("/console/login"),
        ),
        (
            "/console/orders/ord_console_1",
            console.get("/console/orders/ord_console_1"),
        ),
        ("/console/outbox", console.get("/console/outbox")),
    ] {
        let mut policies: Vec<String> = page
            .all("referrer-policy")
            .iter()
            .flat_map(|v| v.split(','))
            .map(|p| p.trim().to_ascii_lowercase())
            .collect();
        policies.extend(
            page.tags()
                .into_iter()
                .filter(|t| t.name == "meta" && t.attr("name") == Some("referrer"))
                .filter_map(|t| t.attr("content").map(str::to_ascii_lowercase)),
        );
        assert!(
            !policies.iter().any(|p| p == "no-referrer"),
            "{path}: Referrer-Policy {policies:?} makes a browser post its forms with Origin: null"
        );
    }
}

/// Guessing tokens from one address goes nowhere: twenty tries at once (an operator mistyping,
/// a script logging in a few times), then 429 with the time to come back, for the right token
/// too, and no session.
#[test]
fn logins_from_one_address_are_refused_after_twenty_and_told_when_to_try_again() {
    let server = serve_console();
    let mut guesser = Console::new(server.port);
    let mut tries = 0;
    let refused = loop {
        tries += 1;
        let page = guesser.log_in(&format!("guess-{tries}"));
        if page.status != 401 {
            break page;
        }
        assert!(tries < 40, "still 401 after {tries} tries");
    };
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(tries > 20, "refused after {tries} tries, fewer than twenty");
    let retry_after: u64 = refused
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("Retry-After: {refused:?}"));
    assert!((1..=7).contains(&retry_after), "Retry-After {retry_after}");
    assert!(
        refused.body.contains("Too many logins from this address"),
        "{}",
        refused.body
    );
    assert_console_html(&refused, "a refused login");
    let right = guesser.log_in(CONSOLE_TOKEN);
    assert_eq!(right.status, 429, "{right:?}");
    assert!(right.session_cookie().is_none(), "{right:?}");
    assert!(guesser.cookie.is_none());
}

#[test]
fn without_a_session_pages_redirect_to_the_login_and_posts_are_refused() {
    let server = serve_with_an_order();
    let db = server.db().clone();
    let session = Console::logged_in(server.port);
    let csrf = session.csrf();
    let email = the_id(&db, "SELECT max(id) FROM email_outbox");
    let forward = the_id(&db, "SELECT max(id) FROM forward_outbox");
    let before = outbox_state(&db);

    for cookie in [None, Some("sekali_console=forged-session-value")] {
        let mut console = Console::new(server.port);
        console.cookie = cookie.map(str::to_owned);
        for path in [
            "/console",
            "/console/events",
            "/console/events/stripe/evt_console_1",
            "/console/orders/ord_console_1",
            "/console/outbox",
        ] {
            let page = console.get(path);
            assert_eq!(
                (page.status, page.location().as_str()),
                (303, "/console/login"),
                "GET {path} with {cookie:?}: {page:?}"
            );
        }
        for (path, form) in [
            (
                "/console/orders/ord_console_1/status".to_owned(),
                vec![
                    ("status", "cancelled"),
                    ("reason", "no session"),
                    ("csrf", csrf.as_str()),
                ],
            ),
            (
                format!("/console/outbox/email/{email}/retry"),
                vec![("csrf", csrf.as_str())],
            ),
            (
                format!("/console/outbox/email/{email}/skip"),
                vec![("csrf", csrf.as_str())],
            ),
            (
                format!("/console/outbox/forward/{forward}/skip"),
                vec![("csrf", csrf.as_str())],
            ),
        ] {
            let page = console.post(&path, &form, &[]);
            assert_eq!(page.status, 403, "POST {path} with {cookie:?}: {page:?}");
        }
    }
    assert!(operator_transitions(&db).is_empty());
    assert_eq!(outbox_state(&db), before);
    // The session still works.
    assert_session_page(&session.get("/console"), "the overview");
}

/// Logging out ends the session itself, not only the browser's copy of its cookie: the cookie,
/// kept (copied by malware, or from a shared machine's disk) and sent again, no longer opens
/// the console, and its CSRF token no longer acts.
#[test]
fn a_session_logged_out_of_is_over_even_for_a_copy_of_its_cookie() {
    let server = serve_with_an_order();
    let db = server.db().clone();
    let session = Console::logged_in(server.port);
    let csrf = session.csrf();
    let logout = session.post("/console/logout", &[("csrf", &csrf)], &[]);
    assert_eq!(
        (logout.status, logout.location().as_str()),
        (303, "/console/login"),
        "{logout:?}"
    );
    let removal = logout
        .all("set-cookie")
        .into_iter()
        .find(|c| c.starts_with("sekali_console="))
        .unwrap_or_else(|| panic!("the logout removes the cookie: {logout:?}"));
    let attributes = cookie_attributes(removal);
    assert!(
        attributes.get("max-age").is_some_and(|a| a == "0") || attributes.contains_key("expires"),
        "{removal}"
    );
    let after = session.get("/console");
    assert_eq!(
        (after.status, after.header("location")),
        (303, Some("/console/login")),
        "the logged-out session's cookie still opens the console"
    );
    let set = session.post(
        "/console/orders/ord_console_1/status",
        &[
            ("status", "cancelled"),
            ("reason", "after logout"),
            ("csrf", &csrf),
        ],
        &[],
    );
    assert_eq!(set.status, 403, "{set:?}");
    assert!(operator_transitions(&db).is_empty());
}

/// A refused action: what it is, the csrf it sends (if any), and its headers.
type Case<'a> = (&'a str, Option<&'a str>, Vec<(&'a str, &'a str)>);

#[test]
fn a_post_without_the_sessions_csrf_token_or_from_another_origin_is_refused() {
    let server = serve_with_an_order();
    let db = server.db().clone();
    let mut console = Console::logged_in(server.port);
    let path = "/console/orders/ord_console_1/status";
    let stale = console.csrf();
    // Log out and in again: the first session's token is stale.
    let logout = console.post("/console/logout", &[("csrf", &stale)], &[]);
    assert_eq!(logout.status, 303, "{logout:?}");
    console.log_in(CONSOLE_TOKEN);
    let csrf = console.csrf();
    assert_ne!(csrf, stale, "a new session, a new token");
    let other_port = format!("http://127.0.0.1:{}", free_port());
    let other_host = format!("http://localhost:{}", server.port);

    let set = |csrf: Option<&str>, reason: &str, headers: &[(&str, &str)]| {
        let mut form = vec![("status", "cancelled"), ("reason", reason)];
        if let Some(csrf) = csrf {
            form.push(("csrf", csrf));
        }
        console.post(path, &form, headers)
    };
    let cases: [Case; 10] = [
        ("no csrf", None, vec![]),
        ("an empty csrf", Some(""), vec![]),
        (
            "a wrong csrf",
            Some("0123456789abcdef0123456789abcdef"),
            vec![],
        ),
        ("a stale csrf", Some(&stale), vec![]),
        (
            "another origin",
            Some(&csrf),
            vec![("Origin", "http://evil.example")],
        ),
        ("another port", Some(&csrf), vec![("Origin", &other_port)]),
        ("another host", Some(&csrf), vec![("Origin", &other_host)]),
        ("Origin null", Some(&csrf), vec![("Origin", "null")]),
        (
            "Sec-Fetch-Site: cross-site",
            Some(&csrf),
            vec![("Sec-Fetch-Site", "cross-site")],
        ),
        (
            "Sec-Fetch-Site: same-site",
            Some(&csrf),
            vec![("Sec-Fetch-Site", "same-site")],
        ),
    ];
    for (case, token, headers) in cases {
        assert_refused(&set(token, "r", &headers), 403, case);
        assert!(operator_transitions(&db).is_empty(), "{case}: nothing set");
    }
    // A reason is required.
    for reason in ["", "   "] {
        assert_refused(&set(Some(&csrf), reason, &[]), 400, "an empty reason");
    }
    assert!(operator_transitions(&db).is_empty());

    // The same request from the console's own page goes through.
    let origin = console.origin();
    let done = set(
        Some(&csrf),
        "the customer called to cancel",
        &[("Origin", &origin), ("Sec-Fetch-Site", "same-origin")],
    );
    let back = done.location();
    assert_eq!(
        (done.status, back.split('?').next().unwrap()),
        (303, path.trim_end_matches("/status")),
        "{done:?}"
    );
    assert_eq!(
        operator_transitions(&db),
        vec![vec![
            Some("ord_console_1".to_owned()),
            Some("cancelled".to_owned()),
            Some(OPERATOR.to_owned()),
            Some("the customer called to cancel".to_owned()),
        ]]
    );
    let order = console.get(&back);
    assert_session_page(&order, "the order after set-status");
    assert!(order.has_id("notice"), "{}", order.body);
    let transitions = order.text_of("transitions");
    assert!(
        transitions.contains(OPERATOR) && transitions.contains("the customer called to cancel"),
        "{transitions}"
    );
    assert!(order.text_of_h1().contains("ord_console_1"));
}

/// An event id is the provider's text (a Midtrans id is made of the order id): one with a
/// slash, a query, a fragment, a percent sign, markup and a bidi override is listed, inert, and
/// its link leads to its own page.
#[test]
fn an_event_id_of_any_characters_is_inert_and_its_link_opens_its_page() {
    let server = serve_console();
    let hostile = "evt_a/b?c=1&d#e%2F f<i id=\"pwn-evt\">\u{202e}x";
    deliver(
        &server,
        &succeeded(hostile, "ord_console_evt", "ana@example.com", "Order"),
    );
    let console = Console::logged_in(server.port);
    let events = console.get("/console/events");
    assert_session_page(&events, "the events list");
    assert!(!events.has_id("pwn-evt"), "{}", events.body);
    let links: Vec<String> = events
        .tags()
        .into_iter()
        .filter(|t| t.name == "a" && t.has_class("event-link"))
        .filter_map(|t| t.attr("href").map(str::to_owned))
        .collect();
    assert_eq!(links.len(), 1, "{links:?}");
    let link = &links[0];
    assert!(
        link.starts_with("/console/events/stripe/")
            && !link.contains(['?', '#', ' ', '<', '"', '\u{202e}'])
            && link.matches('/').count() == 4,
        "the id percent-encoded, one path segment: {link:?}"
    );
    let event = console.get(link);
    assert_session_page(&event, "the hostile event id's page");
    assert!(!event.has_id("pwn-evt"), "{}", event.body);
    let shown = hostile.replace('\u{202e}', r"\u{202e}");
    assert!(
        event.text_of_h1().contains(&shown),
        "the id in <h1> as {shown}: {}",
        event.text_of_h1()
    );
    assert_eq!(
        console
            .get(&format!("/console/events/stripe/{}", segment(hostile)))
            .text_of_h1(),
        event.text_of_h1()
    );
}

/// A provider's ids may be "." or "..", which a browser takes as steps of the link's path (and
/// so does ureq here), or start with the `~` that marks those: every link still opens the page
/// of its own id, and the order page's form sets that order's status.
#[test]
fn ids_that_are_path_steps_link_to_their_own_pages() {
    let server = serve_console();
    let db = server.db().clone();
    for (event_id, order_id) in [("..", "."), ("~evt", "~ord"), (".", "..")] {
        deliver(
            &server,
            &succeeded(event_id, order_id, "ana@example.com", "Order"),
        );
    }
    let console = Console::logged_in(server.port);
    let events = console.get("/console/events");
    let links: Vec<(String, String)> = events
        .tags()
        .into_iter()
        .filter(|t| t.name == "a")
        .filter_map(|t| {
            let href = t.attr("href")?.to_owned();
            let text = decode(inner_html(&events.body, &t));
            (href.starts_with("/console/events/stripe/") || href.starts_with("/console/orders/"))
                .then_some((href, text))
        })
        .collect();
    assert_eq!(links.len(), 6, "{links:?}");
    for (href, id) in &links {
        let page = console.get(href);
        assert_session_page(&page, href);
        let kind = if href.starts_with("/console/orders/") {
            "Order"
        } else {
            "Event"
        };
        assert_eq!(page.text_of_h1(), format!("{kind} {id}"), "{href}");
    }
    let order = console.get(
        &links
            .iter()
            .find(|(href, id)| href.starts_with("/console/orders/") && id == "..")
            .unwrap()
            .0,
    );
    let action = order
        .tags()
        .into_iter()
        .find(|t| t.name == "form" && t.attr("id") == Some("set-status"))
        .and_then(|t| t.attr("action").map(str::to_owned))
        .unwrap();
    let set = console.post(
        &action,
        &[
            ("status", "cancelled"),
            ("reason", "a test"),
            ("csrf", &console.csrf()),
        ],
        &[],
    );
    assert_eq!(set.status, 303, "{set:?}");
    assert_eq!(
        operator_transitions(&db),
        [vec![
            Some("..".to_owned()),
            Some("cancelled".to_owned()),
            Some(OPERATOR.to_owned()),
            Some("a test".to_owned()),
        ]]
    );
}

#[test]
fn hostile_text_from_outside_is_inert_and_escaped_in_the_html() {
    let server = serve_console();
    let db = server.db().clone();
    let description = hostile_description();
    let payload = succeeded(
        "evt_console_hostile",
        "ord_console_h",
        "ana@example.com",
        &description,
    );
    deliver(&server, &payload);
    deliver(
        &server,
        &succeeded(
            "evt_console_hostile_id",
            HOSTILE_ORDER,
            "bo@example.com",
            "Order",
        ),
    );
    // A hostile last error on an email and on a forward (as a downstream API could answer).
    let last_error = "answered 422: <b id=\"pwn-email\">bounced</b> \u{202e}gnp \u{1b}[31m";
    let email = the_id(&db, "SELECT min(id) FROM email_outbox");
    let forward = the_id(&db, "SELECT min(id) FROM forward_outbox");
    db.execute(&format!(
        "UPDATE email_outbox SET status = 'dead', next_attempt_at = NULL, last_error = {e} WHERE id = {email};
         UPDATE forward_outbox SET status = 'dead', next_attempt_at = NULL, last_error = {e} WHERE id = {forward}",
        e = sql_text(last_error)
    ));
    let console = Console::logged_in(server.port);

    let event = console.get("/console/events/stripe/evt_console_hostile");
    assert_session_page(&event, "the hostile event");
    assert!(event.text_of_h1().contains("evt_console_hostile"));
    let pre = event
        .by_id("payload")
        .unwrap_or_else(|| panic!("no #payload: {}", event.body));
    assert_eq!(pre.name, "pre");
    let inner = inner_html(&event.body, &pre);
    assert!(
        !inner.contains('<'),
        "no markup in the payload's <pre>: {inner}"
    );
    assert!(inner.contains("&lt;script&gt;"), "{inner}");
    assert!(decode(inner).contains(HOSTILE_SCRIPT), "{inner}");
    assert!(inner.contains("&lt;img src=x onerror="), "{inner}");
    for escaped in [r"\u202e", r"\u001b", r"\u0007", r"\u200b"] {
        assert!(inner.contains(escaped), "{escaped} in the payload: {inner}");
    }
    let shown: Value = serde_json::from_str(&decode(inner))
        .unwrap_or_else(|e| panic!("the payload shown is JSON ({e}): {inner}"));
    assert_eq!(shown, serde_json::from_str::<Value>(&payload).unwrap());
    assert!(
        decode(inner).lines().count() > 10,
        "pretty-printed, one member a line: {inner}"
    );

    // The hostile order id: in the events list, its event, its order's page (by its link).
    let events = console.get("/console/events");
    assert_session_page(&events, "the events list");
    let hostile_event = console.get("/console/events/stripe/evt_console_hostile_id");
    assert_session_page(&hostile_event, "the event of the hostile order id");
    let order_link = hostile_event
        .by_id("order-link")
        .unwrap_or_else(|| panic!("no #order-link: {}", hostile_event.body));
    let href = order_link.attr("href").unwrap().to_owned();
    assert!(
        href.starts_with("/console/orders/")
            && !href.contains(['<', '>', '"', ' ', '\u{202e}', '\u{1b}']),
        "the order link, percent-encoded: {href:?}"
    );
    let order = console.get(&href);
    assert_session_page(&order, "the hostile order");
    let by_our_encoding = console.get(&format!("/console/orders/{}", segment(HOSTILE_ORDER)));
    assert_session_page(
        &by_our_encoding,
        "the hostile order, its id percent-encoded",
    );
    assert_eq!(by_our_encoding.text_of_h1(), order.text_of_h1());
    for page in [&events, &hostile_event, &order] {
        assert!(
            !page.has_id("pwn-order"),
            "markup from the order id: {}",
            page.body
        );
    }
    assert!(
        order.text_of_h1().contains(&hostile_order_shown()),
        "the order id in <h1>, escaped as {}: {}",
        hostile_order_shown(),
        order.body
    );

    // The last errors on the outbox page.
    let outbox = console.get("/console/outbox");
    assert_session_page(&outbox, "the outbox");
    assert!(!outbox.has_id("pwn-email"), "{}", outbox.body);
    for (kind, id) in [("email", email), ("forward", forward)] {
        let row = outbox.text_of(&format!("{kind}-{id}"));
        assert!(
            row.contains("<b id=\"pwn-email\">bounced</b>")
                && row.contains(r"\u{202e}gnp \u{1b}[31m"),
            "{kind} {id}'s last error shown as text, escaped: {row}"
        );
    }
}

#[test]
fn the_outbox_page_lists_dead_and_pending_rows_newest_first_and_retries_and_skips_them() {
    let server = serve_console();
    let db = server.db().clone();
    for i in 1..=3 {
        deliver(
            &server,
            &succeeded(
                &format!("evt_console_ob{i}"),
                &format!("ord_console_ob{i}"),
                &format!("c{i}@example.com"),
                "Order",
            ),
        );
    }
    let emails = db.texts("SELECT id FROM email_outbox ORDER BY id");
    let forwards = db.texts("SELECT id FROM forward_outbox ORDER BY id");
    assert_eq!((emails.len(), forwards.len()), (3, 3));
    let (e1, e2, e3) = (&emails[0], &emails[1], &emails[2]);
    let (f1, f2, f3) = (&forwards[0], &forwards[1], &forwards[2]);
    db.execute(&format!(
        "UPDATE email_outbox SET status = 'dead', attempts = 5, next_attempt_at = NULL, last_error = 'gave up' WHERE id = {e1};
         UPDATE email_outbox SET status = 'sent', sent_at = created_at WHERE id = {e3};
         UPDATE forward_outbox SET status = 'dead', attempts = 1, next_attempt_at = NULL, last_error = 'answered 410' WHERE id = {f1}"
    ));
    let console = Console::logged_in(server.port);
    let outbox = console.get("/console/outbox");
    assert_session_page(&outbox, "the outbox");
    let at = |id: &str| {
        outbox
            .by_id(id)
            .unwrap_or_else(|| panic!("no #{id}: {}", outbox.body))
            .start
    };
    // Dead and pending rows, newest first; a sent row not at all.
    assert!(at(&format!("email-{e2}")) < at(&format!("email-{e1}")));
    assert!(
        !outbox.has_id(&format!("email-{e3}")),
        "a sent row is not listed"
    );
    assert!(at(&format!("forward-{f3}")) < at(&format!("forward-{f2}")));
    assert!(at(&format!("forward-{f2}")) < at(&format!("forward-{f1}")));
    assert!(outbox.text_of(&format!("email-{e1}")).contains("dead"));
    assert!(outbox.text_of(&format!("email-{e2}")).contains("pending"));
    for (kind, id) in [
        ("email", e1),
        ("email", e2),
        ("forward", f1),
        ("forward", f2),
    ] {
        let row = outbox.by_id(&format!("{kind}-{id}")).unwrap();
        assert_eq!(row.name, "tr");
        let inside = tags(inner_html(&outbox.body, &row));
        for action in ["retry", "skip"] {
            assert!(
                inside.iter().any(|t| t.name == "form"
                    && t.has_class(action)
                    && t.attr("method").map(str::to_ascii_lowercase).as_deref() == Some("post")
                    && t.attr("action") == Some(&format!("/console/outbox/{kind}/{id}/{action}"))),
                "{kind} {id}: the {action} form: {}",
                inner_html(&outbox.body, &row)
            );
        }
    }
    let csrf = outbox.csrf();

    // Each action: 303 back to the outbox, whose notice says what happened.
    let act = |kind: &str, id: &str, action: &str, said: &[&str]| {
        let path = format!("/console/outbox/{kind}/{id}/{action}");
        let done = console.post(&path, &[("csrf", &csrf)], &[]);
        let location = done.location();
        assert_eq!(
            (done.status, location.split('?').next().unwrap()),
            (303, "/console/outbox"),
            "POST {path}: {done:?}"
        );
        let page = console.get(&location);
        assert_session_page(&page, "the outbox after an action");
        let notice = page.text_of("notice");
        for words in said {
            assert!(
                notice.contains(words),
                "POST {path}: {words:?} in {notice:?}"
            );
        }
    };
    act(
        "email",
        e1,
        "retry",
        &[&format!("email {e1}: dead -> pending")],
    );
    act("email", e2, "skip", &[&format!("email {e2}"), "skipped"]);
    act(
        "forward",
        f1,
        "skip",
        &[&format!("forward {f1}"), "skipped"],
    );
    act("forward", f2, "retry", &[&format!("forward {f2}: due now")]);
    let outbox = outbox_rows(&db);
    let row = |id: &str| &outbox[&id.parse::<i64>().unwrap()];
    assert_eq!(
        (row(e1)["status"].as_str(), row(e1)["attempts"].as_i64()),
        (Some("pending"), Some(0))
    );
    assert_eq!(row(e2)["status"], "skipped");
    let forwards = forward_rows(&db);
    let forward = |id: &str| &forwards[&id.parse::<i64>().unwrap()];
    assert_eq!(forward(f1)["status"], "skipped");
    assert_eq!(forward(f2)["status"], "pending");
    // A sent row can be neither retried nor skipped; an unknown one is not found.
    for path in [
        format!("/console/outbox/email/{e3}/retry"),
        format!("/console/outbox/email/{e3}/skip"),
        "/console/outbox/email/999999/retry".to_owned(),
        "/console/outbox/forward/999999/skip".to_owned(),
    ] {
        let page = console.post(&path, &[("csrf", &csrf)], &[]);
        assert!(page.status < 500, "POST {path}: {page:?}");
    }
    assert_eq!(
        outbox_rows(&db)[&e3.parse::<i64>().unwrap()]["status"],
        "sent"
    );
}

#[test]
fn the_events_list_is_newest_first_fifty_a_page_with_filters() {
    let server = serve_console();
    let agent = agent();
    let mut delivered = Vec::new();
    for i in 0..53 {
        let id = format!("evt_console_page_{i:02}");
        deliver(
            &server,
            &succeeded(
                &id,
                &format!("ord_console_page_{i:02}"),
                "ana@example.com",
                "Order",
            ),
        );
        delivered.push(id);
    }
    let ignored = String::from_utf8(fixture("stripe/customer.created.json")).unwrap();
    assert_eq!(
        deliver_stripe(&agent, server.port, ignored.as_bytes()),
        (200, "ignored".to_owned())
    );
    for name in ["pending", "settlement"] {
        let body = sign_midtrans(&fixture(&format!("midtrans/{name}.json")));
        let answer = agent
            .post(&format!(
                "http://127.0.0.1:{}/webhooks/midtrans",
                server.port
            ))
            .set("Content-Type", "application/json")
            .send_bytes(&body);
        assert_eq!(
            answer.map(|r| r.status()).ok(),
            Some(200),
            "midtrans {name}"
        );
    }
    let console = Console::logged_in(server.port);

    /// The event ids of a page's rows, and its `#older` link.
    fn rows(page: &Page) -> (Vec<String>, Option<String>) {
        let tags = page.tags();
        let mut ids = Vec::new();
        for row in tags
            .iter()
            .filter(|t| t.name == "tr" && t.has_class("event"))
        {
            let inside = tags_of(page, row);
            let link = inside
                .iter()
                .find(|t| t.name == "a" && t.has_class("event-link"))
                .unwrap_or_else(|| {
                    panic!(
                        "a row without its event link: {}",
                        inner_html(&page.body, row)
                    )
                });
            ids.push(link.attr("href").unwrap().to_owned());
        }
        let older = page
            .by_id("older")
            .map(|t| t.attr("href").unwrap().to_owned());
        (ids, older)
    }
    fn tags_of(page: &Page, tag: &Tag) -> Vec<Tag> {
        tags(inner_html(&page.body, tag))
    }

    let first = console.get("/console/events");
    assert_session_page(&first, "the events list");
    let filter = first
        .by_id("filter")
        .unwrap_or_else(|| panic!("no #filter: {}", first.body));
    assert_eq!(filter.name, "form");
    assert_ne!(
        filter
            .attr("method")
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("post"),
        "the filter is a GET form"
    );
    let fields: Vec<String> = tags_of(&first, &filter)
        .into_iter()
        .filter_map(|t| t.attr("name").map(str::to_owned))
        .collect();
    for field in ["provider", "outcome", "type", "since", "until"] {
        assert!(
            fields.iter().any(|f| f == field),
            "#filter has {field}: {fields:?}"
        );
    }
    assert!(
        !fields.iter().any(|f| f == "csrf"),
        "no CSRF token in a GET form (it would land in URLs and logs): {fields:?}"
    );
    let (page1, older) = rows(&first);
    assert_eq!(page1.len(), 50, "fifty a page");
    // Newest first: the last delivered (Midtrans's settlement) first, then its pending.
    assert!(
        page1[0].starts_with("/console/events/midtrans/"),
        "{page1:?}"
    );
    assert!(
        page1[2].ends_with("/evt_1QA0011customercreate"),
        "{page1:?}"
    );
    assert!(page1[3].ends_with("/evt_console_page_52"), "{page1:?}");
    assert!(page1[49].ends_with("/evt_console_page_06"), "{page1:?}");
    let older = older.expect("an #older link");
    assert!(older.contains("before="), "{older}");
    let second = console.get(&older);
    assert_session_page(&second, "the older events");
    let (page2, none) = rows(&second);
    assert_eq!(page2.len(), 6, "{page2:?}");
    assert!(page2[0].ends_with("/evt_console_page_05"), "{page2:?}");
    assert!(page2[5].ends_with("/evt_console_page_00"), "{page2:?}");
    assert!(none.is_none(), "no #older on the last page");

    // Each link opens its event (a Midtrans id has colons).
    for link in [&page1[0], &page1[3]] {
        let event = console.get(link);
        assert_session_page(&event, link);
        assert!(event.has_id("payload"));
    }

    let count = |query: &str| {
        let page = console.get(&format!("/console/events?{query}"));
        assert_session_page(&page, query);
        let (ids, older) = rows(&page);
        (ids.len(), older.is_some())
    };
    let soon =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(3600))
            .to_string();
    let in_an_hour = &soon[..16]; // YYYY-MM-DDTHH:MM
    assert_eq!(count("provider=midtrans"), (2, false));
    assert_eq!(count("provider=stripe"), (50, true));
    // The older page keeps the filter: 53 paid and 1 ignored Stripe events, 50 then 4.
    let stripe = console.get("/console/events?provider=stripe");
    let older = rows(&stripe).1.expect("an #older link");
    let (rest, none) = rows(&console.get(&older));
    assert_eq!((rest.len(), none), (4, None), "{older}: {rest:?}");
    assert!(rest
        .iter()
        .all(|l| l.starts_with("/console/events/stripe/")));
    assert_eq!(count("outcome=ignored"), (1, false));
    assert_eq!(count("type=payment_intent.succeeded"), (50, true));
    assert_eq!(count("type=settlement&provider=midtrans"), (1, false));
    assert_eq!(count("since=1h"), (50, true));
    assert_eq!(count("since=30m&provider=midtrans"), (2, false));
    assert_eq!(count(&format!("since={in_an_hour}")), (0, false));
    assert_eq!(count("until=2000-01-01T00%3A00"), (0, false));
    assert_eq!(
        count(&format!(
            "until={}&provider=midtrans",
            in_an_hour.replace(':', "%3A")
        )),
        (2, false)
    );
    assert_eq!(
        count("provider=&outcome=&type=&since=&until="),
        (50, true),
        "empty fields filter nothing"
    );
}

// ---------------------------------------------------------------------------------------------
// In a real browser
// ---------------------------------------------------------------------------------------------

/// `name` on the PATH, if it is there.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// Chromium and chromedriver, when they and Python's selenium are installed. Without them the
/// test says so and is skipped, unless SEKALI_REQUIRE_BROWSER=1 (as .ci/test sets): then it fails.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let chromium = on_path("chromium");
    let chromedriver = on_path("chromedriver");
    let selenium = Command::new("python3")
        .args(["-c", "import selenium"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let mut missing = Vec::new();
    if chromium.is_none() {
        missing.push("chromium");
    }
    if chromedriver.is_none() {
        missing.push("chromedriver");
    }
    if !selenium {
        missing.push("selenium (python3 -c 'import selenium')");
    }
    if missing.is_empty() {
        return Some((chromium.unwrap(), chromedriver.unwrap()));
    }
    if std::env::var_os("SEKALI_REQUIRE_BROWSER").is_none() {
        println!(
            "skipped: no {}; apt-get install chromium chromium-driver, pip install selenium, or run .ci/test",
            missing.join(", no ")
        );
        return None;
    }
    panic!(
        "SEKALI_REQUIRE_BROWSER is set but the browser test cannot run: no {}",
        missing.join(", no ")
    );
}

/// An HTTP email API (POST, JSON) that refuses a `bounce-*` recipient's first try of each key
/// with a 422 carrying hostile text, and accepts everything else: what it got, (key, to).
struct EmailApi {
    url: String,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl EmailApi {
    fn start() -> EmailApi {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/emails", listener.local_addr().unwrap());
        let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let shared = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let seen = shared.clone();
                std::thread::spawn(move || {
                    let _ = EmailApi::answer(stream, &seen);
                });
            }
        });
        EmailApi { url, seen }
    }

    fn answer(
        stream: std::net::TcpStream,
        seen: &Mutex<Vec<(String, String)>>,
    ) -> std::io::Result<()> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut headers = HashMap::new();
        let mut line = String::new();
        reader.read_line(&mut line)?; // the request line
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
            }
        }
        let length: usize = headers
            .get("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let email: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let to = email["to"][0].as_str().unwrap_or("").to_owned();
        let key = headers.get("idempotency-key").cloned().unwrap_or_default();
        let attempt = {
            let mut seen = seen.lock().unwrap();
            seen.push((key.clone(), to.clone()));
            seen.iter().filter(|(k, _)| *k == key).count()
        };
        let (status, text) = if to.starts_with("bounce") && attempt == 1 {
            (
                "422 Unprocessable Entity",
                "<b id=\"pwn-email\">bounced</b> \u{202e}gnp.exe \u{1b}[31m".to_owned(),
            )
        } else {
            ("200 OK", format!("{{\"id\":\"email_{attempt}\"}}"))
        };
        let mut stream = stream;
        write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
            text.len()
        )?;
        stream.flush()
    }

    fn tries_to(&self, to: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, t)| t == to)
            .count()
    }
}

/// tests/support/forward_receiver.py, the shop's endpoint, refusing (410) the changes `refuse`
/// (`ORDER_ID:SEQUENCE`).
struct Receiver {
    child: Child,
    port: u16,
}

impl Receiver {
    fn start(secret: &str, log: &Path, refuse: &[&str]) -> Receiver {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/forward_receiver.py");
        let mut command = Command::new("python3");
        command
            .arg(script)
            .arg(secret)
            .arg("0")
            .arg(log)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for change in refuse {
            command.arg("--refuse").arg(change);
        }
        let mut child = command
            .spawn()
            .expect("python3 (with the standardwebhooks package) runs the receiver");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the receiver printed no port: {line:?}"));
        Receiver { child, port }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `ready`, at most `within`.
fn wait_until(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Where the screenshots go: `target/console-screenshots/<engine>/` (under CARGO_TARGET_DIR when
/// it is set), emptied first.
fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let engine = match engine() {
        Engine::Sqlite => "sqlite",
        Engine::Postgres => "postgres",
    };
    let dir = target.join("console-screenshots").join(engine);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An operator, in headless Chromium: logs in (a wrong token first), finds the delivery of a
/// moment before, opens it (its hostile payload inert) and its order's story, sets the order's
/// status, retries a dead email and sees it sent, skips a dead forward; and fails to do any of it
/// without a session, with a stale CSRF token, or from another origin. The script checks each
/// page; this test sets the state up and checks the database afterwards.
#[test]
fn an_operator_works_through_the_console_in_a_real_browser() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let started = Instant::now();
    let email_api = EmailApi::start();
    let secret = sekali::forward::new_secret().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (order_a, order_b) = ("ord_console_a", "ord_console_b");
    let receiver = Receiver::start(
        &secret,
        &dir.path().join("forwarded.log"),
        &[&format!("{order_a}:1"), &format!("{order_b}:1")],
    );
    let forward_url = format!("http://127.0.0.1:{}/hooks/sekali", receiver.port);
    let server = serve(
        Some(&console_tokens()),
        Some(&api_tokens()),
        &[
            ("SEKALI_MAIL_API_URL", email_api.url.as_str()),
            ("SEKALI_MAIL_API_KEY", "re_test_console"),
            ("SEKALI_FORWARD_URL", forward_url.as_str()),
            ("SEKALI_FORWARD_SECRET", secret.as_str()),
        ],
        &[],
    );
    let db = server.db().clone();

    // Two orders whose receipts bounce (dead at the API's 422) and whose first change the shop
    // refuses (dead at its 410): A's are retried and skipped, B's are what every refused attempt
    // aims at.
    for (order, email) in [
        (order_a, "bounce-a@example.com"),
        (order_b, "bounce-b@example.com"),
    ] {
        deliver(
            &server,
            &succeeded(&format!("evt_{order}"), order, email, "Order"),
        );
    }
    let id_of = |table: &str, order: &str| {
        the_id(
            &db,
            &format!(
                "SELECT min(id) FROM {table} WHERE order_id = {}",
                sql_text(order)
            ),
        )
    };
    let status_of = |table: &str, id: i64| {
        db.texts(&format!("SELECT status FROM {table} WHERE id = {id}"))
            .pop()
            .unwrap_or_default()
    };
    let (email_a, email_b) = (
        id_of("email_outbox", order_a),
        id_of("email_outbox", order_b),
    );
    let (forward_a, forward_b) = (
        id_of("forward_outbox", order_a),
        id_of("forward_outbox", order_b),
    );
    wait_until(
        "the bounced emails and refused forwards to be dead",
        Duration::from_secs(20),
        || {
            status_of("email_outbox", email_a) == "dead"
                && status_of("email_outbox", email_b) == "dead"
                && status_of("forward_outbox", forward_a) == "dead"
                && status_of("forward_outbox", forward_b) == "dead"
        },
    );

    // The story's order, created through the API with hostile metadata; a forged delivery (a
    // refusal for the overview); an event of a hostile order id; then the delivery of a moment
    // before.
    let story_order = "ord_console_story";
    let metadata_marker = "note-7f3";
    let created = agent()
        .post(&format!("http://127.0.0.1:{}/orders", server.port))
        .set("Authorization", &format!("Bearer {API_TOKEN}"))
        .set("Idempotency-Key", "console-story")
        .set("Content-Type", "application/json")
        .send_string(
            &json!({
                "order_id": story_order,
                "amount": 2500,
                "currency": "usd",
                "provider": "stripe",
                "metadata": {"note": format!("<img id=\"pwn-meta\" src=x onerror=\"window.__pwned=1\">{metadata_marker}\u{202e}\u{1b}[0m")},
            })
            .to_string(),
        );
    assert_eq!(created.map(|r| r.status()).ok(), Some(201), "POST /orders");
    let forged = agent()
        .post(&format!("http://127.0.0.1:{}/webhooks/stripe", server.port))
        .set("Stripe-Signature", "t=1,v1=00")
        .send_bytes(&fixture("stripe/payment_intent.succeeded.json"));
    assert!(
        matches!(forged, Err(ureq::Error::Status(401, _))),
        "{forged:?}"
    );
    deliver(
        &server,
        &succeeded(
            "evt_console_hostile_id",
            HOSTILE_ORDER,
            "bo@example.com",
            "Order",
        ),
    );
    let story_event = "evt_console_story";
    let payload = succeeded(
        story_event,
        story_order,
        "story@example.com",
        &hostile_description(),
    );
    deliver(&server, &payload);

    let shots = screenshot_dir();
    let config = json!({
        "chromium": chromium,
        "chromedriver": chromedriver,
        "base": server.base_url(),
        "token": CONSOLE_TOKEN,
        "wrong_token": API_TOKEN,
        "operator": OPERATOR,
        "shots": shots,
        "story": {"provider": "stripe", "event_id": story_event, "order_id": story_order, "payload": payload},
        "visible": [HOSTILE_SCRIPT, serde_json::to_string(HOSTILE_IMG).unwrap().trim_matches('"'), r"\u202e", r"\u001b"],
        "raw_forbidden": RAW_FORBIDDEN.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        "metadata_marker": metadata_marker,
        "hostile_order": {"event_id": "evt_console_hostile_id", "order_id": HOSTILE_ORDER, "shown": hostile_order_shown()},
        "email_error_marker": "bounced",
        "set_status": {"status": "cancelled", "other_status": "paid", "reason": "customer asked to cancel, ticket 88"},
        "retry_email": {"id": email_a, "order_id": order_a},
        "guard_email": {"id": email_b, "order_id": order_b},
        "skip_forward": {"id": forward_a, "order_id": order_a},
        "guard_forward": {"id": forward_b, "order_id": order_b},
    });
    let config_path = dir.path().join("console.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/console_browser.py");
    let (status, stdout, stderr) = run_with_deadline(
        Command::new("python3").arg(&script).arg(&config_path),
        Duration::from_secs(120),
    );
    print!("{stdout}");
    assert!(
        status == Some(true) && stdout.trim_end().ends_with("done"),
        "the browser's checks failed (screenshots in {}):\n{stdout}\n{stderr}",
        shots.display()
    );

    // What the browser did, as the CLI sees it: the retried email sent (the API took its second
    // try), the skipped forward skipped; the rows every refused attempt aimed at unchanged.
    let outbox = outbox_rows(&db);
    assert_eq!(outbox[&email_a]["status"], "sent", "{}", outbox[&email_a]);
    assert_eq!(email_api.tries_to("bounce-a@example.com"), 2);
    assert_eq!(
        (
            outbox[&email_b]["status"].as_str(),
            outbox[&email_b]["attempts"].as_i64()
        ),
        (Some("dead"), Some(1)),
        "{}",
        outbox[&email_b]
    );
    assert_eq!(email_api.tries_to("bounce-b@example.com"), 1);
    let forwards = forward_rows(&db);
    assert_eq!(
        forwards[&forward_a]["status"], "skipped",
        "{}",
        forwards[&forward_a]
    );
    assert_eq!(
        forwards[&forward_b]["status"], "dead",
        "{}",
        forwards[&forward_b]
    );
    assert_eq!(
        operator_transitions(&db),
        vec![vec![
            Some(story_order.to_owned()),
            Some("cancelled".to_owned()),
            Some(OPERATOR.to_owned()),
            Some("customer asked to cancel, ticket 88".to_owned()),
        ]],
        "one set-status, the operator's; none of the refused ones"
    );
    for view in [
        "login",
        "overview",
        "events",
        "event",
        "order",
        "outbox",
        "refused-stale-csrf",
    ] {
        assert!(
            shots.join(format!("{view}.png")).is_file(),
            "a screenshot of {view}"
        );
    }
    println!("the browser test took {:?}", started.elapsed());
    drop(server);
    drop(receiver);
}

/// Runs `command` (stdout and stderr captured) for at most `within`, killing it then: whether it
/// succeeded (`None`: killed), and its output.
fn run_with_deadline(command: &mut Command, within: Duration) -> (Option<bool>, String, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status.success());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, stdout.join().unwrap(), stderr.join().unwrap())
}
