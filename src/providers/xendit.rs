//! Xendit invoice callbacks: `x-callback-token` verification and normalisation.
//!
//! Xendit authenticates a callback with one header, `x-callback-token`, whose value is the
//! account's callback verification token (Dashboard → Settings → Webhooks), compared here in
//! constant time. That is all there is: no signature over the body and no timestamp, so anyone
//! who once saw a callback can send it again, byte for byte, and it verifies. **Deduplication is
//! the only replay protection**: a callback sent again within the retention is a duplicate, and
//! one sent later is applied again, which the ledger makes harmless (its facts merged again change
//! nothing, and an order that already holds its money gets no second receipt).
//!
//! ## Event ids
//!
//! The `webhook-id` header, when a delivery carries one (Xendit sends the same id on every retry
//! of one event), is the event id as it is. Otherwise the id is derived from the callback:
//! `{id}:{status}`, the invoice id, then the status. The status is checked to be upper-case
//! letters and `_` (`PAID`, `SETTLED`, `EXPIRED`), so it holds no `:` and is everything after
//! the last `:`: the id reads back into exactly one (invoice id, status) pair, and two callbacks
//! that differ in either never share an id, whatever their invoice ids contain. (Midtrans's
//! derived ids once collided because parts that could contain `:` were joined by `:` unescaped.)
//! One invoice's `PAID` and then `SETTLED` are two events: the second finds the order paid
//! already and changes nothing.
//!
//! A webhook-id and a derived id share the column (per provider). They cannot meet unless
//! Xendit sends a webhook-id of the form `{invoice id}:{STATUS}`; and whoever holds the token
//! can forge any callback anyway.
//!
//! ## Amounts
//!
//! Xendit sends `amount` and `paid_amount` as JSON numbers in the currency's main unit
//! (`150000` IDR is Rp150.000). sekali counts in minor units of ISO 4217's exponent, so they are
//! scaled exactly from the number's text, never through `f64`: `150000` IDR is `15000000` (two
//! decimals), `1499.50` PHP is `149950`, `150000` VND is `150000` (none). A negative number,
//! exponent notation, or more decimals than the currency has (`1499.505` PHP) is refused with
//! 400 rather than rounded; zeros past the currency's decimals (`150000.0` VND) are exact and
//! accepted.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{ready, LocalBoxFuture};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{
    Headers, PayloadError, Provider, ProviderSettings, Registration, Rejection, SignedRequest,
};
use crate::domain::ledger::{Attempt, PaymentFacts};
use crate::domain::money::{iso_exponent, parse_decimal_minor_units};
use crate::domain::{EmailAddress, NormalizedEvent, OrderRef, PaymentReport, ProviderName};

pub const ENV_CALLBACK_TOKEN: &str = "XENDIT_CALLBACK_TOKEN";

/// The header that carries the callback verification token.
pub const TOKEN_HEADER: &str = "x-callback-token";

/// The header that names the event, the same on each of its retries, when Xendit sends it.
pub const WEBHOOK_ID_HEADER: &str = "webhook-id";

/// Longer webhook-ids are refused: an id is a key of the events table, and no provider's ids
/// come near this.
pub const MAX_WEBHOOK_ID_BYTES: usize = 256;

/// Ids are kept a week: past the automatic retries, it also covers a resend by hand from the
/// Dashboard's Webhook tab in the days after an outage.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Xendit re-delivers a callback up to six times, 15 m, 1 h, 3 h, 6 h, 12 h and 24 h after the
/// first attempt (docs.xendit.co/webhook/delivery-attempts-and-retries, "Automatic Retry").
const REDELIVERY_WINDOW: Duration = Duration::from_secs(24 * 3600);

pub const REGISTRATION: Registration = Registration {
    name: "xendit",
    configure,
    environment: &[(
        ENV_CALLBACK_TOKEN,
        "the Xendit callback verification token (Dashboard → Settings → Webhooks), not an API key",
    )],
    options: &[],
    amount_exponent: iso_exponent,
    read_stored: |_, body| parse_callback(body)?.normalise(None),
};

/// Xendit, configured: the account's callback verification token.
pub struct Xendit {
    name: ProviderName,
    token: SecretString,
    retention: Duration,
}

fn configure(settings: &ProviderSettings<'_>) -> Result<Option<Arc<dyn Provider>>, String> {
    let Some(token) = settings.env(ENV_CALLBACK_TOKEN) else {
        return Ok(None);
    };
    Ok(Some(Arc::new(Xendit {
        name: xendit_name(),
        token: SecretString::from(token.trim().to_owned()),
        retention: settings.retention("xendit", DEFAULT_RETENTION)?,
    })))
}

impl Xendit {
    /// Xendit with this callback token and the default retention (tests, benchmarks).
    pub fn with_token(token: &str) -> Xendit {
        Xendit {
            name: xendit_name(),
            token: SecretString::from(token.to_owned()),
            retention: DEFAULT_RETENTION,
        }
    }
}

impl Provider for Xendit {
    fn name(&self) -> &ProviderName {
        &self.name
    }

    fn verify<'a>(
        &'a self,
        headers: &'a dyn Headers,
        body: &'a [u8],
        _now_unix: i64,
    ) -> LocalBoxFuture<'a, Result<NormalizedEvent, Rejection>> {
        Box::pin(ready((|| {
            verify_callback_token(headers.get(TOKEN_HEADER), &self.token)
                .map_err(|e| Rejection::unauthorized(e.to_string()))?;
            let webhook_id = webhook_id(headers)?;
            Ok(parse_callback(body)?.normalise(webhook_id)?)
        })()))
    }

    fn retention(&self) -> Duration {
        self.retention
    }

    fn redelivery_window(&self) -> Duration {
        REDELIVERY_WINDOW
    }

    fn sign(&self, body: &[u8], _now_unix: i64) -> Result<SignedRequest, String> {
        Ok(SignedRequest {
            body: body.to_vec(),
            headers: vec![
                (TOKEN_HEADER, self.token.expose_secret().to_owned()),
                (WEBHOOK_ID_HEADER, replay_webhook_id(body)),
            ],
        })
    }

    fn sample_payment(&self, order_id: &str, n: &str) -> Vec<u8> {
        // The shape of fixtures/xendit/invoice.paid.json, in its key order.
        serde_json::to_vec_pretty(&serde_json::json!({
            "id": format!("inv_bench_{n}"),
            "external_id": order_id,
            "user_id": "64a1f0c2d3e4b5a6c7d8e9f0",
            "is_high": false,
            "payment_method": "BANK_TRANSFER",
            "status": "PAID",
            "merchant_name": "Sekali Test Shop",
            "amount": 150000,
            "paid_amount": 150000,
            "bank_code": "BCA",
            "paid_at": "2026-11-29T03:17:45.118Z",
            "payer_email": format!("customer{n}@example.com"),
            "description": format!("Order {order_id}"),
            "adjusted_received_amount": 145560,
            "fees_paid_amount": 0,
            "updated": "2026-11-29T03:17:46.202Z",
            "created": "2026-11-29T03:15:02.412Z",
            "currency": "IDR",
            "payment_channel": "BCA",
            "payment_destination": "107669999001001",
        }))
        .expect("serialising a JSON value")
    }

    fn startup_warnings(&self) -> Vec<String> {
        // Xendit's API keys start with `xnd_` (xnd_development_…, xnd_production_…,
        // xnd_public_…); the callback token does not. Pasting a key instead is the likely first
        // mistake, after which every callback is a 401.
        if self.token.expose_secret().starts_with("xnd_") {
            vec![format!(
                "{ENV_CALLBACK_TOKEN} starts with xnd_, as Xendit's API keys do: Xendit sends the \
                 account's callback verification token in x-callback-token (Dashboard → Settings \
                 → Webhooks → Webhook verification token), and no API key matches a callback"
            )]
        } else {
            Vec::new()
        }
    }
}

/// The `webhook-id` [`Xendit::sign`] sets: made by sekali, as Xendit does not publish the form of
/// its own. It is the same for the same body (a file replayed twice is one event delivered
/// twice), and names the invoice, so that a run's events can be found by it (`bench
/// --check-db`).
fn replay_webhook_id(body: &[u8]) -> String {
    let digest = crate::domain::hex_lower(&Sha256::digest(body));
    let invoice = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("id").and_then(|id| id.as_str().map(str::to_owned)))
        .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_graphic()));
    match invoice {
        Some(id) => format!("sekali-{id}-{}", &digest[..16]),
        None => format!("sekali-{}", &digest[..16]),
    }
}

/// Why a callback's token was refused. The messages name the header and the setting, never the
/// token received or the one configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error(
        "missing x-callback-token header: Xendit sends the account's callback verification \
         token with every callback"
    )]
    Missing,
    #[error(
        "x-callback-token does not match: check that XENDIT_CALLBACK_TOKEN is this account's \
         callback verification token (Dashboard → Settings → Webhooks), of the same mode (test \
         or live) as the callbacks"
    )]
    Mismatch,
}

/// Checks the `x-callback-token` header's bytes against the configured token. Both are hashed
/// first and the digests compared in constant time, so the time taken says neither where they
/// differ nor how long the token is (`ct_eq` on the raw bytes returns early on a length
/// difference).
pub fn verify_callback_token(
    received: Option<&[u8]>,
    token: &SecretString,
) -> Result<(), TokenError> {
    let received = received.ok_or(TokenError::Missing)?;
    let expected = Sha256::digest(token.expose_secret().as_bytes());
    let received = Sha256::digest(received);
    if bool::from(expected.as_slice().ct_eq(received.as_slice())) {
        Ok(())
    } else {
        Err(TokenError::Mismatch)
    }
}

/// The delivery's `webhook-id`, if it has one.
fn webhook_id(headers: &dyn Headers) -> Result<Option<String>, Rejection> {
    let Some(text) = super::header_text(headers, WEBHOOK_ID_HEADER)? else {
        return Ok(None);
    };
    let text = text.trim();
    if text.is_empty() {
        return Err(Rejection::malformed("malformed webhook-id header: empty"));
    }
    if text.len() > MAX_WEBHOOK_ID_BYTES {
        return Err(Rejection::malformed(format!(
            "malformed webhook-id header: longer than {MAX_WEBHOOK_ID_BYTES} bytes"
        )));
    }
    Ok(Some(text.to_owned()))
}

/// The fields of an invoice callback sekali reads; Xendit adds fields without notice, so
/// anything else is skipped. The amounts are kept as the number's text.
#[derive(Debug, Clone, Deserialize)]
pub struct InvoiceCallback {
    /// The invoice's id.
    pub id: String,
    /// The shop's order id.
    pub external_id: String,
    pub status: String,
    pub amount: Option<Box<RawValue>>,
    pub paid_amount: Option<Box<RawValue>>,
    pub currency: Option<String>,
    pub payer_email: Option<String>,
    /// When it was paid, and last updated (RFC 3339, UTC).
    pub paid_at: Option<String>,
    pub updated: Option<String>,
}

/// Statuses are this long at most; Xendit's are a word or two.
const MAX_STATUS_LEN: usize = 64;

/// Parses a callback body; errors name the missing or malformed field.
pub fn parse_callback(body: &[u8]) -> Result<InvoiceCallback, PayloadError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let callback: InvoiceCallback =
        serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
            let path = e.path().to_string();
            match PayloadError::from_serde(e.into_inner()) {
                PayloadError::InvalidEvent(message) if path != "." => {
                    PayloadError::InvalidEvent(format!("field `{path}`: {message}"))
                }
                other => other,
            }
        })?;
    deserializer.end().map_err(PayloadError::from_serde)?;
    let invalid = |message: &str| Err(PayloadError::InvalidEvent(message.to_owned()));
    if callback.id.is_empty() {
        return invalid("field `id` is empty");
    }
    if callback.external_id.is_empty() {
        return invalid("field `external_id` is empty");
    }
    if !is_status(&callback.status) {
        return invalid(
            "field `status` is not an upper-case status such as PAID (letters A-Z and _)",
        );
    }
    Ok(callback)
}

/// `A-Z` and `_`, starting with a letter: what makes the derived id readable back (see the
/// module docs).
fn is_status(status: &str) -> bool {
    (1..=MAX_STATUS_LEN).contains(&status.len())
        && status.starts_with(|c: char| c.is_ascii_uppercase())
        && status.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
}

/// Why an amount was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("is not a JSON number")]
    NotANumber,
    #[error("is negative")]
    Negative,
    #[error("is in exponent notation; Xendit sends plain decimals")]
    ExponentNotation,
    #[error("has {decimals} decimals, more than {currency}'s {exponent}")]
    TooManyDecimals {
        decimals: usize,
        currency: String,
        exponent: u32,
    },
    #[error("is too large")]
    TooLarge,
}

/// A JSON number in `currency`'s main unit (its text as sent: `150000`, `1499.50`) in minor units
/// of `exponent` decimals, exactly.
pub fn main_units_to_minor(text: &str, currency: &str, exponent: u32) -> Result<i64, AmountError> {
    let text = text.trim();
    match text.bytes().next() {
        Some(b'-') => return Err(AmountError::Negative),
        Some(b'0'..=b'9') => {}
        _ => return Err(AmountError::NotANumber),
    }
    if text.contains(['e', 'E']) {
        return Err(AmountError::ExponentNotation);
    }
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    // Zeros past the last significant decimal change nothing: `150000.0` VND is exact.
    let fraction = fraction.trim_end_matches('0');
    if fraction.len() > exponent as usize {
        return Err(AmountError::TooManyDecimals {
            decimals: fraction.len(),
            currency: currency.to_owned(),
            exponent,
        });
    }
    let exact = if fraction.is_empty() {
        whole.to_owned()
    } else {
        format!("{whole}.{fraction}")
    };
    parse_decimal_minor_units(&exact, exponent).ok_or(AmountError::TooLarge)
}

impl InvoiceCallback {
    /// The event id when the delivery has no `webhook-id`: `{id}:{status}` (see the module
    /// docs).
    pub fn derived_event_id(&self) -> String {
        format!("{}:{}", self.id, self.status)
    }

    /// The event type: `invoice.` and the status in lower case (`invoice.paid`).
    pub fn event_type(&self) -> String {
        format!("invoice.{}", self.status.to_ascii_lowercase())
    }

    /// One of the amounts, in minor units; a missing or `null` one is `None`.
    fn minor_units(
        &self,
        field: &str,
        raw: Option<&RawValue>,
        currency: &str,
        exponent: u32,
    ) -> Result<Option<i64>, PayloadError> {
        raw.map(|raw| {
            main_units_to_minor(raw.get(), currency, exponent).map_err(|e| {
                PayloadError::InvalidEvent(format!(
                    "field `{field}` {e} (Xendit sends amounts as JSON numbers in the \
                     currency's main unit, such as 150000 for Rp150.000)"
                ))
            })
        })
        .transpose()
    }

    /// The provider-independent form of this callback, its id the delivery's `webhook_id` when
    /// it has one. A status sekali acts on needs its currency and amount; the others are
    /// recorded as they come.
    pub fn normalise(self, webhook_id: Option<String>) -> Result<NormalizedEvent, PayloadError> {
        let payment = match Status::of(&self.status) {
            None => None,
            Some(status) => Some(PaymentReport {
                reference: self.id.clone(),
                aliases: Vec::new(),
                facts: self.facts(status)?,
            }),
        };
        Ok(NormalizedEvent {
            provider: xendit_name(),
            event_id: webhook_id.unwrap_or_else(|| self.derived_event_id()),
            event_type: self.event_type(),
            order_ref: OrderRef::OrderId(self.external_id.clone()),
            payment,
            payer_email: self
                .payer_email
                .as_deref()
                .and_then(|e| EmailAddress::parse(e).ok()),
            legacy_event_id: None,
            detail: None,
            retention: DEFAULT_RETENTION,
            headers: None,
        })
    }

    /// What the callback says about its invoice: paid (what was paid, against the invoice's
    /// amount, which the payment must match), or expired.
    fn facts(&self, status: Status) -> Result<PaymentFacts, PayloadError> {
        let invalid = |message: &str| PayloadError::InvalidEvent(message.to_owned());
        let currency = self
            .currency
            .as_deref()
            .ok_or_else(|| {
                invalid(
                    "missing field `currency` (the amounts' decimals depend on it, and an \
                     account's default currency is not in the callback)",
                )
            })?
            .to_owned();
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(invalid(
                "field `currency` is not a three-letter code such as IDR",
            ));
        }
        let exponent = iso_exponent(&currency);
        let amount = self
            .minor_units("amount", self.amount.as_deref(), &currency, exponent)?
            .ok_or_else(|| invalid("missing field `amount`"))?;
        let mut facts = PaymentFacts {
            currency: Some(currency.to_ascii_uppercase()),
            requested: Some(amount),
            expected: Some(amount),
            ..PaymentFacts::default()
        };
        match status {
            Status::Paid => {
                // An invoice is paid in full: a callback without `paid_amount` paid its `amount`.
                facts.captured = Some(
                    self.minor_units(
                        "paid_amount",
                        self.paid_amount.as_deref(),
                        &currency,
                        exponent,
                    )?
                    .unwrap_or(amount),
                );
                facts.captured_at = Some(time_of(self.paid_at.as_deref()));
            }
            Status::Expired => {
                facts.attempt = Some((Attempt::Expired, time_of(self.updated.as_deref())));
            }
        }
        Ok(facts)
    }
}

/// An RFC 3339 time as Unix seconds; 0 when absent or unreadable (the ledger then orders by
/// rank alone).
fn time_of(text: Option<&str>) -> i64 {
    text.and_then(|t| humantime::parse_rfc3339_weak(t.trim()).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs() as i64)
}

/// The statuses sekali acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `PAID`, and `SETTLED` (the money reached the account's balance).
    Paid,
    Expired,
}

impl Status {
    /// `PAID` and `SETTLED` are paid, `EXPIRED` expired; any other status (`PENDING`, and
    /// whatever Xendit adds) is recorded and not acted on.
    pub fn of(status: &str) -> Option<Status> {
        match status {
            "PAID" | "SETTLED" => Some(Status::Paid),
            "EXPIRED" => Some(Status::Expired),
            _ => None,
        }
    }
}

fn xendit_name() -> ProviderName {
    ProviderName::new("xendit").expect("a valid name")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::RejectionKind;

    const TOKEN: &str = "cb-token-sekali-unit-0123456789abcdef";

    fn secret(token: &str) -> SecretString {
        SecretString::from(token.to_owned())
    }

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{}/fixtures/xendit/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Headers from a list of any length.
    struct List<'a>(&'a [(&'a str, &'a str)]);

    impl Headers for List<'_> {
        fn get(&self, name: &str) -> Option<&[u8]> {
            self.0
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_bytes())
        }
    }

    /// Verifies `body` with these headers, as the webhook handler does.
    fn verify(headers: &[(&str, &str)], body: &[u8]) -> Result<NormalizedEvent, Rejection> {
        let xendit = Xendit::with_token(TOKEN);
        futures_util::FutureExt::now_or_never(xendit.verify(&List(headers), body, 0))
            .expect("verification does not wait")
    }

    fn callback(json: &str) -> InvoiceCallback {
        parse_callback(json.as_bytes()).unwrap()
    }

    #[test]
    fn the_right_token_is_accepted_and_a_wrong_missing_or_other_length_one_is_refused() {
        let token = secret(TOKEN);
        assert_eq!(
            verify_callback_token(Some(TOKEN.as_bytes()), &token),
            Ok(())
        );
        assert_eq!(
            verify_callback_token(None, &token),
            Err(TokenError::Missing)
        );
        let mut last_changed = TOKEN.as_bytes().to_vec();
        *last_changed.last_mut().unwrap() ^= 1;
        let longer = format!("{TOKEN}0");
        for wrong in [
            b"cb-token-someone-elses-0123456789abcdef".as_slice(),
            &last_changed,
            &TOKEN.as_bytes()[..TOKEN.len() - 1],
            longer.as_bytes(),
            b"",
            TOKEN.to_uppercase().as_bytes(),
        ] {
            assert_eq!(
                verify_callback_token(Some(wrong), &token),
                Err(TokenError::Mismatch),
                "{}",
                String::from_utf8_lossy(wrong)
            );
        }
    }

    #[test]
    fn a_refused_token_is_a_401_whose_message_names_neither_token() {
        let body = fixture("invoice.paid.json");
        let headers: [&[(&str, &str)]; 4] = [
            &[("x-callback-token", "cb-token-someone-elses")],
            &[],
            &[("X-Callback-Token", "")],
            &[("webhook-id", TOKEN)],
        ];
        for headers in headers {
            let rejection = verify(headers, &body).unwrap_err();
            assert_eq!(rejection.kind, RejectionKind::Unauthorized, "{headers:?}");
            assert!(!rejection.message.contains(TOKEN), "{}", rejection.message);
            assert!(
                !rejection.message.contains("someone-elses"),
                "{}",
                rejection.message
            );
        }
    }

    #[test]
    fn the_webhook_id_header_is_the_event_id_when_present() {
        let body = fixture("invoice.paid.json");
        let with = verify(
            &[("x-callback-token", TOKEN), ("webhook-id", "wh-0001")],
            &body,
        )
        .unwrap();
        assert_eq!(with.event_id, "wh-0001");
        let without = verify(&[("x-callback-token", TOKEN)], &body).unwrap();
        assert_eq!(without.event_id, "65f1c0a2b3d4e5f601a01001:PAID");
        for bad in ["", "   "] {
            let rejection =
                verify(&[("x-callback-token", TOKEN), ("webhook-id", bad)], &body).unwrap_err();
            assert_eq!(rejection.kind, RejectionKind::Malformed, "{bad:?}");
        }
        let long = "w".repeat(MAX_WEBHOOK_ID_BYTES + 1);
        assert_eq!(
            verify(&[("x-callback-token", TOKEN), ("webhook-id", &long)], &body)
                .unwrap_err()
                .kind,
            RejectionKind::Malformed
        );
    }

    /// Fails on an id that joins parts which may contain the separator without escaping them,
    /// the way Midtrans's derived ids once collided.
    #[test]
    fn derived_ids_of_different_ids_or_statuses_never_collide() {
        let ids = [
            "inv", "inv:PAID", "inv:", ":inv", "a:b:c", "inv\\", "inv PAID", "i",
        ];
        let statuses = ["PAID", "SETTLED", "EXPIRED", "PAID_", "P", "PENDING"];
        let mut seen = std::collections::HashMap::new();
        for id in ids {
            for status in statuses {
                let c = callback(&format!(
                    r#"{{"id":{},"external_id":"o","status":"{status}"}}"#,
                    serde_json::to_string(id).unwrap()
                ));
                let derived = c.derived_event_id();
                // It reads back into exactly the pair it came from.
                assert_eq!(derived.rsplit_once(':'), Some((id, status)), "{derived}");
                if let Some(earlier) = seen.insert(derived.clone(), (id, status)) {
                    panic!("{derived} derived from {earlier:?} and {:?}", (id, status));
                }
            }
        }
        // A status that could carry a separator, or hide one, is not a status.
        for status in ["PAID:SETTLED", "paid", "Paid", "", "_PAID", "PAID ", "PÄID"] {
            let body = format!(r#"{{"id":"inv","external_id":"o","status":"{status}"}}"#);
            assert!(
                matches!(
                    parse_callback(body.as_bytes()),
                    Err(PayloadError::InvalidEvent(_))
                ),
                "{status:?}"
            );
        }
    }

    #[test]
    fn amounts_in_main_units_become_exact_minor_units_of_the_currency() {
        #[rustfmt::skip]
        let table: [(&str, &str, Result<i64, AmountError>); 16] = [
            ("150000", "IDR", Ok(15_000_000)),
            ("150000.00", "IDR", Ok(15_000_000)),
            ("89000", "IDR", Ok(8_900_000)),
            ("1499.50", "PHP", Ok(149_950)),
            ("1499.5", "PHP", Ok(149_950)),
            ("0.01", "PHP", Ok(1)),
            ("150000", "VND", Ok(150_000)),
            ("150000.0", "VND", Ok(150_000)),
            ("99.99", "MYR", Ok(9_999)),
            ("0", "THB", Ok(0)),
            ("1499.505", "PHP", Err(AmountError::TooManyDecimals { decimals: 3, currency: "PHP".into(), exponent: 2 })),
            ("150000.5", "VND", Err(AmountError::TooManyDecimals { decimals: 1, currency: "VND".into(), exponent: 0 })),
            ("-150000", "IDR", Err(AmountError::Negative)),
            ("1.5e5", "IDR", Err(AmountError::ExponentNotation)),
            ("\"150000\"", "IDR", Err(AmountError::NotANumber)),
            ("99999999999999999999", "IDR", Err(AmountError::TooLarge)),
        ];
        for (text, currency, expected) in table {
            let exponent = iso_exponent(currency);
            assert_eq!(
                main_units_to_minor(text, currency, exponent),
                expected,
                "{text} {currency}"
            );
        }
    }

    /// Fails on amounts read through `f64`: 0.29 is 0.28999… there, and ×100 truncates to 28.
    #[test]
    fn amounts_are_read_from_the_numbers_text_not_through_floating_point() {
        assert_eq!(main_units_to_minor("0.29", "PHP", 2), Ok(29));
        assert_eq!(main_units_to_minor("1234567.89", "PHP", 2), Ok(123_456_789));
        let c = callback(
            r#"{"id":"i","external_id":"o","status":"PAID","currency":"PHP","amount":0.29,"paid_amount":0.29}"#,
        );
        let facts = c.normalise(None).unwrap().payment.unwrap().facts;
        assert_eq!((facts.requested, facts.captured), (Some(29), Some(29)));
    }

    #[test]
    fn paid_and_settled_take_money_expired_ends_the_invoice_and_the_rest_say_nothing() {
        for (status, expected) in [
            ("PAID", Some(Status::Paid)),
            ("SETTLED", Some(Status::Paid)),
            ("EXPIRED", Some(Status::Expired)),
            ("PENDING", None),
            ("FAILED", None),
            ("VOIDED", None),
            ("SOMETHING_NEW", None),
        ] {
            assert_eq!(Status::of(status), expected, "{status}");
            let event = callback(&format!(
                r#"{{"id":"i","external_id":"o","status":"{status}","amount":1,"currency":"IDR"}}"#
            ))
            .normalise(None)
            .unwrap();
            let facts = event.payment.as_ref().map(|p| &p.facts);
            let said = facts.map(|f| (f.captured(), f.attempt()));
            let want = expected.map(|s| match s {
                Status::Paid => (100, Attempt::Pending),
                Status::Expired => (0, Attempt::Expired),
            });
            assert_eq!(said, want, "{status}");
            assert_eq!(event.order_ref, OrderRef::OrderId("o".into()));
        }
        // An ignored status is recorded as it comes, without the fields a change needs.
        let pending = callback(r#"{"id":"i","external_id":"o","status":"PENDING"}"#);
        assert_eq!(pending.normalise(None).unwrap().payment, None);
    }

    #[test]
    fn a_status_sekali_acts_on_needs_a_currency_and_a_valid_amount() {
        for (body, field) in [
            (
                r#"{"id":"i","external_id":"o","status":"PAID","amount":1}"#,
                "currency",
            ),
            (
                r#"{"id":"i","external_id":"o","status":"PAID","currency":"IDR"}"#,
                "amount",
            ),
            (
                r#"{"id":"i","external_id":"o","status":"PAID","currency":"IDR","amount":"1"}"#,
                "amount",
            ),
            (
                r#"{"id":"i","external_id":"o","status":"PAID","currency":"IDR","amount":-1}"#,
                "amount",
            ),
            (
                r#"{"id":"i","external_id":"o","status":"PAID","currency":"IDR","amount":1,"paid_amount":1.001}"#,
                "paid_amount",
            ),
            (
                r#"{"id":"i","external_id":"o","status":"EXPIRED","currency":"rupiah","amount":1}"#,
                "currency",
            ),
        ] {
            let error = callback(body).normalise(None).unwrap_err();
            let PayloadError::InvalidEvent(message) = &error else {
                panic!("{body}: {error:?}")
            };
            assert!(message.contains(&format!("`{field}`")), "{body}: {message}");
        }
    }

    #[test]
    fn malformed_bodies_name_the_problem() {
        for (body, expected) in [
            ("not json", "invalid JSON"),
            (
                r#"{"id":"i","status":"PAID"}"#,
                "missing field `external_id`",
            ),
            (
                r#"{"id":"","external_id":"o","status":"PAID"}"#,
                "field `id` is empty",
            ),
            (
                r#"{"id":"i","external_id":"","status":"PAID"}"#,
                "field `external_id` is empty",
            ),
            (
                r#"{"id":"i","external_id":"o","status":5}"#,
                "field `status`",
            ),
            (
                r#"{"id":"i","external_id":"o","status":"PAID"} trailing"#,
                "invalid JSON",
            ),
        ] {
            let error = parse_callback(body.as_bytes()).unwrap_err().to_string();
            assert!(error.contains(expected), "{body}: {error}");
        }
    }

    /// Every file in fixtures/xendit/ and what it must read as; a fixture added without an
    /// expectation fails here.
    #[test]
    fn every_fixture_reads_as_the_expected_normalized_event() {
        // (file, event id, type, order, invoice, currency, asked, taken, expired, payer)
        type Expected<'a> = (
            &'a str,
            &'a str,
            &'a str,
            &'a str,
            &'a str,
            &'a str,
            i64,
            i64,
            bool,
            Option<&'a str>,
        );
        let expected: [Expected; 8] = [
            (
                "invoice.paid.json",
                "65f1c0a2b3d4e5f601a01001:PAID",
                "invoice.paid",
                "ord_x_1001",
                "65f1c0a2b3d4e5f601a01001",
                "IDR",
                15_000_000,
                15_000_000,
                false,
                Some("buyer1001@example.com"),
            ),
            (
                "invoice.settled.json",
                "65f1c0a2b3d4e5f601a01001:SETTLED",
                "invoice.settled",
                "ord_x_1001",
                "65f1c0a2b3d4e5f601a01001",
                "IDR",
                15_000_000,
                15_000_000,
                false,
                Some("buyer1001@example.com"),
            ),
            (
                "invoice.expired.json",
                "65f1c0a2b3d4e5f601a01002:EXPIRED",
                "invoice.expired",
                "ord_x_1002",
                "65f1c0a2b3d4e5f601a01002",
                "IDR",
                8_900_000,
                0,
                true,
                None,
            ),
            (
                "invoice.paid.ewallet.json",
                "65f1c0a2b3d4e5f601a01003:PAID",
                "invoice.paid",
                "ord_x_1003",
                "65f1c0a2b3d4e5f601a01003",
                "IDR",
                21_000_000,
                21_000_000,
                false,
                None,
            ),
            (
                "invoice.paid.card.json",
                "65f1c0a2b3d4e5f601a01004:PAID",
                "invoice.paid",
                "ord_x_1004",
                "65f1c0a2b3d4e5f601a01004",
                "IDR",
                32_500_000,
                32_500_000,
                false,
                None,
            ),
            (
                "invoice.paid.underpaid.json",
                "65f1c0a2b3d4e5f601a01005:PAID",
                "invoice.paid",
                "ord_x_1005",
                "65f1c0a2b3d4e5f601a01005",
                "IDR",
                25_000_000,
                20_000_000,
                false,
                Some("buyer1005@example.com"),
            ),
            (
                "invoice.paid.overpaid.json",
                "65f1c0a2b3d4e5f601a01006:PAID",
                "invoice.paid",
                "ord_x_1006",
                "65f1c0a2b3d4e5f601a01006",
                "IDR",
                12_000_000,
                15_000_000,
                false,
                Some("buyer1006@example.com"),
            ),
            (
                "invoice.paid.php.json",
                "65f1c0a2b3d4e5f601a01007:PAID",
                "invoice.paid",
                "ord_x_1007",
                "65f1c0a2b3d4e5f601a01007",
                "PHP",
                124_975,
                124_975,
                false,
                None,
            ),
        ];
        let dir = format!("{}/fixtures/xendit", env!("CARGO_MANIFEST_DIR"));
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.ends_with(".json"))
            .collect();
        files.sort();
        let mut listed: Vec<String> = expected.iter().map(|e| e.0.to_string()).collect();
        listed.sort();
        assert_eq!(files, listed, "every fixture has an expectation");
        for (file, id, kind, order, invoice, currency, asked, taken, expired, payer) in expected {
            let read = verify(&[("x-callback-token", TOKEN)], &fixture(file))
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(
                (read.event_id.as_str(), read.event_type.as_str()),
                (id, kind),
                "{file}"
            );
            assert_eq!(read.order_ref, OrderRef::OrderId(order.into()), "{file}");
            assert_eq!(
                read.payer_email.as_ref().map(EmailAddress::as_str),
                payer,
                "{file}"
            );
            let payment = read.payment.unwrap();
            let facts = &payment.facts;
            assert_eq!(payment.reference, invoice, "{file}");
            assert_eq!(
                (
                    facts.currency.as_deref(),
                    facts.requested,
                    facts.expected,
                    facts.captured(),
                    facts.attempt() == Attempt::Expired
                ),
                (Some(currency), Some(asked), Some(asked), taken, expired),
                "{file}"
            );
            assert_eq!(read.retention, DEFAULT_RETENTION, "{file}");
        }
    }

    #[test]
    fn a_signed_request_verifies_and_the_same_body_keeps_its_webhook_id() {
        let xendit = Xendit::with_token(TOKEN);
        let body = fixture("invoice.paid.json");
        let signed = xendit.sign(&body, 0).unwrap();
        assert_eq!(signed.body, body);
        let header = |name: &str| {
            signed
                .headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        let id = header("webhook-id");
        assert!(id.starts_with("sekali-65f1c0a2b3d4e5f601a01001-"), "{id}");
        assert_eq!(xendit.sign(&body, 99).unwrap().headers, signed.headers);
        let settled = xendit.sign(&fixture("invoice.settled.json"), 0).unwrap();
        assert_ne!(settled.headers, signed.headers);
        let token = header("x-callback-token");
        let event = verify(&[("x-callback-token", &token), ("webhook-id", &id)], &body).unwrap();
        assert_eq!(event.event_id, id);
    }

    #[test]
    fn the_sample_payment_pays_its_order_in_rupiah() {
        let xendit = Xendit::with_token(TOKEN);
        let body = xendit.sample_payment("bench_r_7", "r_7");
        let event = verify(&[("x-callback-token", TOKEN)], &body).unwrap();
        assert_eq!(event.order_ref, OrderRef::OrderId("bench_r_7".into()));
        assert_eq!(event.event_id, "inv_bench_r_7:PAID");
        let facts = event.payment.unwrap().facts;
        assert_eq!(
            (facts.captured(), facts.currency.as_deref()),
            (15_000_000, Some("IDR"))
        );
        assert_eq!(
            event.payer_email.map(|e| e.to_string()).as_deref(),
            Some("customerr_7@example.com")
        );
    }

    #[test]
    fn an_api_key_given_as_the_token_is_warned_of_without_being_shown() {
        let key = "xnd_development_P4qDfOss0OCpl8RtKrROHjaQYNCk9dN5lSfk";
        let warnings = Xendit::with_token(key).startup_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("xnd_"), "{}", warnings[0]);
        assert!(!warnings[0].contains(key), "{}", warnings[0]);
        assert!(Xendit::with_token(TOKEN).startup_warnings().is_empty());
    }

    #[test]
    fn a_payer_email_that_is_not_one_address_is_dropped() {
        for (email, expected) in [
            ("sari@toko.example", Some("sari@toko.example")),
            ("a@x.example,b@y.example", None),
            ("Sari <sari@toko.example>", None),
            ("", None),
        ] {
            let c = callback(&format!(
                r#"{{"id":"i","external_id":"o","status":"PAID","currency":"IDR","amount":1,"payer_email":{}}}"#,
                serde_json::to_string(email).unwrap()
            ));
            let event = c.normalise(None).unwrap();
            assert_eq!(
                event.payer_email.as_ref().map(EmailAddress::as_str),
                expected,
                "{email}"
            );
        }
    }
}
