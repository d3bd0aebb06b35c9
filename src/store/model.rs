//! What the store speaks: the engine-neutral types of the [`Store`](super::Store) and
//! [`Maintenance`](super::Maintenance) interfaces. No engine type appears here.

use serde::Serialize;

use super::StoreError;

/// A row claimed for sending, with what rendering needs.
#[derive(Debug, Clone)]
pub struct ClaimedEmail {
    pub id: i64,
    pub order_id: String,
    pub recipient: Option<String>,
    pub template: String,
    pub params: String,
    pub idempotency_key: String,
    /// Transport tries before this one.
    pub attempts: i64,
    /// When its first counted try was made (`first_tried_at`), in Unix milliseconds.
    pub first_tried_ms: Option<i64>,
    /// `metadata.locale` of the order, if it set one.
    pub locale: Option<String>,
}

/// A row as `sekali outbox list/show` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxRow {
    pub id: i64,
    pub order_id: String,
    pub recipient: Option<String>,
    pub template: String,
    pub status: String,
    pub attempts: i64,
    pub idempotency_key: String,
    pub created_at: String,
    pub next_attempt_at: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<String>,
    pub last_error: Option<String>,
    pub sent_at: Option<String>,
    pub params: String,
    /// When the first counted try was made: with the HTTP email API, the key's 24 h run from
    /// here.
    pub first_tried_at: Option<String>,
}

/// What a relay asks for: up to `limit` due rows, held for `owner` until `now + lease`.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub owner: String,
    pub lease_ms: i64,
    pub limit: usize,
}

/// What became of one claimed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// The transport confirmed it.
    Sent,
    /// A counted try failed: due again at `retry_at_ms`, or `dead` when that is `None`.
    Failed {
        error: String,
        retry_at_ms: Option<i64>,
    },
    /// Not sent and no try counted: the transport was unavailable (due again at `retry_at_ms`),
    /// or the row was withheld (`dead` when that is `None`). The error is kept.
    Untried {
        error: String,
        retry_at_ms: Option<i64>,
    },
    /// No recipient: nothing to send, visibly.
    Skipped,
}

/// The outcome of row `id`, to record for the relay that claimed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendResult {
    pub id: i64,
    pub outcome: SendOutcome,
}

/// An order as the API returns it, one by one (with its `history`) and by page (without): the
/// fields in the same order either way.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OrderView {
    pub order_id: String,
    pub status: String,
    pub provider: String,
    pub amount: Option<i64>,
    pub refunded_amount: i64,
    pub currency: Option<String>,
    /// What the payment said was paid, and in which currency, when that differs from the order's
    /// amount or currency (a payment that did not match an API order); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paid_amount: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paid_currency: Option<String>,
    /// Where the customer's emails go.
    pub customer_email: Option<String>,
    /// The payer's address as the provider reported it.
    pub payer_email: Option<String>,
    pub metadata: Option<serde_json::Value>,
    pub source: String,
    pub payment_intent_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// Every change of its status, oldest first (one order only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<Transition>>,
}

impl OrderView {
    /// `(paid_amount, paid_currency)` as the view shows them: both, when the payment's amount or
    /// currency differs from the order's (currencies compare case-insensitively: Stripe says
    /// `idr`, the shop `IDR`), else neither.
    pub fn paid_if_different(
        amount: Option<i64>,
        currency: Option<&str>,
        paid_amount: Option<i64>,
        paid_currency: Option<String>,
    ) -> (Option<i64>, Option<String>) {
        let amount_differs = paid_amount.is_some() && paid_amount != amount;
        let currency_differs = matches!(
            (&paid_currency, currency),
            (Some(paid), Some(own)) if !paid.eq_ignore_ascii_case(own)
        );
        if amount_differs || currency_differs {
            (paid_amount, paid_currency)
        } else {
            (None, None)
        }
    }
}

/// One change of an order's status, as the audit trail (`order_transitions`) keeps it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Transition {
    pub changed_at: String,
    /// `None` for the change that created the order.
    pub from_status: Option<String>,
    pub to_status: String,
    /// The order's refunded amount after the change.
    pub refunded_amount: i64,
    /// Who made it: a provider's name (with `event_id`), `api` or `operator`.
    pub provider: String,
    pub event_id: String,
    /// The operator's or the API client's name.
    pub actor: Option<String>,
    /// The operator's reason.
    pub reason: Option<String>,
}

/// An operator's change of an order's status (`sekali orders set-status`).
#[derive(Debug, Clone)]
pub struct OperatorChange {
    pub status: crate::domain::OrderStatus,
    /// Who made it: `--by`, else the OS user.
    pub operator: String,
    /// Why; required, and kept in the audit trail.
    pub reason: String,
}

/// A validated order to create.
#[derive(Debug, Clone)]
pub struct NewOrder {
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    pub provider: String,
    /// Decimals of `amount` in its provider's units.
    pub exponent: u32,
    pub customer_email: Option<String>,
    /// A JSON object, as text.
    pub metadata: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SetStatusError {
    #[error("no order with id {0}")]
    NoSuchOrder(String),
    /// Nothing to change: a transition to the status the order has would record a change that
    /// did not happen (and queue its email again).
    #[error("order {order_id} is {status} already; nothing was changed")]
    Unchanged {
        order_id: String,
        status: crate::domain::OrderStatus,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, Clone, Serialize)]
pub struct EventSummary {
    pub provider: String,
    pub event_id: String,
    pub event_type: String,
    pub order_id: Option<String>,
    pub outcome: String,
    pub received_at: String,
    pub expires_at: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct EventDetail {
    #[serde(flatten)]
    pub summary: EventSummary,
    pub payment_intent_id: Option<String>,
    pub payload: String,
}

/// Rows deleted per transaction: small enough that deliveries queued behind a batch wait only
/// a few milliseconds. In a soak at 6,000 deliveries/s, a 500-row batch took 3.5 ms (median;
/// 20.6 ms at most), a 5,000-row one 38 ms (94 ms at most).
pub const DEFAULT_PURGE_BATCH: usize = 500;

/// What one purge batch or pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub events: usize,
    pub idempotency_keys: usize,
}

impl Purged {
    /// True when either table may hold more expired rows than this batch took.
    pub fn was_full(&self, batch: usize) -> bool {
        self.events >= batch || self.idempotency_keys >= batch
    }
}

impl std::ops::AddAssign for Purged {
    fn add_assign(&mut self, other: Purged) {
        self.events += other.events;
        self.idempotency_keys += other.idempotency_keys;
    }
}

/// A response as stored and replayed, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotentOutcome {
    /// The work ran now; this is its response (also stored).
    Fresh(StoredResponse),
    /// The same request was made before with this key: its stored response.
    Replayed(StoredResponse),
    /// The key was used before for a different request.
    FingerprintMismatch,
}

/// What `sekali backup` copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    pub pages: i64,
    pub processed_events: i64,
    pub orders: i64,
}

/// What the single writer has committed (an engine without one reports its write transactions
/// the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WriterStats {
    /// Write transactions committed.
    pub transactions: u64,
    /// Deliveries committed (duplicates included).
    pub deliveries: u64,
    /// Relay claims served, and the rows they claimed.
    pub outbox_claims: u64,
    pub outbox_claimed_rows: u64,
    /// Batches of relay results recorded, and the results in them.
    pub outbox_result_batches: u64,
    pub outbox_results: u64,
    /// Times the writer replaced its connection (a panic, an I/O fault).
    pub reopens: u64,
}

/// What a [`Store`](super::Store) has done since it started, as `/healthz` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    pub writer: WriterStats,
    /// Write connections this process has opened: `serve` opens exactly one, and its relay
    /// writes through it.
    pub write_connections_opened: u64,
}

/// The rows of one load-generator run (see [`Maintenance::run_counts`](super::Maintenance)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunCounts {
    pub events: i64,
    pub orders: i64,
    pub emails: i64,
    /// Orders with at least one email.
    pub orders_emailed: i64,
}
