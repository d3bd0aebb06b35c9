//! Customer emails: rendering outbox rows, and the transports that deliver them.

pub mod eml;
pub mod transport;

use minijinja::{context, Environment};

use crate::domain::{money, EmailAddress};
use crate::store::ClaimedEmail;

/// A rendered email, ready for any transport.
#[derive(Debug, Clone)]
pub struct RenderedEmail {
    pub from: String,
    pub to: String,
    pub subject: String,
    pub text: String,
    pub html: String,
    /// The outbox row's key: the file name, the `Idempotency-Key` header, the Message-ID's
    /// local part. The same on every attempt, so a downstream can recognise a resend.
    pub idempotency_key: String,
    /// `<idempotency-key@sending-domain>`.
    pub message_id: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("the row's params are not the JSON sekali writes: {0}")]
    Params(String),
    #[error("template {0}: {1}")]
    Template(String, String),
    #[error("recipient address: {0}")]
    Recipient(String),
}

/// The templates, parsed once per process.
fn environment() -> &'static Environment<'static> {
    static ENVIRONMENT: std::sync::OnceLock<Environment<'static>> = std::sync::OnceLock::new();
    ENVIRONMENT.get_or_init(build_environment)
}

fn build_environment() -> Environment<'static> {
    let mut env = Environment::new();
    // Templates live in the source tree and are compiled into the binary.
    for (name, source) in [
        ("receipt.txt", include_str!("templates/receipt.txt")),
        ("receipt.html", include_str!("templates/receipt.html")),
        (
            "payment_failed.txt",
            include_str!("templates/payment_failed.txt"),
        ),
        (
            "payment_failed.html",
            include_str!("templates/payment_failed.html"),
        ),
        (
            "refund_notice.txt",
            include_str!("templates/refund_notice.txt"),
        ),
        (
            "refund_notice.html",
            include_str!("templates/refund_notice.html"),
        ),
    ] {
        env.add_template(name, source)
            .expect("the built-in templates parse");
    }
    env
}

/// Indonesian when the order says so (`metadata.locale`) or, failing that, when it is in
/// rupiah; English otherwise.
pub fn locale_for(metadata_locale: Option<&str>, currency: Option<&str>) -> &'static str {
    match metadata_locale.map(|l| l.to_ascii_lowercase()) {
        Some(l) if l == "id" || l.starts_with("id-") || l.starts_with("id_") => "id",
        Some(l) if l == "en" || l.starts_with("en-") || l.starts_with("en_") => "en",
        _ if currency.is_some_and(|c| c.eq_ignore_ascii_case("idr")) => "id",
        _ => "en",
    }
}

/// The subject line, without control characters (C0, DEL and C1, NEL U+0085 among them) or the
/// Unicode line and paragraph separators (U+2028, U+2029, which are not control characters but
/// are line breaks): an order id from a webhook is whatever the shop's metadata held, and a line
/// break in a subject is a header of its own to some APIs.
fn subject(template: &str, locale: &str, order_id: &str) -> String {
    let order_id: String = order_id
        .chars()
        .filter(|&c| !c.is_control() && !matches!(c, '\u{2028}' | '\u{2029}'))
        .collect();
    match (template, locale) {
        ("receipt", "id") => format!("Pembayaran diterima untuk pesanan {order_id}"),
        ("receipt", _) => format!("Payment received for order {order_id}"),
        ("payment_failed", "id") => format!("Pembayaran gagal untuk pesanan {order_id}"),
        ("payment_failed", _) => format!("Payment failed for order {order_id}"),
        ("refund_notice", "id") => format!("Pengembalian dana untuk pesanan {order_id}"),
        (_, _) => format!("Refund for order {order_id}"),
    }
}

/// Who the emails are from, parsed once for all of them (parsing an address cost a sixth of
/// rendering an email).
#[derive(Debug, Clone)]
pub struct Sender {
    /// As configured: `shop@example.com` or `Toko Sari <shop@example.com>`.
    from: String,
    /// The address's domain: the Message-ID's.
    domain: String,
    /// Who signs the emails: the display name, or the domain when there is none.
    shop: String,
}

impl Sender {
    pub fn new(from: &str) -> Sender {
        // Checked at startup (`MailConfig::check`); a sender that does not parse keeps the
        // defaults.
        let mailbox = from.parse::<lettre::message::Mailbox>().ok();
        let domain = mailbox
            .as_ref()
            .map_or_else(|| "localhost".to_owned(), |m| m.email.domain().to_owned());
        let shop = mailbox
            .and_then(|m| m.name)
            .filter(|name| !name.trim().is_empty())
            .unwrap_or_else(|| domain.clone());
        Sender {
            from: from.to_owned(),
            domain,
            shop,
        }
    }
}

/// Renders a claimed outbox row, from `sender`: the Message-ID's domain is its address's
/// domain, and the emails are signed with its display name, or that domain when it has none.
pub fn render(email: &ClaimedEmail, sender: &Sender) -> Result<RenderedEmail, RenderError> {
    let params: serde_json::Value =
        serde_json::from_str(&email.params).map_err(|e| RenderError::Params(e.to_string()))?;
    let to = email
        .recipient
        .as_deref()
        .map(EmailAddress::parse)
        .transpose()
        .map_err(|e| RenderError::Recipient(e.to_string()))?
        .ok_or_else(|| RenderError::Recipient("no recipient".into()))?;
    let currency = params["currency"].as_str().unwrap_or("");
    let locale = locale_for(email.locale.as_deref(), Some(currency));
    // Rows of orders older than schema version 5 name no exponent: their amounts are in the
    // provider's minor units (`provider` is the event's, `operator` or `api` for changes made by
    // hand, which count in ISO 4217's).
    let exponent_of = |currency: &str| {
        params["exponent"]
            .as_u64()
            .map(|e| e as u32)
            .unwrap_or_else(|| {
                crate::providers::amount_exponent(
                    params["provider"].as_str().unwrap_or(""),
                    currency,
                )
            })
    };
    let amount = params["amount"]
        .as_i64()
        .map(|a| money::format_amount(a, currency, exponent_of(currency), locale))
        .unwrap_or_default();
    let refunded_currency = params["refunded_currency"].as_str().unwrap_or(currency);
    let refunded_text = |minor: i64| {
        money::format_amount(
            minor,
            refunded_currency,
            exponent_of(refunded_currency),
            locale,
        )
    };
    // In all, and this time: a notice of the ledger tells the refund it is for and, after an
    // earlier one, the total; an older row names only the total.
    let total = params["refunded_amount"].as_i64().unwrap_or(0);
    let this_time = params["refund_amount"].as_i64().unwrap_or(total);
    let ctx = context! {
        locale => locale,
        order_id => email.order_id.as_str(),
        amount => amount,
        refunded => refunded_text(this_time),
        refunded_total => (this_time != total).then(|| refunded_text(total)),
        fully_refunded => params["status"].as_str() == Some("refunded"),
        shop => sender.shop.as_str(),
    };
    let env = environment();
    let render_one = |format: &str| {
        let name = format!("{}.{format}", email.template);
        env.get_template(&name)
            .and_then(|t| t.render(&ctx))
            .map_err(|e| RenderError::Template(name.clone(), e.to_string()))
    };
    let text = render_one("txt")?;
    let html = render_one("html")?;
    Ok(RenderedEmail {
        from: sender.from.clone(),
        to: to.to_string(),
        subject: subject(&email.template, locale, &email.order_id),
        text,
        html,
        idempotency_key: email.idempotency_key.clone(),
        message_id: format!("<{}@{}>", email.idempotency_key, sender.domain),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rupiah_receipt_renders_in_indonesian_as_text_and_html() {
        let email = ClaimedEmail {
            id: 1,
            order_id: "ORDER-2001".into(),
            recipient: Some("sari@example.com".into()),
            template: "receipt".into(),
            params: r#"{"order_id":"ORDER-2001","status":"paid","amount":150000000,"refunded_amount":0,"currency":"IDR"}"#.into(),
            idempotency_key: "abc123".into(),
            attempts: 0,
            first_tried_ms: None,
            locale: None,
        };
        let rendered = render(&email, &Sender::new("toko@contoh.co.id")).unwrap();
        assert_eq!(
            rendered.subject,
            "Pembayaran diterima untuk pesanan ORDER-2001"
        );
        assert!(
            rendered
                .text
                .contains("sebesar Rp\u{a0}1.500.000 telah kami terima"),
            "{}",
            rendered.text
        );
        assert!(
            rendered.html.contains("<strong>Rp\u{a0}1.500.000</strong>"),
            "{}",
            rendered.html
        );
        assert_eq!(rendered.message_id, "<abc123@contoh.co.id>");

        let english = ClaimedEmail {
            locale: Some("en".into()),
            ..email
        };
        assert!(render(&english, &Sender::new("toko@contoh.co.id"))
            .unwrap()
            .text
            .contains("payment of IDR\u{a0}1,500,000"));
    }

    /// A refund notice tells the money given back this time and, after an earlier refund, how
    /// much in all; a row from before the ledger names only the total, and tells that.
    #[test]
    fn a_refund_notice_tells_this_refund_and_what_was_refunded_in_all() {
        let notice = |params: &str| ClaimedEmail {
            id: 1,
            order_id: "ord_1001".into(),
            recipient: Some("ana@example.com".into()),
            template: "refund_notice".into(),
            params: params.into(),
            idempotency_key: "k".into(),
            attempts: 0,
            first_tried_ms: None,
            locale: Some("en".into()),
        };
        let sender = Sender::new("shop@toko.example");
        let second = render(
            &notice(r#"{"order_id":"ord_1001","status":"partially_refunded","refund_amount":500,"refunded_amount":1500,"currency":"USD","exponent":2}"#),
            &sender,
        )
        .unwrap();
        assert!(
            second
                .text
                .contains("We refunded $5.00 for order ord_1001."),
            "{}",
            second.text
        );
        assert!(
            second.text.contains("In all, $15.00 has been refunded."),
            "{}",
            second.text
        );
        let first = render(
            &notice(r#"{"order_id":"ord_1001","status":"partially_refunded","refund_amount":1000,"refunded_amount":1000,"currency":"USD","exponent":2}"#),
            &sender,
        )
        .unwrap();
        assert!(!first.text.contains("In all"), "{}", first.text);
        let older = render(
            &notice(r#"{"order_id":"ord_1001","status":"refunded","refunded_amount":2500,"currency":"usd","exponent":2}"#),
            &sender,
        )
        .unwrap();
        assert!(
            older
                .text
                .contains("We refunded $25.00 for order ord_1001\n(the full payment)."),
            "{}",
            older.text
        );
    }

    /// Every template keeps its lines under 76 characters (for a typical order id), so an email
    /// in plain ASCII, English in dollars say, goes out as 7bit: readable in its `.eml` file, and
    /// not quoted-printable encoded (a quarter of what building a message cost).
    #[test]
    fn an_ascii_email_of_every_template_is_sent_as_7bit() {
        let sender = Sender::new("Toko Sari <shop@toko.example>");
        for template in ["receipt", "payment_failed", "refund_notice"] {
            for status in ["paid", "refunded"] {
                let email = ClaimedEmail {
                    id: 1,
                    order_id: "bench_1a23479ee7d_184340".into(),
                    recipient: Some("customer@example.com".into()),
                    template: template.into(),
                    params: format!(
                        r#"{{"order_id":"bench_1a23479ee7d_184340","status":"{status}","amount":1234567,"refunded_amount":1234567,"currency":"usd","exponent":2}}"#
                    ),
                    idempotency_key: "k".repeat(64),
                    attempts: 0,
                    first_tried_ms: None,
                    locale: None,
                };
                let rendered = render(&email, &sender).unwrap();
                let message = transport::Messages::default().bytes(&rendered).unwrap();
                let message = String::from_utf8(message).unwrap();
                assert_eq!(
                    message.matches("Content-Transfer-Encoding: 7bit").count(),
                    2,
                    "{template} {status}: {message}"
                );
                assert!(message.contains("$12,345.67"), "{template}: {message}");
            }
        }
    }

    #[test]
    fn a_sender_with_a_display_name_signs_with_it_and_keeps_the_message_id_well_formed() {
        let email = ClaimedEmail {
            id: 1,
            order_id: "ord_1".into(),
            recipient: Some("ana@example.com".into()),
            template: "receipt".into(),
            params: r#"{"order_id":"ord_1","status":"paid","amount":2500,"refunded_amount":0,"currency":"usd"}"#.into(),
            idempotency_key: "abc123".into(),
            attempts: 0,
            first_tried_ms: None,
            locale: None,
        };
        let named = render(&email, &Sender::new("Toko Sari <shop@toko.example>")).unwrap();
        assert_eq!(named.message_id, "<abc123@toko.example>");
        assert!(
            named.text.contains("Best regards,\nToko Sari"),
            "{}",
            named.text
        );
        assert!(!named.html.contains("&gt;"), "{}", named.html);
        let bare = render(&email, &Sender::new("shop@toko.example")).unwrap();
        assert_eq!(bare.message_id, "<abc123@toko.example>");
        assert!(
            bare.text.contains("Best regards,\ntoko.example"),
            "{}",
            bare.text
        );
    }

    /// Every C0 and C1 control character (TAB, ESC, BEL, NUL, DEL, NEL U+0085 among them) and
    /// the Unicode line and paragraph separators (U+2028, U+2029) are stripped from the order id
    /// in a subject: a subject is one line, whatever the order id holds. The rest is kept.
    #[test]
    fn a_subject_keeps_no_control_character_or_line_separator_of_the_order_id() {
        let hostile =
            "ord\t1\u{1b}[31m\u{7}\u{0}\u{7f}\u{85}\u{2028}\u{2029}\r\nBcc: x\u{80}\u{9f}-é";
        assert_eq!(
            subject("receipt", "en", hostile),
            "Payment received for order ord1[31mBcc: x-é"
        );
        for c in (0u32..0x20).chain(0x7f..0xa0).chain([0x2028, 0x2029]) {
            let c = char::from_u32(c).unwrap();
            for (template, locale) in [
                ("receipt", "id"),
                ("payment_failed", "en"),
                ("refund_notice", "id"),
            ] {
                let line = subject(template, locale, &format!("a{c}b"));
                assert!(line.ends_with(" ab"), "U+{:04X}: {line:?}", u32::from(c));
            }
        }
        // What is not a control character stays (a space, a non-breaking space, letters).
        assert_eq!(
            subject("refund_notice", "en", "ord 1\u{a0}ü"),
            "Refund for order ord 1\u{a0}ü"
        );
    }

    #[test]
    fn the_locale_follows_metadata_then_currency() {
        assert_eq!(locale_for(None, Some("IDR")), "id");
        assert_eq!(locale_for(None, Some("usd")), "en");
        assert_eq!(locale_for(Some("en"), Some("IDR")), "en");
        assert_eq!(locale_for(Some("id-ID"), Some("usd")), "id");
        assert_eq!(locale_for(Some("fr"), Some("usd")), "en");
    }
}
