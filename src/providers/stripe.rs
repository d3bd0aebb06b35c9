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
use crate::domain::ledger::{
    Attempt, Dispute, DisputeStage, PaymentFacts, Refund, RefundState, RefundedSnapshot,
};
use crate::domain::money::iso_exponent;
use crate::domain::{EmailAddress, NormalizedEvent, OrderRef, PaymentReport, ProviderName};

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
    read_stored: |_, body| parse_event(body),
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
    /// When the event happened (Unix seconds): orders what a payment's facts say over time (a
    /// refund that failed after a charge reported it). A thin event writes it as text; it is
    /// read only from a snapshot event, whose `created` is a number.
    #[serde(default)]
    created: Option<serde_json::Value>,
    /// The API version the object is rendered in: before `2025-03-31.basil`, releasing an
    /// authorisation created a Refund.
    #[serde(default)]
    api_version: Option<String>,
    #[serde(borrow)]
    data: Option<EnvelopeData<'a>>,
}

#[derive(Deserialize)]
struct EnvelopeData<'a> {
    #[serde(borrow)]
    object: &'a serde_json::value::RawValue,
}

/// The fields sekali reads from `data.object`, for every object type it handles (PaymentIntent,
/// Checkout Session, Charge, Refund, Dispute, Invoice). Unknown fields are skipped without being
/// materialised; every field is optional because each object type has only some of them.
#[derive(Deserialize, Default)]
struct EventObject {
    id: Option<String>,
    amount: Option<i64>,
    amount_total: Option<i64>,
    amount_received: Option<i64>,
    amount_refunded: Option<i64>,
    amount_captured: Option<i64>,
    amount_capturable: Option<i64>,
    /// An invoice: what its payment took.
    amount_paid: Option<i64>,
    /// A charge: false while it is only authorised.
    captured: Option<bool>,
    currency: Option<String>,
    /// A refund's or a dispute's status.
    status: Option<String>,
    /// A PaymentIntent's reason for being canceled.
    cancellation_reason: Option<String>,
    metadata: Option<Metadata>,
    client_reference_id: Option<String>,
    payment_intent: Option<IdOrObject>,
    /// A dispute's, refund's or invoice's charge.
    charge: Option<IdOrObject>,
    /// A Checkout Session in subscription mode: its first invoice, which took the money.
    invoice: Option<IdOrObject>,
    payment_status: Option<String>,
    receipt_email: Option<String>,
    customer_details: Option<Contact>,
    billing_details: Option<Contact>,
    last_payment_error: Option<PaymentError>,
    /// A charge's refunds, when the event lists them.
    refunds: Option<RefundList>,
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

#[derive(Deserialize, Default)]
struct RefundList {
    #[serde(default)]
    data: Vec<ListedRefund>,
}

#[derive(Deserialize)]
struct ListedRefund {
    id: String,
    amount: i64,
    status: Option<String>,
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

fn id_of(reference: &Option<IdOrObject>) -> Option<String> {
    non_empty(reference.as_ref().map(|r| r.id().to_owned()))
}

/// The event types sekali acts on; every other type is acknowledged as `ignored`.
pub const HANDLED_TYPES: [&str; 27] = [
    "payment_intent.processing",
    "payment_intent.requires_action",
    "payment_intent.amount_capturable_updated",
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
    "charge.failed",
    "charge.expired",
    "charge.refund.updated",
    "refund.created",
    "refund.updated",
    "refund.failed",
    "charge.dispute.created",
    "charge.dispute.updated",
    "charge.dispute.closed",
    "charge.dispute.funds_withdrawn",
    "charge.dispute.funds_reinstated",
    "invoice.paid",
    "invoice.payment_succeeded",
    "invoice.payment_failed",
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
        payment: None,
        payer_email: None,
        legacy_event_id: None,
        detail,
        retention: DEFAULT_RETENTION,
        headers: None,
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
    let context = Context {
        kind: &envelope.kind,
        at: envelope
            .created
            .as_ref()
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0),
        releases_are_refunds: releases_are_refunds(envelope.api_version.as_deref()),
    };
    normalise_handled(envelope.id.clone(), &context, object)
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

/// True for an event rendered in an API version before `2025-03-31.basil`, in which releasing an
/// authorisation (cancelling an uncaptured payment, capturing less than was authorised) created a
/// Refund of the released amount, counted in the charge's `amount_refunded`. From basil on, no
/// such Refund exists. An event without a version is taken as a current one.
fn releases_are_refunds(api_version: Option<&str>) -> bool {
    api_version.is_some_and(|version| version.get(..10).is_some_and(|date| date < "2025-03-31"))
}

/// What the envelope says that the object's facts depend on.
struct Context<'a> {
    kind: &'a str,
    /// The event's `created` (0 when absent).
    at: i64,
    releases_are_refunds: bool,
}

/// An amount of the object in Stripe's units of `currency`, in ISO 4217 minor units, which the
/// ledger counts in: Stripe still sends ISK and UGX with two decimals, which ISO gives none, so
/// `50000` ISK is ISK 500.
fn iso_units(amount: Option<i64>, currency: &str) -> Option<i64> {
    amount.map(|a| {
        crate::domain::decision::rescale(a, amount_exponent(currency), iso_exponent(currency))
    })
}

/// The attempt state a canceled PaymentIntent reports: abandoned, expired or automatic is an
/// attempt that ran out, anything else (requested by the customer, duplicate, fraudulent) one that
/// was called off.
fn canceled_attempt(reason: Option<&str>) -> Attempt {
    match reason {
        Some("abandoned" | "automatic" | "expired" | "void_invoice") => Attempt::Expired,
        _ => Attempt::Canceled,
    }
}

/// A refund's status as the ledger ranks it.
fn refund_state(status: Option<&str>) -> RefundState {
    match status {
        Some("succeeded") => RefundState::Succeeded,
        Some("failed" | "canceled") => RefundState::Failed,
        // pending, requires_action, or none said (a refund listed without one was made)
        Some(_) => RefundState::Pending,
        None => RefundState::Succeeded,
    }
}

fn normalise_handled(
    event_id: String,
    context: &Context<'_>,
    object: EventObject,
) -> Result<NormalizedEvent, PayloadError> {
    let kind = context.kind;
    let order_id = non_empty(object.metadata.as_ref().and_then(|m| m.order_id.clone()))
        .or_else(|| non_empty(object.client_reference_id.clone()));
    let payer_email = non_empty(object.receipt_email.clone())
        .or_else(|| {
            non_empty(
                object
                    .customer_details
                    .as_ref()
                    .and_then(|c| c.email.clone()),
            )
        })
        .or_else(|| {
            non_empty(
                object
                    .billing_details
                    .as_ref()
                    .and_then(|c| c.email.clone()),
            )
        })
        .or_else(|| {
            non_empty(
                object
                    .last_payment_error
                    .as_ref()
                    .and_then(|e| e.payment_method.as_ref())
                    .and_then(|m| m.billing_details.as_ref())
                    .and_then(|c| c.email.clone()),
            )
        })
        .and_then(|e| EmailAddress::parse(&e).ok());
    let payment = payment_report(context, &object)?;
    let order_ref = match (order_id, &payment) {
        (Some(order_id), _) => OrderRef::OrderId(order_id),
        (None, Some(_)) => OrderRef::Payment,
        (None, None) => OrderRef::None,
    };
    Ok(NormalizedEvent {
        provider: stripe_name(),
        event_id,
        event_type: kind.to_owned(),
        order_ref,
        payment,
        payer_email,
        legacy_event_id: None,
        detail: None,
        retention: DEFAULT_RETENTION,
        headers: None,
    })
}

/// The payment the event is about, and what it says of it; `None` when it names none or took no
/// money and tried to take none (a Checkout Session that only saved a payment method).
fn payment_report(
    context: &Context<'_>,
    object: &EventObject,
) -> Result<Option<PaymentReport>, PayloadError> {
    let kind = context.kind;
    let at = context.at;
    let currency = non_empty(object.currency.clone()).map(|c| c.to_ascii_uppercase());
    let code = currency.clone().unwrap_or_default();
    let units = |amount: Option<i64>| iso_units(amount, &code);
    let mut facts = PaymentFacts {
        currency: currency.clone(),
        ..PaymentFacts::default()
    };
    let mut aliases = Vec::new();
    let reference = match kind.split_once('.').map_or(kind, |(prefix, _)| prefix) {
        "payment_intent" => {
            facts.requested = units(object.amount);
            match kind {
                "payment_intent.succeeded" => {
                    facts.captured = units(object.amount_received.or(object.amount));
                    facts.captured_at = Some(at);
                }
                "payment_intent.payment_failed" => facts.attempt = Some((Attempt::Failed, at)),
                "payment_intent.canceled" => {
                    facts.attempt =
                        Some((canceled_attempt(object.cancellation_reason.as_deref()), at));
                    // An authorisation held and given back.
                    facts.released = units(object.amount_capturable.filter(|&a| a > 0));
                }
                "payment_intent.amount_capturable_updated" => {
                    facts.authorized = units(object.amount_capturable);
                    facts.attempt = Some((Attempt::Pending, at));
                }
                _ => facts.attempt = Some((Attempt::Pending, at)),
            }
            non_empty(object.id.clone())
        }
        "checkout" => {
            let paid = object.payment_status.as_deref() == Some("paid");
            facts.requested = units(object.amount_total);
            match kind {
                "checkout.session.completed" | "checkout.session.async_payment_succeeded"
                    if paid =>
                {
                    facts.captured = units(object.amount_total);
                    facts.captured_at = Some(at);
                }
                // A session that collects nothing (setup mode, or a free order) takes no money
                // and is no payment.
                "checkout.session.completed"
                    if object.payment_status.as_deref() == Some("no_payment_required") =>
                {
                    return Ok(None);
                }
                "checkout.session.async_payment_failed" => {
                    facts.attempt = Some((Attempt::Failed, at));
                }
                "checkout.session.expired" => facts.attempt = Some((Attempt::Expired, at)),
                _ => facts.attempt = Some((Attempt::Pending, at)),
            }
            // The PaymentIntent, else (subscription mode) the first invoice, else the session.
            id_of(&object.payment_intent)
                .or_else(|| id_of(&object.invoice))
                .or_else(|| non_empty(object.id.clone()))
        }
        "charge" if kind.starts_with("charge.dispute.") => {
            let id = non_empty(object.id.clone()).ok_or_else(|| missing("id"))?;
            let stage = object
                .status
                .as_deref()
                .and_then(DisputeStage::of_stripe_status)
                .ok_or_else(|| missing("status"))?;
            facts.disputes.insert(
                id,
                Dispute {
                    amount: units(object.amount).unwrap_or(0),
                    stage,
                    withdrawn: kind == "charge.dispute.funds_withdrawn",
                    reinstated: kind == "charge.dispute.funds_reinstated",
                },
            );
            id_of(&object.payment_intent).or_else(|| id_of(&object.charge))
        }
        "charge" if kind == "charge.refund.updated" => {
            refund_facts(&mut facts, object, at, &units)?;
            id_of(&object.payment_intent).or_else(|| id_of(&object.charge))
        }
        "refund" => {
            refund_facts(&mut facts, object, at, &units)?;
            id_of(&object.payment_intent).or_else(|| id_of(&object.charge))
        }
        "charge" => {
            charge_facts(&mut facts, context, object, &units);
            // A charge of the Charges API is a payment of its own; one made by a PaymentIntent
            // is its PaymentIntent's.
            id_of(&object.payment_intent).or_else(|| non_empty(object.id.clone()))
        }
        "invoice" => {
            match kind {
                "invoice.payment_failed" => facts.attempt = Some((Attempt::Failed, at)),
                _ => {
                    facts.captured = units(object.amount_paid);
                    facts.captured_at = Some(at);
                }
            }
            // The invoice is the payment (a subscription checkout names it); its PaymentIntent
            // and charge, which refunds and disputes will name, are the same payment.
            aliases.extend(id_of(&object.payment_intent));
            aliases.extend(id_of(&object.charge));
            non_empty(object.id.clone())
        }
        _ => None,
    };
    Ok(reference.map(|reference| PaymentReport {
        reference,
        aliases,
        facts,
    }))
}

fn missing(field: &str) -> PayloadError {
    PayloadError::InvalidEvent(format!("data.object.{field}: missing or unknown"))
}

/// A refund object's facts: the refund by its id, its state, and when it failed.
fn refund_facts(
    facts: &mut PaymentFacts,
    object: &EventObject,
    at: i64,
    units: &dyn Fn(Option<i64>) -> Option<i64>,
) -> Result<(), PayloadError> {
    let id = non_empty(object.id.clone()).ok_or_else(|| missing("id"))?;
    let state = refund_state(object.status.as_deref());
    facts.refunds.insert(
        id,
        Refund {
            amount: units(object.amount).unwrap_or(0),
            state,
            failed_at: (state == RefundState::Failed).then_some(at),
        },
    );
    Ok(())
}

/// A charge's facts: what it authorised, captured and released, its refunds by id and its
/// cumulative refunded amount, and an attempt that failed or expired.
fn charge_facts(
    facts: &mut PaymentFacts,
    context: &Context<'_>,
    object: &EventObject,
    units: &dyn Fn(Option<i64>) -> Option<i64>,
) {
    let at = context.at;
    let amount = object.amount.unwrap_or(0);
    let captured = object.captured != Some(false);
    // What the charge took: `amount_captured`, or its `amount` on objects older than that field
    // (or giving 0 for it) that say they were captured.
    let captured_amount = if captured {
        object.amount_captured.filter(|&c| c > 0).unwrap_or(amount)
    } else {
        0
    };
    facts.requested = units(Some(amount));
    facts.authorized = units(Some(amount));
    match context.kind {
        "charge.failed" => facts.attempt = Some((Attempt::Failed, at)),
        "charge.expired" => {
            facts.attempt = Some((Attempt::Expired, at));
            facts.released = units(Some(amount));
        }
        _ if !captured => facts.attempt = Some((Attempt::Pending, at)),
        _ => {}
    }
    if captured_amount > 0 && context.kind != "charge.failed" {
        facts.captured = units(Some(captured_amount));
        facts.captured_at = Some(at);
        // Capturing less than was authorised gives the rest back.
        if captured_amount < amount {
            facts.released = units(Some(amount - captured_amount));
        }
    }
    let refunded = object.amount_refunded.unwrap_or(0);
    if !captured && object.amount_refunded.is_some_and(|r| r > 0) {
        // Refunding an uncaptured charge releases its authorisation: no money moved, whatever
        // the API version (only older ones report it so).
        facts.released = units(Some(amount));
        facts.released_as_refunds = units(Some(refunded));
    } else if context.releases_are_refunds && captured_amount < amount && refunded > 0 {
        // Before basil, a partial capture's remainder was given back as a Refund.
        facts.released_as_refunds = units(Some((amount - captured_amount).min(refunded)));
    }
    if context.kind == "charge.refunded" || refunded > 0 {
        facts.refunded_snapshot =
            units(Some(refunded)).map(|amount| RefundedSnapshot { amount, at });
    }
    if let Some(list) = &object.refunds {
        for listed in &list.data {
            let state = refund_state(listed.status.as_deref());
            facts.refunds.insert(
                listed.id.clone(),
                Refund {
                    amount: units(Some(listed.amount)).unwrap_or(0),
                    state,
                    failed_at: (state == RefundState::Failed).then_some(at),
                },
            );
        }
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

    fn facts_of(fixture: &serde_json::Value) -> (String, PaymentFacts) {
        let event = parse_event(&serde_json::to_vec(fixture).unwrap()).unwrap();
        let payment = event.payment.expect("a payment");
        (payment.reference, payment.facts)
    }

    fn fixture(name: &str) -> serde_json::Value {
        let path = format!("{}/fixtures/stripe/{name}.json", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    }

    /// A charge captured for 6,000 of its 10,000 (basil): 6,000 taken, 4,000 released, and a
    /// refund of the 6,000 gives back 6,000, not 10,000.
    #[test]
    fn a_partial_captures_remainder_is_released_not_refunded() {
        let mut event = fixture("charge.refunded.partial_capture");
        let (reference, facts) = facts_of(&event);
        assert_eq!(reference, "pi_3QA0015Order1009");
        assert_eq!(
            (facts.captured, facts.released, facts.returned()),
            (Some(6_000), Some(4_000), 6_000)
        );
        // The same charge before basil, after capture only: its remainder was a Refund.
        event["api_version"] = "2024-06-20".into();
        event["data"]["object"]["amount_refunded"] = 4_000.into();
        event["data"]["object"]["refunded"] = false.into();
        event["data"]["object"]["refunds"] = serde_json::Value::Null;
        let (_, facts) = facts_of(&event);
        assert_eq!(
            (facts.released_as_refunds, facts.returned()),
            (Some(4_000), 0)
        );
        // And once the 6,000 is refunded too: 10,000 refunded, of which 6,000 is money.
        event["data"]["object"]["amount_refunded"] = 10_000.into();
        let (_, facts) = facts_of(&event);
        assert_eq!(facts.returned(), 6_000);
    }

    /// Refunding an uncaptured charge releases it: nothing was taken, nothing is returned.
    #[test]
    fn a_released_authorisation_returns_no_money() {
        let mut event = fixture("charge.refunded.full");
        let object = &mut event["data"]["object"];
        object["captured"] = false.into();
        object["amount_captured"] = 0.into();
        object["refunded"] = true.into();
        object["amount_refunded"] = object["amount"].clone();
        let (_, facts) = facts_of(&event);
        assert_eq!((facts.captured(), facts.returned()), (0, 0));
        assert_eq!(facts.released, Some(2_500));
    }

    /// ISK is two-decimal at Stripe and zero at ISO 4217: the ledger counts ISK 500, not 50,000.
    #[test]
    fn amounts_are_counted_in_iso_units() {
        let mut event = fixture("payment_intent.succeeded");
        event["data"]["object"]["currency"] = "isk".into();
        event["data"]["object"]["amount"] = 50_000.into();
        event["data"]["object"]["amount_received"] = 50_000.into();
        let (_, facts) = facts_of(&event);
        assert_eq!(
            (facts.currency.as_deref(), facts.captured),
            (Some("ISK"), Some(500))
        );
    }

    /// A Checkout Session that collects nothing is no payment; a canceled PaymentIntent is
    /// called off unless it was abandoned or expired.
    #[test]
    fn sessions_without_money_and_cancellations_say_what_happened() {
        let mut setup = fixture("checkout.session.completed");
        setup["data"]["object"]["mode"] = "setup".into();
        setup["data"]["object"]["payment_status"] = "no_payment_required".into();
        setup["data"]["object"]["amount_total"] = serde_json::Value::Null;
        let event = parse_event(&serde_json::to_vec(&setup).unwrap()).unwrap();
        assert_eq!(event.payment, None);
        let mut canceled = fixture("payment_intent.canceled");
        let (_, facts) = facts_of(&canceled);
        assert_eq!(facts.attempt().as_str(), "canceled");
        canceled["data"]["object"]["cancellation_reason"] = "abandoned".into();
        let (_, facts) = facts_of(&canceled);
        assert_eq!(facts.attempt().as_str(), "expired");
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
