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

/// An order as the API returns it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OrderView {
    pub order_id: String,
    pub status: String,
    pub provider: String,
    pub amount: Option<i64>,
    pub refunded_amount: i64,
    pub currency: Option<String>,
    pub customer_email: Option<String>,
    pub metadata: Option<serde_json::Value>,
    pub source: String,
    pub payment_intent_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
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

/// What every id one load-generator run writes contains: `bench_{run id}_`. Its orders start
/// with it (`bench_{run id}_{n}`); its event ids hold it (`evt_bench_{run id}_{n}`, a Midtrans
/// id derived from the order id, a Xendit `webhook-id` naming the invoice). Made only from a
/// run id of hex digits, so a marker matches neither every row (an empty marker) nor the rows
/// of a run whose id begins with this one's (the `_` after the id ends it), and holds no
/// character a pattern would read specially.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunMarker(String);

/// The start of every load-generator order id, whatever its run.
pub const RUN_ORDER_PREFIX: &str = "bench_";

impl RunMarker {
    /// The marker of run `run_id`; `None` unless it is lower-case hex digits.
    pub fn new(run_id: &str) -> Option<RunMarker> {
        let hex = !run_id.is_empty()
            && run_id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        hex.then(|| RunMarker(format!("{RUN_ORDER_PREFIX}{run_id}_")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Orders that no load-generator run wrote (see
/// [`Maintenance::orders_outside_runs`](super::Maintenance)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrdersOutsideRuns {
    pub count: i64,
    /// A few of their ids, in id order, to show which.
    pub examples: Vec<String>,
}

/// What [`Maintenance::delete_run`](super::Maintenance) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunDeletion {
    /// Every row of the run is gone, in one transaction.
    Deleted(DeletedRun),
    /// Nothing was deleted: this many of the run's emails are leased to a relay, which may be
    /// sending them (writing their files) now.
    Leased { emails: i64 },
}

/// The rows of one run deleted, per table, and the emails among them (to remove their files).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeletedRun {
    pub events: usize,
    pub orders: usize,
    pub transitions: usize,
    pub payments: usize,
    pub emails: Vec<RunEmail>,
}

/// An email row of a run: its key (what its file is named after) and its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEmail {
    pub idempotency_key: String,
    pub order_id: String,
}
