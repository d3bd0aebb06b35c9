//! Midtrans HTTP notifications: `signature_key` verification and normalisation.
//!
//! `signature_key` is hex SHA-512 of `order_id + status_code + gross_amount + server key`, over
//! the strings exactly as sent. It is not an HMAC and carries no timestamp: a captured
//! notification verifies forever, so replays are neutralised by deduplication and the ledger
//! (facts merged again change nothing), not by the signature.
//!
//! **What the signature does not cover:** `transaction_status`, `fraud_status`, the refunds and
//! everything else. Two checks close what that leaves open:
//! - the `status_code` must be the one Midtrans gives the `transaction_status` (200 for
//!   settlement, capture, refund and partial refund; 201 for pending and a capture under fraud
//!   challenge; 202 for deny, cancel, expire and failure), so a status cannot borrow the
//!   signature of a notification of another class ([`check_status_code`]);
//! - within a class (a forged `refund` carrying a settlement's signature), only Midtrans's status
//!   API can tell: sekali asks it, as Midtrans's own libraries do, about the notification's
//!   transaction (by `transaction_id`; by `order_id` when it names none), and applies what it
//!   reports ([`Notification::confirmed_by`]; the request is made by `clients::midtrans_status`).
//!
//! Midtrans sends no event id. sekali derives one that is the same for every retry of one
//! notification and differs between distinct status changes: the parts
//! `order_id`, `transaction_status`, `status_code`, then `fraud_status` when present, then for a
//! refund notification the refund identity and for one that can reverse a payment (`deny`,
//! `cancel`, `capture` with fraud status `deny`) the `transaction_id`, when present; each part
//! with `\` and `:` escaped as `\\` and `\:`, joined by `:`. The refund identity is the newest
//! `refunds[].refund_key`, else that refund's `refund_chargeback_id`, else the cumulative refunded
//! amount in minor units. Escaping makes the id injective (before it, a partial refund of `A` with
//! refund key `rk:settlement:200` and a settlement of order `A:partial_refund:200:rk` derived the
//! same id); for parts without `:` or `\`, which is nearly every real id, the id is exactly what
//! earlier versions derived, but for the transaction of a deny or cancel.
//!
//! **Transactions.** Midtrans keeps one `order_id` across a customer's attempts, each its own
//! `transaction_id`. The transaction is the event's payment (`payment_ref`): the one that pays
//! an order is recorded on it, and only a deny or cancel of that transaction after its
//! settlement reverses the payment (`domain::ledger`); a deny of another attempt is a failed
//! attempt, which leaves an order that holds money as its money says. That is why a deny's id
//! names its transaction: the deny of one attempt must not make the reversal of the paying one
//! look like its retry.

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sha2::{Digest, Sha512};
use subtle::ConstantTimeEq;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use super::{
    Headers, PayloadError, Provider, ProviderSettings, Registration, Rejection, SignedRequest,
};
use crate::clients::midtrans_status::{self, StatusApi};
use crate::domain::ledger::{
    Attempt, Dispute, DisputeStage, PaymentFacts, Refund as LedgerRefund, RefundState,
    RefundedSnapshot,
};
use crate::domain::money::{iso_exponent, parse_decimal_minor_units};
use crate::domain::text::without_userinfo;
use crate::domain::{EmailAddress, NormalizedEvent, OrderRef, PaymentReport, ProviderName};

/// Midtrans amounts are rupiah; notifications without a `currency` field are IDR.
pub const DEFAULT_CURRENCY: &str = "IDR";

pub const ENV_SERVER_KEY: &str = "MIDTRANS_SERVER_KEY";
pub const ENV_STATUS_CHECK: &str = "SEKALI_MIDTRANS_STATUS_CHECK";

/// What `sekali replay` says after a notification was answered 503 "not confirmed": the server
/// asked Midtrans's status API, which a test server usually cannot use for a fixture.
const NOT_CONFIRMED_HINT: &str = "the server's Midtrans status check could not confirm this \
    notification with Midtrans. A local or sandbox server usually cannot reach Midtrans's status \
    API, and a fixture's transaction is not in Midtrans at all. For local tests, start the server \
    with the check off: `sekali serve --midtrans-status-check off`, or \
    SEKALI_MIDTRANS_STATUS_CHECK=off. Keep it on in production: the signature does not cover the \
    transaction status, and the check is what confirms it.";

/// Midtrans's five retries end within about 6 hours; ids are kept a week.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
const REDELIVERY_WINDOW: Duration = Duration::from_secs(6 * 3600);

pub const REGISTRATION: Registration = Registration {
    name: "midtrans",
    configure,
    environment: &[
        (
            ENV_SERVER_KEY,
            "the Midtrans server key (SB-Mid-server-... in the sandbox)",
        ),
        (
            ENV_STATUS_CHECK,
            "on (default) or off: confirm each notification with Midtrans's status API",
        ),
        (
            midtrans_status::ENV_API_URL,
            "the status API's base URL (default: sandbox for an SB- key, else production)",
        ),
    ],
    options: &[
        (
            "status-check",
            "on or off (see SEKALI_MIDTRANS_STATUS_CHECK)",
        ),
        (
            "api-url",
            "the status API's base URL (see MIDTRANS_API_URL)",
        ),
    ],
    amount_exponent: iso_exponent,
    read_stored: read_stored_notification,
};

/// Midtrans, configured: its server key, and the status API that confirms each notification
/// (`None`: notifications are applied as sent).
pub struct Midtrans {
    name: ProviderName,
    server_key: SecretString,
    retention: Duration,
    status_api: Option<StatusApi>,
}

fn configure(settings: &ProviderSettings<'_>) -> Result<Option<Arc<dyn Provider>>, String> {
    let Some(key) = settings.env(ENV_SERVER_KEY) else {
        return Ok(None);
    };
    let server_key = SecretString::from(key.trim().to_owned());
    let check = settings
        .option("midtrans", "status-check")
        .map(str::to_owned)
        .or_else(|| settings.env(ENV_STATUS_CHECK))
        .unwrap_or_else(|| "on".to_owned());
    let status_api = match check.trim() {
        "on" => {
            let base_url = match settings
                .option("midtrans", "api-url")
                .map(str::to_owned)
                .or_else(|| settings.env(midtrans_status::ENV_API_URL))
            {
                Some(url) => http_url(&url)?,
                None => StatusApi::default_url_for(&server_key).to_owned(),
            };
            Some(StatusApi {
                base_url,
                server_key: server_key.clone(),
                timeout: midtrans_status::TIMEOUT,
                metrics: Default::default(),
            })
        }
        "off" => None,
        other => {
            return Err(format!(
                "the Midtrans status check is `on` or `off`, not `{other}`"
            ))
        }
    };
    Ok(Some(Arc::new(Midtrans {
        name: ProviderName::new("midtrans").expect("a valid name"),
        server_key,
        retention: settings.retention("midtrans", DEFAULT_RETENTION)?,
        status_api,
    })))
}

/// An `http://` or `https://` URL with a host, without a trailing `/`.
fn http_url(text: &str) -> Result<String, String> {
    match text.parse::<awc::http::Uri>() {
        Ok(uri) if matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some() => {
            Ok(text.trim_end_matches('/').to_owned())
        }
        _ => Err(format!(
            "the Midtrans status API URL `{}` is not an http:// or https:// URL such as https://api.midtrans.com",
            without_userinfo(text)
        )),
    }
}

impl Midtrans {
    /// Midtrans with this server key, applying notifications as sent (`status_api` `None`) or
    /// confirming them with the status API at that place (tests).
    pub fn with_key(server_key: &str, status_api: Option<StatusApi>) -> Midtrans {
        Midtrans {
            name: ProviderName::new("midtrans").expect("a valid name"),
            server_key: SecretString::from(server_key.to_owned()),
            retention: DEFAULT_RETENTION,
            status_api,
        }
    }
}

impl Provider for Midtrans {
    fn name(&self) -> &ProviderName {
        &self.name
    }

    fn verify<'a>(
        &'a self,
        _headers: &'a dyn Headers,
        body: &'a [u8],
        _now_unix: i64,
    ) -> LocalBoxFuture<'a, Result<NormalizedEvent, Rejection>> {
        Box::pin(async move {
            let mut notification = parse_notification(body)?;
            let unauthorized = |e: SignatureError| Rejection::unauthorized(e.to_string());
            verify_midtrans_signature(&notification, &self.server_key).map_err(unauthorized)?;
            check_status_code(&notification).map_err(unauthorized)?;
            if let Some(api) = &self.status_api {
                let not_confirmed = |e: &dyn std::fmt::Display| {
                    Rejection::not_confirmed(format!("not confirmed by Midtrans's status API: {e}"))
                };
                // Asked by the transaction the notification is about: asked by the order id,
                // the API reports the order's latest transaction, so a late deny of an earlier
                // attempt (a card declined before the transfer that paid) would never be
                // confirmed, and Midtrans would be answered 503 until it gave up. The
                // transaction id is not signed; an answer about another order confirms nothing
                // (`confirmed_by`), and one about another attempt of this order is that
                // attempt's status, which is what gets applied.
                let id = notification
                    .transaction_id()
                    .unwrap_or(&notification.order_id)
                    .to_owned();
                let answer = api.fetch(&id).await.map_err(|e| not_confirmed(&e))?;
                notification = notification
                    .confirmed_by(&answer)
                    .map_err(|e| not_confirmed(&e))?;
            }
            Ok(notification.normalise())
        })
    }

    fn retention(&self) -> Duration {
        self.retention
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        if let Some(api) = &self.status_api {
            api.metrics.register(registry);
        }
    }

    fn dependency_health(&self) -> Option<(&'static str, serde_json::Value)> {
        self.status_api
            .as_ref()
            .map(|api| ("midtrans_status_api", api.metrics.health()))
    }

    fn redelivery_window(&self) -> Duration {
        REDELIVERY_WINDOW
    }

    fn sign(&self, body: &[u8], _now_unix: i64) -> Result<SignedRequest, String> {
        Ok(SignedRequest {
            body: with_signature_key(body, self.server_key.expose_secret())?,
            headers: vec![("User-Agent", "Veritrans".into())],
        })
    }

    fn sample_payment(&self, order_id: &str, n: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "transaction_time": "2026-11-29 10:00:00",
            "transaction_status": "settlement",
            "transaction_id": format!("bench-{n}"),
            "status_message": "midtrans payment notification",
            "status_code": "200",
            "settlement_time": "2026-11-29 10:00:05",
            "payment_type": "bank_transfer",
            "order_id": order_id,
            "merchant_id": "G141532850",
            "gross_amount": "150000.00",
            "fraud_status": "accept",
            "currency": "IDR",
            "va_numbers": [{"va_number": "12345678901", "bank": "bca"}],
            "signature_key": "",
        }))
        .expect("serialising a JSON value")
    }

    fn not_confirmed_hint(&self) -> Option<&'static str> {
        Some(NOT_CONFIRMED_HINT)
    }

    fn describe(&self) -> String {
        match &self.status_api {
            Some(api) => format!("status check on, {}", without_userinfo(&api.base_url)),
            None => "status check off".into(),
        }
    }

    fn outbound_connections_per_delivery(&self) -> u64 {
        u64::from(self.status_api.is_some())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("signature_key does not match")]
    Mismatch,
    /// The signature covers `status_code`, not `transaction_status`: a status sent with another
    /// status's code borrowed a signature it has no claim to.
    #[error(
        "transaction_status `{status}` comes with status_code {expected}, not {found}; the \
         signature covers status_code, not transaction_status, so this status is not proven"
    )]
    StatusCodeMismatch {
        status: String,
        expected: &'static str,
        found: String,
    },
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
    /// The attempt this notification is about (one order can have several); not covered by the
    /// signature.
    pub transaction_id: Option<String>,
    pub fraud_status: Option<String>,
    pub currency: Option<String>,
    pub refund_amount: Option<Text>,
    #[serde(default)]
    pub refunds: Vec<Refund>,
    pub customer_details: Option<CustomerDetails>,
    /// When the transaction was made, and when it settled (`YYYY-MM-DD HH:MM:SS`, UTC+7).
    pub transaction_time: Option<String>,
    pub settlement_time: Option<String>,
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

/// A stored notification as it was applied: with the status check on, that is the status the
/// API confirmed (`event_type`), which the body may not say (a late `pending` applied as the
/// settlement the API reported).
fn read_stored_notification(
    event_type: &str,
    body: &[u8],
) -> Result<NormalizedEvent, PayloadError> {
    let mut notification = parse_notification(body)?;
    if notification.transaction_status != event_type {
        notification.transaction_status = event_type.to_owned();
        if let Some(code) = notification.expected_status_code() {
            notification.status_code = Text(code.to_owned());
        }
    }
    Ok(notification.normalise())
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
    /// The currency, `IDR` when the notification names none.
    pub fn currency(&self) -> String {
        self.currency
            .clone()
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| DEFAULT_CURRENCY.to_owned())
    }

    /// Decimals of this notification's amounts in minor units (ISO 4217: IDR has two).
    fn exponent(&self) -> u32 {
        iso_exponent(&self.currency())
    }

    /// The refunded total in minor units: the sum of `refunds[].refund_amount`, else the
    /// top-level `refund_amount`.
    pub fn refunded_amount(&self) -> Option<i64> {
        let exponent = self.exponent();
        if !self.refunds.is_empty() {
            return self.refunds.iter().try_fold(0i64, |sum, refund| {
                let amount = refund.refund_amount.as_ref()?;
                sum.checked_add(parse_decimal_minor_units(amount.as_text(), exponent)?)
            });
        }
        self.refund_amount
            .as_ref()
            .and_then(|a| parse_decimal_minor_units(a.as_text(), exponent))
    }

    /// A refund or a chargeback: its `refunds[]` entries are what sets one notification of the
    /// status apart from the next (a second partial chargeback is not the first's retry).
    fn is_refund(&self) -> bool {
        matches!(
            self.transaction_status.as_str(),
            "refund" | "partial_refund" | "chargeback" | "partial_chargeback"
        )
    }

    fn is_chargeback(&self) -> bool {
        matches!(
            self.transaction_status.as_str(),
            "chargeback" | "partial_chargeback"
        )
    }

    /// The refund identity used in the derived event id, for refund and chargeback
    /// notifications.
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

    /// The transaction, when the notification names one.
    pub fn transaction_id(&self) -> Option<&str> {
        self.transaction_id.as_deref().filter(|t| !t.is_empty())
    }

    /// The last part of the derived id, for notifications that have one: a refund's identity,
    /// or the transaction a deny or cancel is for.
    fn last_id_part(&self) -> Option<String> {
        if self.is_refund() {
            self.refund_identity()
        } else if self.reverses_payment() {
            self.transaction_id().map(str::to_owned)
        } else {
            None
        }
    }

    /// The parts of the derived id before the last, in order (see the module docs).
    fn id_parts(&self) -> Vec<&str> {
        let mut parts = vec![
            self.order_id.as_str(),
            self.transaction_status.as_str(),
            self.status_code.as_text(),
        ];
        if let Some(fraud) = self.fraud_status.as_deref().filter(|f| !f.is_empty()) {
            parts.push(fraud);
        }
        parts
    }

    /// The event id: the parts, escaped, joined by `:` (see the module docs).
    pub fn derived_event_id(&self) -> String {
        let last = self.last_id_part();
        let mut parts = self.id_parts();
        parts.extend(last.as_deref());
        escaped_id(&parts)
    }

    /// The id an earlier version derived for this notification, when it differs from
    /// [`Self::derived_event_id`]: a claim under it within the retention window is the same
    /// notification. For a deny or cancel that names its transaction, the id without it (the
    /// version before); for the rest, the parts joined by `:` unescaped (the versions before
    /// escaping). A deny or cancel with `:` or `\` in its parts may then be applied once more
    /// across the upgrade, which changes nothing: applied again, either is stale or processed
    /// without a move.
    pub fn legacy_event_id(&self) -> Option<String> {
        let legacy = if self.reverses_payment() && self.transaction_id().is_some() {
            escaped_id(&self.id_parts())
        } else {
            let last = self.last_id_part();
            let mut parts = self.id_parts();
            parts.extend(last.as_deref());
            parts.join(":")
        };
        (legacy != self.derived_event_id()).then_some(legacy)
    }

    /// The `status_code` Midtrans gives this notification's `transaction_status` (and
    /// `fraud_status`), for the statuses sekali acts on.
    fn expected_status_code(&self) -> Option<&'static str> {
        Some(
            match (
                self.transaction_status.as_str(),
                self.fraud_status.as_deref(),
            ) {
                ("capture", Some("challenge")) | ("pending", _) => "201",
                ("capture", Some("deny")) => "202",
                (
                    "settlement" | "capture" | "refund" | "partial_refund" | "chargeback"
                    | "partial_chargeback",
                    _,
                ) => "200",
                ("deny" | "cancel" | "expire" | "failure", _) => "202",
                _ => return None,
            },
        )
    }

    /// Midtrans can reverse a settled payment (a Mandiri bill, Permata or Indomaret payment may
    /// get `deny` within a minute of `settlement`): a deny or cancel says the transaction did
    /// not stand, which for one that took money is its reversal.
    fn reverses_payment(&self) -> bool {
        matches!(self.transaction_status.as_str(), "deny" | "cancel")
            || (self.transaction_status == "capture"
                && self.fraud_status.as_deref() == Some("deny"))
    }

    /// How far along a transaction's life this notification's status is, for the statuses
    /// sekali acts on: a status the status API has not reached yet is one further along (a
    /// refund while the API still says settlement). A deny or cancel is furthest, as it can
    /// follow a settlement (a reversal); an expiry or failure can only end a pending one.
    fn progress(&self) -> Option<u8> {
        let fraud = self.fraud_status.as_deref();
        Some(match self.transaction_status.as_str() {
            "pending" | "authorize" => 0,
            "capture" if fraud == Some("challenge") => 0,
            "expire" | "failure" => 1,
            "settlement" => 2,
            "capture" if matches!(fraud, None | Some("") | Some("accept")) => 2,
            "partial_refund" | "partial_chargeback" => 3,
            "refund" | "chargeback" => 4,
            "deny" | "cancel" | "capture" => 5,
            _ => return None,
        })
    }

    /// `transaction_time` (or `settlement_time` for a settlement) as Unix seconds: Midtrans
    /// writes `YYYY-MM-DD HH:MM:SS` in Western Indonesian Time (UTC+7). 0 when absent or
    /// unreadable: the ledger then orders by rank alone.
    fn time_of(text: Option<&str>) -> i64 {
        const WIB_OFFSET_SECS: i64 = 7 * 3600;
        text.and_then(|t| humantime::parse_rfc3339_weak(t.trim()).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs() as i64 - WIB_OFFSET_SECS)
    }

    /// The amount of a `refunds[]` entry in minor units.
    fn entry_amount(&self, refund: &Refund) -> Option<i64> {
        refund
            .refund_amount
            .as_ref()
            .and_then(|a| parse_decimal_minor_units(a.as_text(), self.exponent()))
    }

    /// The id of a `refunds[]` entry: its `refund_key`, else its `refund_chargeback_id`, else its
    /// time and amount (what tells two entries apart).
    fn entry_id(refund: &Refund) -> String {
        refund
            .refund_key
            .as_deref()
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .or_else(|| {
                refund
                    .refund_chargeback_id
                    .as_ref()
                    .map(|id| id.as_text().to_owned())
            })
            .unwrap_or_else(|| {
                format!(
                    "{}:{}",
                    refund.created_at.as_deref().unwrap_or(""),
                    refund.refund_amount.as_ref().map_or("", Text::as_text)
                )
            })
    }

    /// What this notification says about its transaction; `None` for a status sekali does not
    /// act on.
    fn facts(&self) -> Option<PaymentFacts> {
        let gross = parse_decimal_minor_units(self.gross_amount.as_text(), self.exponent());
        // `transaction_time` is when the transaction was made, not when this status came: it
        // dates a payment, not a deny or a cancel, so attempts are ranked by their status
        // alone (0).
        let at = Self::time_of(self.transaction_time.as_deref());
        let unknown = 0;
        let fraud = self.fraud_status.as_deref();
        let mut facts = PaymentFacts {
            currency: Some(self.currency().to_ascii_uppercase()),
            requested: gross,
            ..PaymentFacts::default()
        };
        let took = |facts: &mut PaymentFacts, at: i64| {
            facts.captured = gross;
            facts.captured_at = Some(at);
        };
        match (self.transaction_status.as_str(), fraud) {
            ("settlement", _) => took(
                &mut facts,
                Self::time_of(self.settlement_time.as_deref()).max(at),
            ),
            ("capture", None | Some("") | Some("accept")) => took(&mut facts, at),
            ("capture", Some("challenge")) | ("authorize", _) => {
                facts.authorized = gross;
                facts.attempt = Some((Attempt::Pending, unknown));
            }
            ("capture", Some("deny")) | ("deny", _) | ("failure", _) => {
                facts.attempt = Some((Attempt::Failed, unknown));
                facts.undone = self.reverses_payment();
            }
            ("cancel", _) => {
                facts.attempt = Some((Attempt::Canceled, unknown));
                facts.undone = true;
            }
            ("expire", _) => facts.attempt = Some((Attempt::Expired, unknown)),
            ("pending", _) => facts.attempt = Some((Attempt::Pending, unknown)),
            ("refund" | "partial_refund" | "chargeback" | "partial_chargeback", _) => {
                // Money given back, or taken back, was money taken.
                took(&mut facts, at);
                for entry in &self.refunds {
                    let amount = self.entry_amount(entry).unwrap_or(0);
                    let id = Self::entry_id(entry);
                    if self.is_chargeback() {
                        facts.disputes.insert(
                            id,
                            Dispute {
                                amount,
                                stage: DisputeStage::Lost,
                                withdrawn: true,
                                reinstated: false,
                            },
                        );
                    } else {
                        facts.refunds.insert(
                            id,
                            LedgerRefund {
                                amount,
                                state: RefundState::Succeeded,
                                failed_at: None,
                            },
                        );
                    }
                }
                if self.refunds.is_empty() {
                    let amount = self.refunded_amount().unwrap_or(0);
                    if self.is_chargeback() {
                        facts.disputes.insert(
                            "chargeback".into(),
                            Dispute {
                                amount,
                                stage: DisputeStage::Lost,
                                withdrawn: true,
                                reinstated: false,
                            },
                        );
                    } else {
                        facts.refunded_snapshot = Some(RefundedSnapshot { amount, at: 0 });
                    }
                }
            }
            _ => return None,
        }
        Some(facts)
    }

    /// The provider-independent form of this notification.
    pub fn normalise(self) -> NormalizedEvent {
        let event_id = self.derived_event_id();
        let legacy_event_id = self.legacy_event_id();
        // The transaction is the payment; a notification that names none (older ones) is
        // its order's one payment.
        let reference = self
            .transaction_id()
            .map_or_else(|| format!("order:{}", self.order_id), str::to_owned);
        let payment = self.facts().map(|facts| PaymentReport {
            reference,
            aliases: Vec::new(),
            facts,
        });
        NormalizedEvent {
            provider: ProviderName::new("midtrans").expect("a valid name"),
            event_id,
            event_type: self.transaction_status,
            order_ref: OrderRef::OrderId(self.order_id),
            payment,
            payer_email: self
                .customer_details
                .as_ref()
                .and_then(|c| c.email.as_deref())
                .and_then(|e| EmailAddress::parse(e).ok()),
            legacy_event_id,
            detail: None,
            retention: DEFAULT_RETENTION,
            headers: None,
        }
    }

    /// This notification as Midtrans's status API reports the transaction now (`answer`, the
    /// body of `GET /v2/{transaction_id}/status`, or of `/v2/{order_id}/status` for a
    /// notification that names no transaction): its transaction, status, fraud status, amount,
    /// currency and refunds replace the notification's, which the signature does not cover (so a
    /// deny is for the transaction the API says was denied, whatever `transaction_id` the
    /// notification names). The status code
    /// becomes the one that belongs to the confirmed status, so a notification the API agrees
    /// with keeps the id it would have had unconfirmed.
    ///
    /// A notification whose status the API has not reached yet (a `refund` while the API still
    /// says `settlement`) is not confirmed: either it is forged, or the API lags the notification,
    /// and in both cases Midtrans's retry (of a real one) is the answer, not an older status.
    pub fn confirmed_by(self, answer: &[u8]) -> Result<Notification, NotConfirmed> {
        let api: StatusAnswer = serde_json::from_slice(answer).map_err(|e| {
            NotConfirmed::Unreadable(super::PayloadError::from_serde(e).to_string())
        })?;
        match api.status_code.as_ref().map(Text::as_text) {
            Some("404") => return Err(NotConfirmed::UnknownTransaction),
            Some("401") => return Err(NotConfirmed::Unauthorized),
            _ => {}
        }
        let Some(transaction_status) = api.transaction_status else {
            return Err(NotConfirmed::Unreadable(format!(
                "no transaction_status (status_code {:?}, status_message {:?})",
                api.status_code.as_ref().map(Text::as_text),
                api.status_message
            )));
        };
        if api.order_id.as_deref() != Some(self.order_id.as_str()) {
            return Err(NotConfirmed::OtherOrder);
        }
        let mut confirmed = Notification {
            transaction_status,
            transaction_id: api.transaction_id.or(self.transaction_id.clone()),
            fraud_status: api.fraud_status,
            gross_amount: api.gross_amount.unwrap_or(self.gross_amount.clone()),
            currency: api.currency.or(self.currency.clone()),
            refund_amount: api.refund_amount,
            refunds: api.refunds,
            ..self.clone()
        };
        if let Some(code) = confirmed.expected_status_code() {
            confirmed.status_code = Text(code.to_owned());
        }
        if let (Some(claimed), Some(reported)) = (self.progress(), confirmed.progress()) {
            if reported < claimed {
                return Err(NotConfirmed::NotYet {
                    claimed: self.transaction_status,
                    reported: confirmed.transaction_status,
                });
            }
        }
        Ok(confirmed)
    }
}

/// The fields of a status API answer sekali reads (the notification's fields, as the API has
/// them now).
#[derive(Debug, Deserialize)]
struct StatusAnswer {
    status_code: Option<Text>,
    status_message: Option<String>,
    order_id: Option<String>,
    transaction_status: Option<String>,
    transaction_id: Option<String>,
    fraud_status: Option<String>,
    gross_amount: Option<Text>,
    currency: Option<String>,
    refund_amount: Option<Text>,
    #[serde(default)]
    refunds: Vec<Refund>,
}

/// Why Midtrans's status API did not confirm a notification. Each is answered 503, so that
/// Midtrans retries: a notification is never applied unconfirmed, and never dropped for a fault
/// that may heal (or a setting the operator can fix).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotConfirmed {
    #[error("the status API does not know this transaction (a sandbox key against the production API, or the other way round? see MIDTRANS_API_URL)")]
    UnknownTransaction,
    #[error("the status API refused the server key (MIDTRANS_SERVER_KEY)")]
    Unauthorized,
    #[error("the status API answered for another order")]
    OtherOrder,
    #[error("the status API reports `{reported}`, which has not reached the notification's `{claimed}` yet")]
    NotYet { claimed: String, reported: String },
    #[error("the status API's answer could not be read: {0}")]
    Unreadable(String),
}

/// `parts`, each with `\` and `:` escaped, joined by `:`.
fn escaped_id(parts: &[&str]) -> String {
    parts
        .iter()
        .map(|part| part.replace('\\', "\\\\").replace(':', "\\:"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Refuses a notification whose `status_code` is not the one its `transaction_status` has (see
/// the module docs). Statuses sekali does not act on are not checked.
pub fn check_status_code(notification: &Notification) -> Result<(), SignatureError> {
    match notification.expected_status_code() {
        Some(expected) if notification.status_code.as_text() != expected => {
            Err(SignatureError::StatusCodeMismatch {
                status: notification.transaction_status.clone(),
                expected,
                found: notification.status_code.as_text().to_owned(),
            })
        }
        _ => Ok(()),
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

    /// `describe()` of Midtrans configured from `env` and `--provider-option midtrans.OPTION`s.
    fn configured(env: &[(&str, &str)], options: &[(&str, &str)]) -> String {
        let env_var = |name: &str| {
            env.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        };
        let options = options
            .iter()
            .map(|(o, v)| (("midtrans".to_owned(), (*o).to_owned()), (*v).to_owned()))
            .collect();
        configure(&ProviderSettings {
            env: &env_var,
            options: &options,
        })
        .unwrap()
        .expect("a server key is set")
        .describe()
    }

    /// The status API is production by default, the sandbox for a sandbox server key (`SB-…`),
    /// and wherever `MIDTRANS_API_URL` (or the `api-url` option) says, whatever the key.
    #[test]
    fn the_status_api_is_production_the_sandbox_for_an_sb_key_or_the_url_set() {
        let sandbox_key = (ENV_SERVER_KEY, "SB-Mid-server-abc");
        let production_key = (ENV_SERVER_KEY, "Mid-server-abc");
        let on = "status check on, ";
        assert_eq!(
            configured(&[sandbox_key], &[]),
            format!("{on}https://api.sandbox.midtrans.com")
        );
        // The key is trimmed before it is looked at.
        assert_eq!(
            configured(&[(ENV_SERVER_KEY, " SB-Mid-server-abc\n")], &[]),
            format!("{on}https://api.sandbox.midtrans.com")
        );
        assert_eq!(
            configured(&[production_key], &[]),
            format!("{on}https://api.midtrans.com")
        );
        // Only the prefix SB- (as Midtrans writes it) is a sandbox key.
        assert_eq!(
            configured(&[(ENV_SERVER_KEY, "Mid-server-SB-abc")], &[]),
            format!("{on}https://api.midtrans.com")
        );
        for (key, default) in [
            (sandbox_key, "https://api.sandbox.midtrans.com"),
            (production_key, "https://api.midtrans.com"),
        ] {
            let url = (midtrans_status::ENV_API_URL, "http://127.0.0.1:8089/");
            assert_eq!(
                configured(&[key, url], &[]),
                format!("{on}http://127.0.0.1:8089"),
                "{key:?}"
            );
            // The option wins over the environment; a blank variable is unset.
            assert_eq!(
                configured(&[key, url], &[("api-url", "https://status.example")]),
                format!("{on}https://status.example"),
                "{key:?}"
            );
            let blank = (midtrans_status::ENV_API_URL, " ");
            assert_eq!(
                configured(&[key, blank], &[]),
                format!("{on}{default}"),
                "{key:?}"
            );
        }
        assert_eq!(
            configured(&[production_key, (ENV_STATUS_CHECK, "off")], &[]),
            "status check off"
        );
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

    /// The transaction is the event's payment: what a paying notification records on its
    /// order, and what a deny must name to reverse it.
    #[test]
    fn the_transaction_is_the_events_payment_and_a_denys_id_names_it() {
        let settlement = notification(
            r#"{"order_id":"C","status_code":"200","gross_amount":"1.00","signature_key":"x","transaction_status":"settlement","fraud_status":"accept","transaction_id":"tx-1"}"#,
        );
        assert_eq!(settlement.derived_event_id(), "C:settlement:200:accept");
        assert_eq!(settlement.legacy_event_id(), None);
        assert_eq!(settlement.normalise().payment_ref(), Some("tx-1"));

        for (status, code, fraud) in [
            ("deny", "202", "accept"),
            ("cancel", "202", "accept"),
            ("capture", "202", "deny"),
        ] {
            let reversal = |transaction: &str| {
                notification(&format!(
                    r#"{{"order_id":"C","status_code":"{code}","gross_amount":"1.00","signature_key":"x","transaction_status":"{status}","fraud_status":"{fraud}","transaction_id":"{transaction}"}}"#
                ))
            };
            let of_one = reversal("tx-1");
            let of_another = reversal("tx:2");
            assert_eq!(
                of_one.derived_event_id(),
                format!("C:{status}:{code}:{fraud}:tx-1")
            );
            assert_eq!(
                of_another.derived_event_id(),
                format!("C:{status}:{code}:{fraud}:tx\\:2")
            );
            // A retry stored by the version before, which did not name the transaction, is a
            // duplicate.
            let before = format!("C:{status}:{code}:{fraud}");
            assert_eq!(of_one.legacy_event_id(), Some(before.clone()));
            assert_eq!(of_another.legacy_event_id(), Some(before));
            let event = of_one.normalise();
            assert_eq!(event.payment_ref(), Some("tx-1"));
            assert!(event.payment.unwrap().facts.undone, "{status}");
        }

        // Without a transaction, the id is the one it always was.
        let bare = notification(
            r#"{"order_id":"C","status_code":"202","gross_amount":"1.00","signature_key":"x","transaction_status":"deny","transaction_id":""}"#,
        );
        assert_eq!(bare.derived_event_id(), "C:deny:202");
        assert_eq!(bare.legacy_event_id(), None);
        // Its transaction is then the order's one payment.
        assert_eq!(bare.normalise().payment_ref(), Some("order:C"));
    }

    /// The transaction a confirmed notification is about is the one the status API reports:
    /// `transaction_id` is not signed.
    #[test]
    fn a_confirmed_notification_is_about_the_transaction_the_api_reports() {
        let deny = notification(
            r#"{"order_id":"C","status_code":"202","gross_amount":"1.00","signature_key":"x","transaction_status":"deny","fraud_status":"accept","transaction_id":"tx-paid"}"#,
        );
        let answer = br#"{"status_code":"202","order_id":"C","transaction_status":"deny","fraud_status":"accept","transaction_id":"tx-other","gross_amount":"1.00"}"#;
        let confirmed = deny.clone().confirmed_by(answer).unwrap();
        assert_eq!(confirmed.transaction_id(), Some("tx-other"));
        assert_eq!(confirmed.derived_event_id(), "C:deny:202:accept:tx-other");
        assert_eq!(confirmed.normalise().payment_ref(), Some("tx-other"));
        // An answer that names no transaction leaves the notification's.
        let answer = br#"{"status_code":"202","order_id":"C","transaction_status":"deny","fraud_status":"accept","gross_amount":"1.00"}"#;
        assert_eq!(
            deny.confirmed_by(answer).unwrap().transaction_id(),
            Some("tx-paid")
        );
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
        let facts = |n: Notification| n.normalise().payment.unwrap().facts;
        let held = facts(challenge);
        assert_eq!((held.captured(), held.authorized), (0, Some(100)));
        assert_eq!(facts(accept).captured(), 100);
    }

    /// Each chargeback of a transaction is a dispute lost by its id, and two partial chargebacks
    /// are two events: the second's id names its own chargeback.
    #[test]
    fn chargebacks_are_disputes_by_their_ids_and_each_is_its_own_event() {
        let first = notification(
            r#"{"order_id":"D","status_code":"200","gross_amount":"300.00","signature_key":"x","transaction_status":"partial_chargeback","transaction_id":"tx-d","refunds":[{"refund_chargeback_id":"cb-1","refund_amount":"100.00","created_at":"2026-11-30 10:00:00"}]}"#,
        );
        let second = notification(
            r#"{"order_id":"D","status_code":"200","gross_amount":"300.00","signature_key":"x","transaction_status":"partial_chargeback","transaction_id":"tx-d","refunds":[{"refund_chargeback_id":"cb-1","refund_amount":"100.00","created_at":"2026-11-30 10:00:00"},{"refund_chargeback_id":"cb-2","refund_amount":"50.00","created_at":"2026-11-30 11:00:00"}]}"#,
        );
        assert_ne!(first.derived_event_id(), second.derived_event_id());
        assert_eq!(second.derived_event_id(), "D:partial_chargeback:200:cb-2");
        let facts = second.normalise().payment.unwrap().facts;
        assert_eq!(
            (facts.captured(), facts.withdrawn(), facts.returned()),
            (30_000, 15_000, 0)
        );
        assert_eq!(facts.disputes.len(), 2);
    }
}
