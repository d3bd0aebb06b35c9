//! Stripe: `Stripe-Signature` verification over the raw body, and event normalisation.
//!
//! Verification follows the official libraries: the header is `t=<unix>,v1=<hex>[,v1=<hex>…]`,
//! each `v1` is hex HMAC-SHA256 keyed by the whole `whsec_…` string over `"{t}.{raw body}"`.
//! Every `v1` is tried against every configured secret (a delivery during secret rotation carries
//! one `v1` per active secret), `v0` and unknown schemes are ignored, and the comparison is
//! constant-time. Unlike stripe-node, the tolerance applies in both directions.

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sha2::Sha256;

use super::PayloadError;
use crate::domain::{NormalizedEvent, OrderRef, OrderStatus, Provider, StatusChange};

type HmacSha256 = Hmac<Sha256>;

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
    #[error("no signature matches any configured secret")]
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

#[derive(Deserialize)]
struct Event {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    data: EventData,
}

#[derive(Deserialize)]
struct EventData {
    object: EventObject,
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
    currency: Option<String>,
    metadata: Option<Metadata>,
    client_reference_id: Option<String>,
    payment_intent: Option<IdOrObject>,
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
    fn into_id(self) -> String {
        match self {
            IdOrObject::Id(id) | IdOrObject::Object { id } => id,
        }
    }
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.trim().is_empty())
}

/// Reads a verified Stripe event body into its normalised form.
pub fn parse_event(body: &[u8]) -> Result<NormalizedEvent, PayloadError> {
    let event: Event = serde_json::from_slice(body).map_err(PayloadError::from_serde)?;
    if event.id.is_empty() {
        return Err(PayloadError::InvalidEvent("field `id` is empty".into()));
    }
    let object = event.data.object;
    let kind = event.kind.as_str();

    let is_charge_or_dispute = kind.starts_with("charge.");
    let payment_intent_id = if kind.starts_with("payment_intent.") {
        non_empty(object.id.clone())
    } else {
        non_empty(object.payment_intent.map(IdOrObject::into_id))
    };

    let target = match kind {
        "payment_intent.succeeded" | "checkout.session.async_payment_succeeded" => {
            Some(OrderStatus::Paid)
        }
        "checkout.session.completed" => match object.payment_status.as_deref() {
            Some("paid") | Some("no_payment_required") => Some(OrderStatus::Paid),
            _ => Some(OrderStatus::Pending),
        },
        "payment_intent.payment_failed" | "checkout.session.async_payment_failed" => {
            Some(OrderStatus::Failed)
        }
        "payment_intent.processing" => Some(OrderStatus::Pending),
        "charge.refunded" => match (object.amount_refunded, object.amount) {
            (Some(refunded), Some(amount)) if refunded >= amount => Some(OrderStatus::Refunded),
            _ => Some(OrderStatus::PartiallyRefunded),
        },
        "charge.dispute.created" => Some(OrderStatus::Disputed),
        _ => None,
    };

    let order_id = non_empty(object.metadata.and_then(|m| m.order_id))
        .or_else(|| non_empty(object.client_reference_id));
    let order_ref = match (order_id, &payment_intent_id) {
        (Some(order_id), _) => OrderRef::OrderId(order_id),
        (None, Some(pi)) => OrderRef::PaymentIntent {
            payment_intent_id: pi.clone(),
            park_if_unlinked: is_charge_or_dispute,
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
        StatusChange {
            target,
            // A dispute's amount is the disputed sum, not the order's.
            amount: match kind {
                "charge.dispute.created" => None,
                _ => object.amount_total.or(object.amount),
            },
            paid_amount: if kind.starts_with("payment_intent.") {
                object.amount_received
            } else if kind.starts_with("checkout.session.") {
                object.amount_total
            } else {
                None
            },
            refunded_amount: (kind == "charge.refunded")
                .then_some(object.amount_refunded.unwrap_or(0)),
            currency: non_empty(object.currency),
            customer_email,
        }
    });

    Ok(NormalizedEvent {
        provider: Provider::Stripe,
        event_id: event.id,
        event_type: event.kind,
        order_ref,
        payment_intent_id,
        change,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(list: &[&str]) -> Vec<SecretString> {
        list.iter()
            .map(|s| SecretString::from(s.to_string()))
            .collect()
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
