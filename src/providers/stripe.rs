//! Stripe: `Stripe-Signature` verification over the raw body, and event normalisation.
//!
//! Verification follows the official libraries: the header is `t=<unix>,v1=<hex>[,v1=<hex>…]`,
//! each `v1` is hex HMAC-SHA256 keyed by the whole `whsec_…` string over `"{t}.{raw body}"`.
//! Every `v1` is tried against every configured secret (a delivery during secret rotation carries
//! one `v1` per active secret), `v0` and unknown schemes are ignored, and the comparison is
//! constant-time. Unlike stripe-node, the tolerance applies in both directions.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{ready, LocalBoxFuture};
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sha2::Sha256;

use super::{
    Headers, PayloadError, Provider, ProviderSettings, Registration, Rejection, SignedRequest,
};
use crate::domain::{
    EmailAddress, NormalizedEvent, OrderRef, OrderStatus, ProviderName, StatusChange,
};

type HmacSha256 = Hmac<Sha256>;

pub const ENV_SECRET: &str = "STRIPE_WEBHOOK_SECRET";

/// Stripe retries for 3 days and `stripe events resend` reaches back 30: ids are kept 30 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

pub const REGISTRATION: Registration = Registration {
    name: "stripe",
    configure,
    environment: &[(
        ENV_SECRET,
        "Stripe endpoint signing secrets (whsec_...), comma-separated while rolling",
    )],
    options: &[(
        "tolerance",
        "accepted distance in seconds between a signature's timestamp and now, both ways (300)",
    )],
    amount_exponent,
    read_stored: Some(parse_event),
};

/// Stripe, configured: the endpoint's signing secrets (every one is accepted, for rotation).
pub struct Stripe {
    name: ProviderName,
    secrets: Vec<SecretString>,
    tolerance_secs: u64,
    retention: Duration,
}

fn configure(settings: &ProviderSettings<'_>) -> Result<Option<Arc<dyn Provider>>, String> {
    let secrets: Vec<SecretString> = settings
        .env(ENV_SECRET)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| SecretString::from(s.to_owned()))
        .collect();
    if secrets.is_empty() {
        return Ok(None);
    }
    let tolerance_secs = match settings.option("stripe", "tolerance") {
        None => DEFAULT_TOLERANCE_SECS,
        Some(text) => text.parse::<u64>().ok().filter(|&t| t > 0).ok_or_else(|| {
            format!("the Stripe tolerance `{text}` is not a whole number of seconds above zero")
        })?,
    };
    Ok(Some(Arc::new(Stripe {
        name: ProviderName::new("stripe").expect("a valid name"),
        secrets,
        tolerance_secs,
        retention: settings.retention("stripe", DEFAULT_RETENTION)?,
    })))
}

impl Stripe {
    /// Stripe with these secrets and defaults for the rest (tests, benchmarks).
    pub fn with_secrets(secrets: &[&str]) -> Stripe {
        Stripe {
            name: ProviderName::new("stripe").expect("a valid name"),
            secrets: secrets
                .iter()
                .map(|s| SecretString::from(s.to_string()))
                .collect(),
            tolerance_secs: DEFAULT_TOLERANCE_SECS,
            retention: DEFAULT_RETENTION,
        }
    }
}

impl Provider for Stripe {
    fn name(&self) -> &ProviderName {
        &self.name
    }

    fn verify<'a>(
        &'a self,
        headers: &'a dyn Headers,
        body: &'a [u8],
        now_unix: i64,
    ) -> LocalBoxFuture<'a, Result<NormalizedEvent, Rejection>> {
        Box::pin(ready((|| {
            let header = super::header_text(headers, "Stripe-Signature")?;
            verify_stripe_signature(header, body, &self.secrets, now_unix, self.tolerance_secs)
                .map_err(|e| match e {
                    SignatureError::MissingHeader | SignatureError::MalformedHeader(_) => {
                        Rejection::malformed(e.to_string())
                    }
                    SignatureError::TimestampOutsideTolerance { .. }
                    | SignatureError::NoMatchingSignature => Rejection::unauthorized(e.to_string()),
                })?;
            Ok(parse_event(body)?)
        })()))
    }

    fn retention(&self) -> Duration {
        self.retention
    }

    fn redelivery_window(&self) -> Duration {
        DEFAULT_RETENTION
    }

    fn sign(&self, body: &[u8], now_unix: i64) -> Result<SignedRequest, String> {
        let secret = self.secrets.first().ok_or("no Stripe secret")?;
        Ok(SignedRequest {
            body: body.to_vec(),
            headers: vec![
                (
                    "Stripe-Signature",
                    signature_header(&[secret.expose_secret()], now_unix, body),
                ),
                (
                    "User-Agent",
                    "Stripe/1.0 (+https://stripe.com/docs/webhooks)".into(),
                ),
            ],
        })
    }

    fn sample_payment(&self, order_id: &str, n: &str) -> Vec<u8> {
        sample_payment_intent_succeeded(order_id, n)
    }

    fn startup_warnings(&self) -> Vec<String> {
        // A webhook signing secret starts with `whsec_`. Pasting the API key (`sk_live_…`) or
        // the publishable key instead is the classic first mistake, after which every delivery
        // is a 401.
        self.secrets
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.expose_secret().starts_with("whsec_"))
            .map(|(index, secret)| {
                let kind = ["sk_", "rk_", "pk_"]
                    .iter()
                    .find(|prefix| secret.expose_secret().starts_with(*prefix))
                    .map_or("", |_| " (it looks like an API key)");
                format!(
                    "{ENV_SECRET} entry {} does not start with whsec_{kind}: Stripe signs webhooks \
                     with the endpoint's signing secret (Dashboard → Developers → Webhooks → the \
                     endpoint → Signing secret, or what `stripe listen` prints), and no other key \
                     verifies a delivery",
                    index + 1
                )
            })
            .collect()
    }
}

/// A `payment_intent.succeeded` shaped as Stripe sends it (about 1.5 KB), for `order_id`, its
/// ids ending in `n`. The load generator builds it once per run and splices each event's number
/// into the rendered body itself (`bench::EventTemplate`).
fn sample_payment_intent_succeeded(order_id: &str, n: &str) -> Vec<u8> {
    serde_json::to_vec_pretty(&serde_json::json!({
        "id": format!("evt_bench_{n}"),
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1_732_870_000,
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null},
        "type": "payment_intent.succeeded",
        "data": {"object": {
            "id": format!("pi_bench_{n}"),
            "object": "payment_intent",
            "amount": 2500, "amount_capturable": 0, "amount_received": 2500,
            "capture_method": "automatic", "confirmation_method": "automatic",
            "created": 1_732_869_990, "currency": "usd",
            "description": "sekali bench order",
            "latest_charge": format!("ch_bench_{n}"),
            "livemode": false,
            "metadata": {"order_id": order_id},
            "payment_method": format!("pm_bench_{n}"),
            "payment_method_types": ["card"],
            "receipt_email": format!("customer{n}@example.com"),
            "status": "succeeded",
            "shipping": null, "statement_descriptor": null,
        }},
    }))
    .expect("serialising a JSON value")
}

/// Default accepted distance between the signed timestamp and now, both directions.
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// Headers longer than this are rejected before parsing: a real one carries a timestamp and a
/// handful of 64-character signatures.
pub const MAX_SIGNATURE_HEADER_BYTES: usize = 4096;

/// Why a delivery failed verification. Messages name the problem and never echo a secret, the
/// received signature or the expected one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("missing Stripe-Signature header")]
    MissingHeader,
    #[error("malformed Stripe-Signature header: {0}")]
    MalformedHeader(&'static str),
    #[error("timestamp outside the tolerance of {tolerance_secs} seconds")]
    TimestampOutsideTolerance { tolerance_secs: u64 },
    /// Said with what to check: the secret, and that the body arrived byte for byte as Stripe
    /// signed it (a tool that re-encodes JSON, or `curl -d`, which drops line breaks, changes it).
    #[error(
        "no signature matches any configured secret. The signature covers the exact bytes \
         received: check that STRIPE_WEBHOOK_SECRET is this endpoint's signing secret, and \
         that nothing re-encoded the body on the way (send a file with curl --data-binary \
         @file, not -d)"
    )]
    NoMatchingSignature,
}

/// A parsed `Stripe-Signature` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureHeader<'a> {
    pub timestamp: i64,
    /// The `v1` values as sent (hex, not yet decoded).
    pub v1: Vec<&'a str>,
}

/// Parses `t=…,v1=…[,v1=…]`. Exactly one `t`; at least one `v1`; other schemes are skipped.
pub fn parse_signature_header(header: &str) -> Result<SignatureHeader<'_>, SignatureError> {
    use SignatureError::MalformedHeader;
    if header.trim().is_empty() {
        return Err(MalformedHeader("empty"));
    }
    if header.len() > MAX_SIGNATURE_HEADER_BYTES {
        return Err(MalformedHeader("too long"));
    }
    let mut timestamp = None;
    let mut v1 = Vec::new();
    for item in header.split(',') {
        let Some((key, value)) = item.trim().split_once('=') else {
            return Err(MalformedHeader("expected key=value pairs"));
        };
        match key {
            "t" => {
                if timestamp.is_some() {
                    return Err(MalformedHeader("more than one timestamp"));
                }
                let parsed = value
                    .parse::<i64>()
                    .map_err(|_| MalformedHeader("timestamp is not an integer"))?;
                timestamp = Some(parsed);
            }
            "v1" => v1.push(value),
            _ => {} // v0 (test-mode fake signature) and future schemes
        }
    }
    let timestamp = timestamp.ok_or(MalformedHeader("no timestamp"))?;
    if v1.is_empty() {
        return Err(MalformedHeader("no v1 signature"));
    }
    Ok(SignatureHeader { timestamp, v1 })
}

/// Verifies a delivery: `header` as received, `body` the raw bytes, `now_unix` from the clock.
pub fn verify_stripe_signature(
    header: Option<&str>,
    body: &[u8],
    secrets: &[SecretString],
    now_unix: i64,
    tolerance_secs: u64,
) -> Result<(), SignatureError> {
    let header = parse_signature_header(header.ok_or(SignatureError::MissingHeader)?)?;
    let candidates: Vec<Vec<u8>> = header
        .v1
        .iter()
        .filter_map(|hex_sig| hex::decode(hex_sig).ok())
        .collect();
    let timestamp = header.timestamp.to_string();
    let matched = secrets.iter().any(|secret| {
        let mac = signed_payload_mac(secret.expose_secret(), &timestamp, body);
        // `verify_slice` compares in constant time; every candidate is tried so the time taken
        // does not depend on which one matched.
        candidates.iter().fold(false, |found, candidate| {
            mac.clone().verify_slice(candidate).is_ok() | found
        })
    });
    if !matched {
        return Err(SignatureError::NoMatchingSignature);
    }
    if now_unix.abs_diff(header.timestamp) > tolerance_secs {
        return Err(SignatureError::TimestampOutsideTolerance { tolerance_secs });
    }
    Ok(())
}

fn signed_payload_mac(secret: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
    let mut mac =
        HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC accepts keys of any length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// Hex `v1` signature of `body` at `timestamp`, as Stripe computes it.
pub fn compute_signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mac = signed_payload_mac(secret, &timestamp.to_string(), body);
    crate::domain::hex_lower(&mac.finalize().into_bytes())
}

/// A complete `Stripe-Signature` header value for `body`, one `v1` per secret.
pub fn signature_header(secrets: &[&str], timestamp: i64, body: &[u8]) -> String {
    let mut header = format!("t={timestamp}");
    for secret in secrets {
        header.push_str(",v1=");
        header.push_str(&compute_signature(secret, timestamp, body));
    }
    header
}

/// Decimals of a Stripe amount in `currency` (docs.stripe.com/currencies). Stripe's own table,
/// not ISO 4217's: zero-decimal BIF, CLP, DJF, GNF, JPY, KMF, KRW, MGA, PYG, RWF, VND, VUV, XAF,
/// XOF, XPF (`amount: 5000` in JPY is ¥5,000; ISO gives MGA two decimals); three-decimal BHD,
/// JOD, KWD, OMR, TND; two for everything else. ISK and UGX are zero-decimal currencies that
/// Stripe still represents with two decimals "for backwards compatibility" (`500` is 5 ISK), so
/// they are two here although UGX also appears in Stripe's zero-decimal list; the special case
/// is the one that governs charge amounts. HUF and TWD are two-decimal for charges (only manual
/// payouts must be whole units).
pub fn amount_exponent(currency: &str) -> u32 {
    const ZERO_DECIMAL: [&str; 15] = [
        "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "VND", "VUV", "XAF",
        "XOF", "XPF",
    ];
    const THREE_DECIMAL: [&str; 5] = ["BHD", "JOD", "KWD", "OMR", "TND"];
    let code = currency.to_ascii_uppercase();
    if ZERO_DECIMAL.contains(&code.as_str()) {
        0
    } else if THREE_DECIMAL.contains(&code.as_str()) {
        3
    } else {
        2
    }
}

/// What every Stripe event has, read before anything that depends on its type. `data.object` is
/// kept raw: only the types sekali acts on are parsed further, so an event of any other type is
/// acknowledged whatever its object looks like (a `billing.credit_grant`'s `amount` is an object,
/// a charge's an integer).
#[derive(Deserialize)]
struct Envelope<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    /// `event` for the snapshot events sekali reads; `v2.core.event` for a thin event.
    object: Option<String>,
    #[serde(borrow)]
    data: Option<EnvelopeData<'a>>,
}

#[derive(Deserialize)]
struct EnvelopeData<'a> {
    #[serde(borrow)]
    object: &'a serde_json::value::RawValue,
}

/// The fields sekali reads from `data.object`, for every object type it handles. Unknown fields
/// are skipped without being materialised; every field is optional because each object type has
/// only some of them.
#[derive(Deserialize, Default)]
struct EventObject {
    id: Option<String>,
    amount: Option<i64>,
    amount_total: Option<i64>,
    amount_received: Option<i64>,
    amount_refunded: Option<i64>,
    amount_captured: Option<i64>,
    /// A charge: true once it is fully refunded (also when it was captured for less than its
    /// amount, where `amount_refunded` then equals `amount_captured`).
    refunded: Option<bool>,
    /// A charge: false while it is only authorised.
    captured: Option<bool>,
    currency: Option<String>,
    metadata: Option<Metadata>,
    client_reference_id: Option<String>,
    payment_intent: Option<IdOrObject>,
    /// A dispute: the charge it disputes.
    charge: Option<IdOrObject>,
    payment_status: Option<String>,
    receipt_email: Option<String>,
    customer_details: Option<Contact>,
    billing_details: Option<Contact>,
    last_payment_error: Option<PaymentError>,
}

#[derive(Deserialize, Default)]
struct Metadata {
    order_id: Option<String>,
}

#[derive(Deserialize, Default)]
struct Contact {
    email: Option<String>,
}

#[derive(Deserialize, Default)]
struct PaymentError {
    payment_method: Option<PaymentMethod>,
}

#[derive(Deserialize, Default)]
struct PaymentMethod {
    billing_details: Option<Contact>,
}

/// An expandable reference: an id, or the expanded object carrying one.
#[derive(Deserialize)]
#[serde(untagged)]
enum IdOrObject {
    Id(String),
    Object { id: String },
}

impl IdOrObject {
    fn id(&self) -> &str {
        match self {
            IdOrObject::Id(id) | IdOrObject::Object { id } => id,
        }
    }
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.trim().is_empty())
}

/// The event types sekali acts on; every other type is acknowledged as `ignored`.
pub const HANDLED_TYPES: [&str; 13] = [
    "payment_intent.processing",
    "payment_intent.succeeded",
    "payment_intent.payment_failed",
    "payment_intent.canceled",
    "checkout.session.completed",
    "checkout.session.async_payment_succeeded",
    "checkout.session.async_payment_failed",
    "checkout.session.expired",
    "charge.succeeded",
    "charge.captured",
    "charge.refunded",
    "charge.dispute.created",
    // Listed so that its absence from `target_status` is deliberate, not forgotten: a charge
    // that failed says nothing its PaymentIntent's `payment_failed` does not.
    "charge.failed",
];

/// What a thin event's answer says, and what its one warning names: sekali needs the object.
pub const THIN_EVENT_DETAIL: &str = "thin events (object v2.core.event) carry no data.object; \
    sekali cannot apply them without fetching it. Send this endpoint snapshot events instead: \
    in the Dashboard, create the event destination with the snapshot payload style";

/// Reads a verified Stripe event body into its normalised form.
pub fn parse_event(body: &[u8]) -> Result<NormalizedEvent, PayloadError> {
    let envelope: Envelope<'_> = serde_json::from_slice(body).map_err(PayloadError::from_serde)?;
    if envelope.id.is_empty() {
        return Err(PayloadError::InvalidEvent("field `id` is empty".into()));
    }
    let ignored = |detail: Option<&'static str>| NormalizedEvent {
        provider: stripe_name(),
        event_id: envelope.id.clone(),
        event_type: envelope.kind.clone(),
        order_ref: OrderRef::None,
        payment_ref: None,
        change: None,
        legacy_event_id: None,
        detail,
        retention: DEFAULT_RETENTION,
    };
    if envelope.object.as_deref() == Some("v2.core.event") {
        warn_of_thin_events_once(&envelope.kind);
        return Ok(ignored(Some(THIN_EVENT_DETAIL)));
    }
    if !HANDLED_TYPES.contains(&envelope.kind.as_str()) {
        return Ok(ignored(None));
    }
    let raw = envelope
        .data
        .ok_or_else(|| PayloadError::InvalidEvent("missing field `data`".into()))?
        .object;
    let object: EventObject =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(raw.get()))
            .map_err(|e| {
                PayloadError::InvalidEvent(format!(
                    "data.object.{}: {}",
                    e.path(),
                    super::strip_position(e.inner())
                ))
            })?;
    Ok(normalise_handled(envelope.id, envelope.kind, object))
}

/// Thin events are a setting of the endpoint, so every event it sends is thin: the first one is
/// worth a warning that says what to change, and the rest would only repeat it.
fn warn_of_thin_events_once(event_type: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            event_type = ?event_type,
            "a Stripe thin event was acknowledged and ignored: {THIN_EVENT_DETAIL} (said once per process)"
        );
    }
}

/// The status an event of a handled type reports, if it reports one.
fn target_status(kind: &str, object: &EventObject) -> Option<OrderStatus> {
    Some(match kind {
        "payment_intent.succeeded" | "checkout.session.async_payment_succeeded" => {
            OrderStatus::Paid
        }
        "checkout.session.completed" => match object.payment_status.as_deref() {
            Some("paid") | Some("no_payment_required") => OrderStatus::Paid,
            _ => OrderStatus::Pending,
        },
        "payment_intent.payment_failed" | "checkout.session.async_payment_failed" => {
            OrderStatus::Failed
        }
        "payment_intent.processing" => OrderStatus::Pending,
        "payment_intent.canceled" => OrderStatus::Cancelled,
        "checkout.session.expired" => OrderStatus::Expired,
        // A charge of the Charges API is the payment itself; one made by a PaymentIntent is
        // reported by the PaymentIntent's own events, which carry its metadata.
        "charge.succeeded" | "charge.captured" if is_legacy_charge(object) => {
            if object.captured == Some(false) {
                OrderStatus::Pending // authorised only, not yet captured
            } else {
                OrderStatus::Paid
            }
        }
        "charge.refunded" => {
            if is_fully_refunded(object) {
                OrderStatus::Refunded
            } else {
                OrderStatus::PartiallyRefunded
            }
        }
        "charge.dispute.created" => OrderStatus::Disputed,
        _ => return None,
    })
}

/// A charge made with the old Charges API: it has no PaymentIntent.
fn is_legacy_charge(object: &EventObject) -> bool {
    object.payment_intent.is_none()
}

/// Fully refunded: Stripe says so (`refunded`), or everything captured was refunded. A charge
/// captured for less than its `amount` is fully refunded at `amount_captured`, not `amount`.
fn is_fully_refunded(object: &EventObject) -> bool {
    object.refunded == Some(true)
        || matches!((object.amount_refunded, captured_amount(object.amount_captured, object.amount)), (Some(refunded), Some(captured)) if refunded >= captured)
}

/// What a charge captured: `amount_captured`, or its `amount` where that is absent or zero.
fn captured_amount(amount_captured: Option<i64>, amount: Option<i64>) -> Option<i64> {
    amount_captured.filter(|&captured| captured > 0).or(amount)
}

fn normalise_handled(event_id: String, kind: String, object: EventObject) -> NormalizedEvent {
    let is_charge = kind.starts_with("charge.") && kind != "charge.dispute.created";
    let is_dispute = kind == "charge.dispute.created";
    let payment_intent = non_empty(if kind.starts_with("payment_intent.") {
        object.id.clone()
    } else {
        object.payment_intent.as_ref().map(|pi| pi.id().to_owned())
    });
    // How the order is found when the event does not name it: its PaymentIntent, or for a
    // charge of the Charges API, which has none, the charge itself (a dispute names it).
    let payment_ref = payment_intent.or_else(|| {
        if is_charge {
            non_empty(object.id.clone())
        } else if is_dispute {
            non_empty(object.charge.as_ref().map(|c| c.id().to_owned()))
        } else {
            None
        }
    });
    let target = target_status(&kind, &object);

    let order_id = non_empty(object.metadata.and_then(|m| m.order_id))
        .or_else(|| non_empty(object.client_reference_id));
    let order_ref = match (order_id, &payment_ref) {
        (Some(order_id), _) => OrderRef::OrderId(order_id),
        (None, Some(reference)) => OrderRef::Payment {
            reference: reference.clone(),
            // Charges and disputes can arrive before the event that links their payment to
            // its order, and must then wait for it rather than be dropped.
            park_if_unlinked: is_charge || is_dispute,
        },
        (None, None) => OrderRef::None,
    };

    let change = target.map(|target| {
        let customer_email = non_empty(object.receipt_email)
            .or_else(|| non_empty(object.customer_details.and_then(|c| c.email)))
            .or_else(|| non_empty(object.billing_details.and_then(|c| c.email)))
            .or_else(|| {
                non_empty(
                    object
                        .last_payment_error
                        .and_then(|e| e.payment_method)
                        .and_then(|m| m.billing_details)
                        .and_then(|c| c.email),
                )
            });
        let currency = non_empty(object.currency);
        StatusChange {
            target,
            // A dispute's amount is the disputed sum, not the order's.
            amount: if is_dispute {
                None
            } else {
                object.amount_total.or(object.amount)
            },
            paid_amount: if kind.starts_with("payment_intent.") {
                object.amount_received
            } else if kind.starts_with("checkout.session.") {
                object.amount_total
            } else if kind == "charge.succeeded" || kind == "charge.captured" {
                captured_amount(object.amount_captured, object.amount)
            } else {
                None
            },
            refunded_amount: (kind == "charge.refunded")
                .then_some(object.amount_refunded.unwrap_or(0)),
            exponent: currency.as_deref().map(amount_exponent),
            currency,
            customer_email: customer_email.and_then(|e| EmailAddress::parse(&e).ok()),
            reverses_payment: false,
        }
    });

    NormalizedEvent {
        provider: stripe_name(),
        event_id,
        event_type: kind,
        order_ref,
        payment_ref,
        change,
        legacy_event_id: None,
        detail: None,
        retention: DEFAULT_RETENTION,
    }
}

fn stripe_name() -> ProviderName {
    ProviderName::new("stripe").expect("a valid name")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(list: &[&str]) -> Vec<SecretString> {
        list.iter()
            .map(|s| SecretString::from(s.to_string()))
            .collect()
    }

    /// Fully refunded: Stripe's `refunded` flag, or everything captured refunded; each
    /// condition alone is enough, and `amount` counts only when nothing says what was captured.
    #[test]
    fn a_charge_is_fully_refunded_by_its_flag_or_by_refunding_what_was_captured() {
        // (refunded, amount, amount_captured, amount_refunded) -> fully refunded
        #[rustfmt::skip]
        let table = [
            // Captured 6,000 of 10,000 and refunded 6,000: both conditions hold.
            (Some(true), Some(10_000), Some(6_000), Some(6_000), true),
            // Stripe's own flag alone, with less refunded than captured.
            (Some(true), Some(10_000), Some(6_000), Some(4_000), true),
            (Some(true), Some(10_000), Some(10_000), Some(0), true),
            // Everything captured refunded, the flag false or absent: refunded == captured
            // < amount.
            (Some(false), Some(10_000), Some(6_000), Some(6_000), true),
            (None, Some(10_000), Some(6_000), Some(6_000), true),
            (Some(false), Some(10_000), Some(6_000), Some(7_000), true),
            // Less than captured, and no flag: partly.
            (Some(false), Some(10_000), Some(6_000), Some(5_999), false),
            (Some(false), Some(10_000), Some(10_000), Some(6_000), false),
            // Nothing captured said (or 0, as on an object older than amount_captured): the
            // amount.
            (Some(false), Some(10_000), None, Some(10_000), true),
            (Some(false), Some(10_000), Some(0), Some(10_000), true),
            (Some(false), Some(10_000), None, Some(6_000), false),
            (Some(false), None, None, Some(6_000), false),
        ];
        for (refunded, amount, amount_captured, amount_refunded, full) in table {
            let charge = EventObject {
                refunded,
                amount,
                amount_captured,
                amount_refunded,
                ..EventObject::default()
            };
            assert_eq!(
                is_fully_refunded(&charge),
                full,
                "refunded {refunded:?}, amount {amount:?}, captured {amount_captured:?}, \
                 refunded amount {amount_refunded:?}"
            );
        }
    }

    /// The same through `parse_event`, from the fixture of a charge captured for 6,000 of its
    /// 10,000: the status and the refunded amount each branch reports.
    #[test]
    fn a_partial_capture_refund_reports_refunded_by_either_condition_alone() {
        let fixture: serde_json::Value = serde_json::from_str(include_str!(
            "../../fixtures/stripe/charge.refunded.partial_capture.json"
        ))
        .unwrap();
        for (refunded, amount_refunded, target) in [
            (true, 4_000, OrderStatus::Refunded),
            (false, 6_000, OrderStatus::Refunded),
            (false, 4_000, OrderStatus::PartiallyRefunded),
        ] {
            let mut event = fixture.clone();
            event["data"]["object"]["refunded"] = refunded.into();
            event["data"]["object"]["amount_refunded"] = amount_refunded.into();
            let change = parse_event(&serde_json::to_vec(&event).unwrap())
                .unwrap()
                .change
                .unwrap();
            assert_eq!(
                (change.target, change.refunded_amount),
                (target, Some(amount_refunded)),
                "refunded {refunded}, amount_refunded {amount_refunded}"
            );
        }
    }

    #[test]
    fn a_signature_from_any_configured_secret_is_accepted() {
        let body = br#"{"id":"evt_1"}"#;
        let header = signature_header(&["whsec_old", "whsec_new"], 1000, body);
        let configured = secrets(&["whsec_new"]);
        assert_eq!(
            verify_stripe_signature(Some(&header), body, &configured, 1000, 300),
            Ok(())
        );
    }

    #[test]
    fn the_tolerance_applies_to_the_past_and_the_future() {
        let body = b"{}";
        let header = signature_header(&["whsec_a"], 1000, body);
        let s = secrets(&["whsec_a"]);
        assert!(verify_stripe_signature(Some(&header), body, &s, 1300, 300).is_ok());
        assert!(verify_stripe_signature(Some(&header), body, &s, 700, 300).is_ok());
        let late = verify_stripe_signature(Some(&header), body, &s, 1301, 300);
        let early = verify_stripe_signature(Some(&header), body, &s, 699, 300);
        let expected = Err(SignatureError::TimestampOutsideTolerance {
            tolerance_secs: 300,
        });
        assert_eq!(late, expected);
        assert_eq!(early, expected);
    }

    #[test]
    fn header_parser_names_each_malformation() {
        use SignatureError::MalformedHeader;
        assert_eq!(parse_signature_header(""), Err(MalformedHeader("empty")));
        assert_eq!(
            parse_signature_header("v1=ab"),
            Err(MalformedHeader("no timestamp"))
        );
        assert_eq!(
            parse_signature_header("t=1,t=2,v1=ab"),
            Err(MalformedHeader("more than one timestamp"))
        );
        assert_eq!(
            parse_signature_header("t=1,v0=ab"),
            Err(MalformedHeader("no v1 signature"))
        );
        assert_eq!(
            parse_signature_header("t=x,v1=ab"),
            Err(MalformedHeader("timestamp is not an integer"))
        );
        assert_eq!(
            parse_signature_header("garbage"),
            Err(MalformedHeader("expected key=value pairs"))
        );
    }
}
