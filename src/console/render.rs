//! The console's pages: minijinja templates compiled into the binary, every value from outside
//! written as inert text, and the headers that keep a page to itself.

use std::sync::OnceLock;

use actix_web::http::{header, StatusCode};
use actix_web::HttpResponse;
use minijinja::{Environment, Value};

use crate::domain::text::{escaped_block, escaped_json};

const TEMPLATES: [(&str, &str); 9] = [
    ("base.html", include_str!("templates/base.html")),
    ("login.html", include_str!("templates/login.html")),
    ("error.html", include_str!("templates/error.html")),
    ("overview.html", include_str!("templates/overview.html")),
    ("events.html", include_str!("templates/events.html")),
    ("event.html", include_str!("templates/event.html")),
    ("order.html", include_str!("templates/order.html")),
    ("outbox.html", include_str!("templates/outbox.html")),
    ("macros.html", include_str!("templates/macros.html")),
];

/// The stylesheet, served from `/console/static/console.css`: no asset comes from elsewhere.
pub const STYLESHEET: &str = include_str!("templates/console.css");

/// Only this server's stylesheet and forms; no script, image, frame or plugin from anywhere,
/// and no page may frame the console.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; \
    form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Writes every value as text that cannot act: first each character a browser would draw as
/// nothing or that reorders the text around it (control characters but line breaks and tabs,
/// bidi overrides, zero-width characters) is written as an escape (`\u{202e}`), then the
/// result is HTML-escaped. Templates have no `|safe`: nothing from outside reaches the page as
/// markup.
fn inert(
    out: &mut minijinja::Output<'_>,
    state: &minijinja::State<'_, '_>,
    value: &Value,
) -> Result<(), minijinja::Error> {
    if value.is_undefined() || value.is_none() {
        return Ok(());
    }
    if value.is_safe() {
        // A macro's output: markup these templates wrote, its values already through here.
        return minijinja::escape_formatter(out, state, value);
    }
    let text = match value.as_str() {
        Some(text) => escaped_block(text),
        None => escaped_block(&value.to_string()),
    };
    minijinja::escape_formatter(out, state, &Value::from(text))
}

/// JSON text pretty-printed for reading, reformatted as text (not parsed into values and
/// written again), so duplicate keys, key order and long numbers show as the provider sent
/// them; every character of [`escaped_json`] written as a JSON `\u` escape (the same JSON).
/// Text that is not JSON shows as it came, escaped.
pub fn pretty_json(text: &str) -> String {
    match jsonxf::pretty_print(text) {
        Ok(pretty) => escaped_json(pretty.trim_end()),
        Err(_) => text.to_owned(),
    }
}

fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::Html);
        env.set_formatter(inert);
        env.add_filter("pretty_json", |text: &str| pretty_json(text));
        for (name, source) in TEMPLATES {
            env.add_template(name, source)
                .unwrap_or_else(|e| panic!("console template {name}: {e}"));
        }
        env
    })
}

/// A page with the console's headers: its policy, no caching (pages show customers' data), no
/// sniffing, no referrer to other sites (URLs carry order ids).
pub fn page(status: StatusCode, template: &str, context: Value) -> HttpResponse {
    match environment()
        .get_template(template)
        .and_then(|t| t.render(context))
    {
        Ok(html) => with_headers(HttpResponse::build(status))
            .content_type("text/html; charset=utf-8")
            .body(html),
        Err(e) => {
            tracing::error!(template, error = %e, "console page failed to render");
            with_headers(HttpResponse::InternalServerError())
                .content_type("text/plain; charset=utf-8")
                .body("the console could not render this page; the log says why")
        }
    }
}

/// The headers every console answer carries.
const HEADERS: [(header::HeaderName, &str); 5] = [
    (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::CACHE_CONTROL, "no-store"),
    // same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with its
    // form posts, which the origin check must refuse.
    (header::REFERRER_POLICY, "same-origin"),
    (header::X_FRAME_OPTIONS, "DENY"),
];

/// `builder` with the headers every console answer carries.
pub fn with_headers(mut builder: actix_web::HttpResponseBuilder) -> actix_web::HttpResponseBuilder {
    for header in HEADERS {
        builder.insert_header(header);
    }
    builder
}

/// The same headers on every answer of the console's scope that lacks them: those actix
/// writes itself, when an extractor refuses a request before any handler runs.
pub fn default_headers() -> actix_web::middleware::DefaultHeaders {
    HEADERS.into_iter().fold(
        actix_web::middleware::DefaultHeaders::new(),
        |headers, header| headers.add(header),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_compiles_and_hostile_text_renders_inert() {
        let html = environment()
            .get_template("error.html")
            .unwrap()
            .render(minijinja::context! {
                title => "x",
                message => "<script>alert(1)</script>\u{202e}\u{1b}[31m",
                operator => None::<String>,
                csrf => "",
                notice => None::<String>,
            })
            .unwrap();
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
            "{html}"
        );
        assert!(html.contains(r"\u{202e}\u{1b}[31m"), "{html}");
        assert!(!html.contains('\u{202e}') && !html.contains('\u{1b}'));
    }

    #[test]
    fn a_payload_is_pretty_json_with_its_invisible_characters_escaped() {
        let pretty = pretty_json("{\"a\":\"x\u{202e}y\\u001b\"}");
        assert_eq!(pretty, "{\n  \"a\": \"x\\u202ey\\u001b\"\n}");
    }

    #[test]
    fn a_payload_keeps_its_duplicate_keys_their_order_and_long_numbers() {
        let pretty = pretty_json(r#"{"z":1,"amount":1,"amount":100,"n":123456789012345678901234}"#);
        assert_eq!(
            pretty,
            "{\n  \"z\": 1,\n  \"amount\": 1,\n  \"amount\": 100,\n  \"n\": 123456789012345678901234\n}"
        );
    }
}
