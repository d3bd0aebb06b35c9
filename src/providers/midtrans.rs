//! Midtrans HTTP notifications: `signature_key` verification and normalisation.
//!
//! `signature_key` is hex SHA-512 of `order_id + status_code + gross_amount + server key`, over
//! the strings exactly as sent. It is not an HMAC and carries no timestamp: a captured
//! notification verifies forever, so replays are neutralised by deduplication and the
//! forward-only state machine, not by the signature.
//!
//! Midtrans sends no event id. sekali derives one that is the same for every retry of one
//! notification and differs between distinct status changes:
//! `order_id:transaction_status:status_code[:fraud_status][:refund identity]`, where the refund
//! identity (refund notifications only) is the newest `refunds[].refund_key`, else that refund's
//! `refund_chargeback_id`, else the cumulative refunded amount in minor units.

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sha2::{Digest, Sha512};
use subtle::ConstantTimeEq;

use super::PayloadError;
use crate::domain::money::parse_decimal_minor_units;
use crate::domain::{NormalizedEvent, OrderRef, OrderStatus, Provider, StatusChange};

/// Midtrans amounts are rupiah; notifications without a `currency` field are IDR.
pub const DEFAULT_CURRENCY: &str = "IDR";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("signature_key does not match")]
    Mismatch,
}

/// A field Midtrans sends as a string but that could arrive as a JSON number, kept as its text
/// exactly as sent (a string's contents, or a number's digits untouched: `150000.00` stays
/// `"150000.00"`, not `"150000.0"`), because the signature is computed over the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(String);

impl Text {
    pub fn as_text(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw: &serde_json::value::RawValue = Deserialize::deserialize(deserializer)?;
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'"') => serde_json::from_str(text)
                .map(Text)
                .map_err(D::Error::custom),
            Some(b'-' | b'0'..=b'9') => Ok(Text(text.to_owned())),
            _ => Err(D::Error::custom("expected a string or a number")),
        }
    }
}

/// The fields of a notification sekali reads; Midtrans adds fields without notice, so anything
/// else is skipped.
#[derive(Debug, Clone, Deserialize)]
pub struct Notification {
    pub order_id: String,
    pub status_code: Text,
    pub gross_amount: Text,
    pub signature_key: String,
    pub transaction_status: String,
    pub fraud_status: Option<String>,
    pub currency: Option<String>,
    pub refund_amount: Option<Text>,
    #[serde(default)]
    pub refunds: Vec<Refund>,
    pub customer_details: Option<CustomerDetails>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Refund {
    pub refund_key: Option<String>,
    pub refund_chargeback_id: Option<Text>,
    pub refund_amount: Option<Text>,
    pub created_at: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CustomerDetails {
    pub email: Option<String>,
}

/// Parses a notification body; errors name the missing or malformed field.
pub fn parse_notification(body: &[u8]) -> Result<Notification, PayloadError> {
    let notification: Notification =
        serde_json::from_slice(body).map_err(PayloadError::from_serde)?;
    if notification.order_id.is_empty() {
        return Err(PayloadError::InvalidEvent(
            "field `order_id` is empty".into(),
        ));
    }
    Ok(notification)
}

/// Hex SHA-512 of `order_id + status_code + gross_amount + server_key`.
pub fn compute_signature_key(
    order_id: &str,
    status_code: &str,
    gross_amount: &str,
    server_key: &str,
) -> String {
    let mut hasher = Sha512::new();
    hasher.update(order_id.as_bytes());
    hasher.update(status_code.as_bytes());
    hasher.update(gross_amount.as_bytes());
    hasher.update(server_key.as_bytes());
    crate::domain::hex_lower(&hasher.finalize())
}

/// Verifies `signature_key` in constant time.
pub fn verify_midtrans_signature(
    notification: &Notification,
    server_key: &SecretString,
) -> Result<(), SignatureError> {
    let expected = compute_signature_key(
        &notification.order_id,
        notification.status_code.as_text(),
        notification.gross_amount.as_text(),
        server_key.expose_secret(),
    );
    let received = notification.signature_key.to_ascii_lowercase();
    if bool::from(expected.as_bytes().ct_eq(received.as_bytes())) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

impl Notification {
    /// The refunded total in minor units: the sum of `refunds[].refund_amount`, else the
    /// top-level `refund_amount`.
    pub fn refunded_amount(&self) -> Option<i64> {
        if !self.refunds.is_empty() {
            return self.refunds.iter().try_fold(0i64, |sum, refund| {
                let amount = refund.refund_amount.as_ref()?;
                sum.checked_add(parse_decimal_minor_units(amount.as_text())?)
            });
        }
        self.refund_amount
            .as_ref()
            .and_then(|a| parse_decimal_minor_units(a.as_text()))
    }

    fn is_refund(&self) -> bool {
        matches!(
            self.transaction_status.as_str(),
            "refund" | "partial_refund"
        )
    }

    /// The refund identity used in the derived event id, for refund notifications.
    fn refund_identity(&self) -> Option<String> {
        // Newest by created_at ("YYYY-MM-DD HH:MM:SS" sorts as text); on a tie, or without
        // timestamps, the later entry in the list.
        let newest = self
            .refunds
            .iter()
            .enumerate()
            .max_by(|(ia, a), (ib, b)| a.created_at.cmp(&b.created_at).then(ia.cmp(ib)))
            .map(|(_, refund)| refund);
        if let Some(refund) = newest {
            if let Some(key) = refund.refund_key.as_deref().filter(|k| !k.is_empty()) {
                return Some(key.to_owned());
            }
            if let Some(id) = &refund.refund_chargeback_id {
                return Some(id.as_text().to_owned());
            }
        }
        self.refunded_amount().map(|amount| amount.to_string())
    }

    /// `order_id:transaction_status:status_code[:fraud_status][:refund identity]`.
    pub fn derived_event_id(&self) -> String {
        let mut id = format!(
            "{}:{}:{}",
            self.order_id,
            self.transaction_status,
            self.status_code.as_text()
        );
        if let Some(fraud) = self.fraud_status.as_deref().filter(|f| !f.is_empty()) {
            id.push(':');
            id.push_str(fraud);
        }
        if self.is_refund() {
            if let Some(identity) = self.refund_identity() {
                id.push(':');
                id.push_str(&identity);
            }
        }
        id
    }

    fn target_status(&self) -> Option<OrderStatus> {
        let fraud = self.fraud_status.as_deref();
        Some(match self.transaction_status.as_str() {
            "settlement" => OrderStatus::Paid,
            "capture" => match fraud {
                None | Some("") | Some("accept") => OrderStatus::Paid,
                Some("challenge") => OrderStatus::Pending,
                Some("deny") => OrderStatus::Cancelled,
                Some(_) => return None,
            },
            "pending" => OrderStatus::Pending,
            "deny" | "cancel" => OrderStatus::Cancelled,
            "expire" => OrderStatus::Expired,
            "failure" => OrderStatus::Failed,
            "refund" => OrderStatus::Refunded,
            "partial_refund" => OrderStatus::PartiallyRefunded,
            // `authorize` (a card pre-authorisation) and anything new: recorded, not acted on.
            _ => return None,
        })
    }

    /// The provider-independent form of this notification.
    pub fn normalise(self) -> NormalizedEvent {
        let event_id = self.derived_event_id();
        let change = self.target_status().map(|target| StatusChange {
            target,
            amount: parse_decimal_minor_units(self.gross_amount.as_text()),
            paid_amount: parse_decimal_minor_units(self.gross_amount.as_text()),
            refunded_amount: if target.is_refund() {
                self.refunded_amount()
            } else {
                None
            },
            currency: Some(
                self.currency
                    .clone()
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| DEFAULT_CURRENCY.to_owned()),
            ),
            customer_email: self
                .customer_details
                .as_ref()
                .and_then(|c| c.email.clone())
                .filter(|e| !e.trim().is_empty()),
        });
        NormalizedEvent {
            provider: Provider::Midtrans,
            event_id,
            event_type: self.transaction_status,
            order_ref: OrderRef::OrderId(self.order_id),
            payment_intent_id: None,
            change,
        }
    }
}

/// Returns `body` with its `signature_key` set for `server_key`, as Midtrans would send it (used
/// by `sekali replay` and the tests; the signature does not cover the formatting, so the body is
/// re-serialised).
pub fn with_signature_key(body: &[u8], server_key: &str) -> Result<Vec<u8>, String> {
    let mut value: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let object = value.as_object_mut().ok_or("not a JSON object")?;
    let text = |name: &str| -> Result<String, String> {
        match object.get(name) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
            _ => Err(format!("missing field `{name}`")),
        }
    };
    let signature = compute_signature_key(
        &text("order_id")?,
        &text("status_code")?,
        &text("gross_amount")?,
        server_key,
    );
    object.insert("signature_key".into(), serde_json::Value::String(signature));
    serde_json::to_vec_pretty(&value).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notification(json: &str) -> Notification {
        parse_notification(json.as_bytes()).unwrap()
    }

    #[test]
    fn signature_uses_the_strings_exactly_as_sent() {
        let key = SecretString::from("SB-Mid-server-x".to_string());
        let sig = compute_signature_key("A-1", "200", "10000.00", "SB-Mid-server-x");
        let n = notification(&format!(
            r#"{{"order_id":"A-1","status_code":"200","gross_amount":"10000.00","signature_key":"{sig}","transaction_status":"settlement"}}"#
        ));
        assert_eq!(verify_midtrans_signature(&n, &key), Ok(()));
        let reformatted = notification(&format!(
            r#"{{"order_id":"A-1","status_code":"200","gross_amount":"10000.0","signature_key":"{sig}","transaction_status":"settlement"}}"#
        ));
        assert_eq!(
            verify_midtrans_signature(&reformatted, &key),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn two_partial_refunds_of_one_order_are_two_events() {
        let first = notification(
            r#"{"order_id":"A-1","status_code":"200","gross_amount":"100.00","signature_key":"x","transaction_status":"partial_refund",
                "refunds":[{"refund_key":"rf-1","refund_amount":"10.00","created_at":"2026-01-01 10:00:00"}]}"#,
        );
        let second = notification(
            r#"{"order_id":"A-1","status_code":"200","gross_amount":"100.00","signature_key":"x","transaction_status":"partial_refund",
                "refunds":[{"refund_key":"rf-1","refund_amount":"10.00","created_at":"2026-01-01 10:00:00"},
                           {"refund_key":"rf-2","refund_amount":"5.00","created_at":"2026-01-01 11:00:00"}]}"#,
        );
        assert_eq!(first.derived_event_id(), "A-1:partial_refund:200:rf-1");
        assert_eq!(second.derived_event_id(), "A-1:partial_refund:200:rf-2");
        assert_eq!(second.refunded_amount(), Some(1500));
    }

    #[test]
    fn capture_challenge_and_capture_accept_are_distinct_events() {
        let challenge = notification(
            r#"{"order_id":"B","status_code":"201","gross_amount":"1.00","signature_key":"x","transaction_status":"capture","fraud_status":"challenge"}"#,
        );
        let accept = notification(
            r#"{"order_id":"B","status_code":"200","gross_amount":"1.00","signature_key":"x","transaction_status":"capture","fraud_status":"accept"}"#,
        );
        assert_eq!(challenge.derived_event_id(), "B:capture:201:challenge");
        assert_eq!(accept.derived_event_id(), "B:capture:200:accept");
        assert_eq!(
            challenge.normalise().change.unwrap().target,
            OrderStatus::Pending
        );
        assert_eq!(accept.normalise().change.unwrap().target, OrderStatus::Paid);
    }
}
