//! What the store speaks: the engine-neutral types of the [`Store`](super::Store) and
//! [`Maintenance`](super::Maintenance) interfaces. No engine type appears here.

use serde::Serialize;

use super::StoreError;
use crate::domain::Outcome;

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

/// When a relay will next try an outbox row, as of a given moment: what `outbox list` shows.
/// It follows the claim's rule (see [`Store::claim_outbox`](super::Store::claim_outbox)): a
/// pending row is claimed once its `next_attempt_at` has passed and no live lease holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextTry {
    /// Sent, dead or skipped (or, never seen, pending without a `next_attempt_at`): no relay
    /// tries it again. `sekali outbox retry` makes a dead row pending.
    Never,
    /// Due since this time (its `next_attempt_at`): the next relay to look for due rows
    /// claims it.
    Now { since: String },
    /// Waiting out its backoff, or an email API's `Retry-After`, until this time.
    At(String),
    /// Claimed by the relay `owner`, which is sending it: its result is recorded when the send
    /// ends. Only if that relay died is it tried again, by any relay, once the lease runs out
    /// at `until`. (Its `next_attempt_at` has passed: a claim takes due rows only.)
    Leased { owner: String, until: String },
}

impl OutboxRow {
    /// When a relay will next try this row, as of `now_ms` (Unix milliseconds).
    pub fn next_try(&self, now_ms: i64) -> NextTry {
        // An unreadable time (written by hand) counts as not reached: the row is shown waiting
        // or leased rather than due.
        let reached = |at: &str| unix_millis(at).is_some_and(|at| at <= now_ms);
        match (self.status.as_str(), &self.next_attempt_at) {
            ("pending", Some(next)) => match (&self.lease_owner, &self.lease_until) {
                (Some(owner), Some(until)) if !reached(until) => NextTry::Leased {
                    owner: owner.clone(),
                    until: until.clone(),
                },
                _ if reached(next) => NextTry::Now {
                    since: next.clone(),
                },
                _ => NextTry::At(next.clone()),
            },
            _ => NextTry::Never,
        }
    }
}

/// Unix milliseconds of a stored time (`2026-11-29T10:15:02.123Z`, or whole seconds).
fn unix_millis(at: &str) -> Option<i64> {
    let since_epoch = humantime::parse_rfc3339(at)
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    i64::try_from(since_epoch.as_millis()).ok()
}

/// What [`Maintenance::retry`](super::Maintenance::retry) did with an outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retried {
    /// It was dead: now pending and due, its attempts and first try reset. The operator starts
    /// it over (after fixing an address, or once the email API is back): it gets the whole
    /// `--relay-max-attempts` again.
    Revived,
    /// It was pending, waiting for its next try at `was`: now due (or still due since `was`,
    /// if that had passed), its `attempts` and first try kept. It is in the middle of its
    /// tries: they still count against the attempt limit, and its first try still starts the
    /// downstream key's lifetime, so sending it sooner cannot stretch its tries past what
    /// `--relay-max-attempts` and the key's 24 h allow.
    DueNow { was: String, attempts: i64 },
    /// Pending under a live lease: a relay is sending it. Left alone, as taking the lease away
    /// could have two relays send it at once; if that relay died, the row is due at `until`.
    Leased { owner: String, until: String },
    /// Sent or skipped (`status`): there is nothing to send again.
    Finished { status: String },
    /// No row has this id.
    Missing,
}

/// What a relay asks for: up to `limit` due rows of `outbox`, held for `owner` until
/// `now + lease`.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub owner: String,
    pub lease_ms: i64,
    pub limit: usize,
    pub outbox: OutboxKind,
}

/// The two outboxes, which one relay machinery sends: the customers' emails (`email_outbox`)
/// and the order changes forwarded to the shop (`forward_outbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxKind {
    Email,
    Forward,
}

impl OutboxKind {
    /// Its name in metrics, the console and logs: `email`, `forward`.
    pub fn label(self) -> &'static str {
        match self {
            OutboxKind::Email => "email",
            OutboxKind::Forward => "forward",
        }
    }

    /// Its table.
    pub fn table(self) -> &'static str {
        match self {
            OutboxKind::Email => "email_outbox",
            OutboxKind::Forward => "forward_outbox",
        }
    }
}

/// An outbox's backlog, as metrics report it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OutboxBacklog {
    /// Rows waiting to be sent (due or not).
    pub pending: i64,
    /// Rows that will not be sent unless an operator retries them.
    pub dead: i64,
    /// How long the oldest row that is due has been due (zero when none is).
    pub oldest_due_age: std::time::Duration,
}

impl OutboxBacklog {
    /// From the counts and the oldest due row's `next_attempt_at` (fixed-width millisecond UTC
    /// text), as of `now_ms`.
    pub fn at(pending: i64, dead: i64, oldest_due: Option<&str>, now_ms: i64) -> OutboxBacklog {
        let oldest_due_age = oldest_due
            .and_then(|text| humantime::parse_rfc3339(text).ok())
            .and_then(|due| due.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|due| {
                let now = std::time::Duration::from_millis(now_ms.max(0) as u64);
                now.saturating_sub(due)
            })
            .unwrap_or_default();
        OutboxBacklog {
            pending,
            dead,
            oldest_due_age,
        }
    }
}

/// A forwarding row as `sekali forward list/show` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct ForwardRow {
    pub id: i64,
    /// `webhook-id` of its message: `chg_` and the change's id.
    pub message_id: String,
    pub order_id: String,
    /// The change's type (`order.paid`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    pub status: String,
    pub attempts: i64,
    pub created_at: String,
    pub next_attempt_at: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_until: Option<String>,
    pub last_error: Option<String>,
    pub sent_at: Option<String>,
    pub first_tried_at: Option<String>,
}

/// What `sekali forward skip` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// It was pending or dead: now skipped, and its order's later changes may go.
    Skipped {
        was: String,
    },
    /// Pending under a live lease: being sent right now; left alone.
    Leased {
        owner: String,
        until: String,
    },
    /// Sent or skipped already.
    Finished {
        status: String,
    },
    Missing,
}

/// A change claimed for forwarding: the message to send.
#[derive(Debug, Clone)]
pub struct ClaimedForward {
    pub id: i64,
    pub order_id: String,
    /// `webhook-id`: the change's id (`chg_…`), the same on every attempt.
    pub message_id: String,
    /// The change as `GET /changes` serves it, as JSON.
    pub body: String,
    /// Tries before this one.
    pub attempts: i64,
}

/// What a claim took, of the outbox it asked for.
#[derive(Debug, Clone)]
pub enum Claimed {
    Emails(Vec<ClaimedEmail>),
    Forwards(Vec<ClaimedForward>),
}

impl Claimed {
    pub fn len(&self) -> usize {
        match self {
            Claimed::Emails(rows) => rows.len(),
            Claimed::Forwards(rows) => rows.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The emails (none, for a claim of the other outbox).
    pub fn emails(self) -> Vec<ClaimedEmail> {
        match self {
            Claimed::Emails(rows) => rows,
            Claimed::Forwards(_) => Vec::new(),
        }
    }

    /// The changes (none, for a claim of the other outbox).
    pub fn forwards(self) -> Vec<ClaimedForward> {
        match self {
            Claimed::Forwards(rows) => rows,
            Claimed::Emails(_) => Vec::new(),
        }
    }
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

impl SendOutcome {
    /// What `outbox_attempts` keeps of it: its result (`sent`, `failed`, `dead`, `unavailable`,
    /// `withheld`, `skipped`) and its error.
    pub fn attempt(&self) -> (&'static str, Option<&str>) {
        match self {
            SendOutcome::Sent => ("sent", None),
            SendOutcome::Failed { error, retry_at_ms } => (
                if retry_at_ms.is_some() {
                    "failed"
                } else {
                    "dead"
                },
                Some(error),
            ),
            SendOutcome::Untried { error, retry_at_ms } => (
                if retry_at_ms.is_some() {
                    "unavailable"
                } else {
                    "withheld"
                },
                Some(error),
            ),
            SendOutcome::Skipped => ("skipped", Some("no recipient address")),
        }
    }
}

/// One recorded result of an outbox row (`outbox_attempts`), as the console shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutboxAttempt {
    pub at: String,
    pub relay: String,
    pub result: String,
    pub error: Option<String>,
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
    /// Why it needs a look, while it does.
    pub review_reason: Option<String>,
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
    /// Its payments, as the ledger knows them (one order only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payments: Option<Vec<PaymentView>>,
    /// Every change of its status, oldest first (one order only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<Transition>>,
}

/// A payment of an order as the API shows it: what it asked for and took, what it gave back and
/// what disputes took back, how far it got, and each refund and dispute by its id. Amounts in ISO
/// 4217 minor units of `currency`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PaymentView {
    pub provider: String,
    pub payment_ref: String,
    pub currency: Option<String>,
    pub requested: Option<i64>,
    pub authorized: Option<i64>,
    pub captured: i64,
    /// An authorisation given back without being taken: no money moved.
    pub released: i64,
    pub returned: i64,
    pub withdrawn: i64,
    /// `succeeded` once it took money; else how far it got: pending, failed, expired or
    /// canceled.
    pub attempt: String,
    /// The provider took back money it had taken.
    pub reversed: bool,
    pub refunds: Vec<RefundView>,
    pub disputes: Vec<DisputeView>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RefundView {
    pub refund_id: String,
    pub amount: i64,
    pub state: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DisputeView {
    pub dispute_id: String,
    pub amount: i64,
    pub stage: String,
    /// Money it holds now.
    pub holds: i64,
}

impl PaymentView {
    /// The view of `facts`, the payment `payment_ref` of `provider`.
    pub fn of(
        provider: &str,
        payment_ref: &str,
        facts: &crate::domain::ledger::PaymentFacts,
    ) -> PaymentView {
        PaymentView {
            provider: provider.to_owned(),
            payment_ref: payment_ref.to_owned(),
            currency: facts.currency.clone(),
            requested: facts.requested,
            authorized: facts.authorized,
            captured: facts.captured(),
            released: facts.released.unwrap_or(0),
            returned: facts.returned(),
            withdrawn: facts.withdrawn(),
            attempt: if facts.captured() > 0 {
                "succeeded".to_owned()
            } else {
                facts.attempt().as_str().to_owned()
            },
            reversed: facts.reversed(),
            refunds: facts
                .refunds
                .iter()
                .map(|(id, r)| RefundView {
                    refund_id: id.clone(),
                    amount: r.amount,
                    state: r.state.as_str().to_owned(),
                })
                .collect(),
            disputes: facts
                .disputes
                .iter()
                .map(|(id, d)| DisputeView {
                    dispute_id: id.clone(),
                    amount: d.amount,
                    stage: d.stage.as_str().to_owned(),
                    holds: d.holds(),
                })
                .collect(),
        }
    }
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

/// Which events [`Maintenance::events`](super::Maintenance::events) lists: those that match
/// every filter given, newest first (in the order they arrived), at most `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    pub provider: Option<String>,
    /// One of [`Outcome::STORED`] (a duplicate is not stored, so it matches nothing).
    pub outcome: Option<Outcome>,
    /// Events naming this order (or found through its payment).
    pub order_id: Option<String>,
    /// Events received at or after this time, in Unix seconds.
    pub since_unix: Option<i64>,
    /// Events received before this time, in Unix seconds.
    pub until_unix: Option<i64>,
    /// Events of this type (`payment_intent.succeeded`, `settlement`, `invoice.paid`).
    pub event_type: Option<String>,
    /// Events that arrived before the one with this [`EventSummary::seq`]: the next page of a
    /// listing whose last row had it.
    pub before_seq: Option<i64>,
    pub limit: u32,
}

impl EventQuery {
    /// The newest `limit` events, whatever they are.
    pub fn newest(limit: u32) -> Self {
        EventQuery {
            provider: None,
            outcome: None,
            order_id: None,
            since_unix: None,
            until_unix: None,
            event_type: None,
            before_seq: None,
            limit,
        }
    }
}

/// How many events one provider's deliveries stored with one outcome (the console's overview).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventCount {
    pub provider: String,
    pub outcome: String,
    pub count: i64,
}

/// Which outbox rows [`Maintenance::outbox`](super::Maintenance::outbox) lists: those that
/// match every filter given, newest first, at most `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxQuery {
    /// `pending`, `sent`, `dead` or `skipped`.
    pub status: Option<String>,
    /// The emails of this order.
    pub order_id: Option<String>,
    /// Rows queued at or after this time (`created_at`), in Unix seconds.
    pub since_unix: Option<i64>,
    pub limit: u32,
}

impl OutboxQuery {
    /// The newest `limit` rows, whatever their status.
    pub fn newest(limit: u32) -> Self {
        OutboxQuery {
            status: None,
            order_id: None,
            since_unix: None,
            limit,
        }
    }
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
    /// Its place in arrival order (`rowid`), for paging: not shown.
    #[serde(skip)]
    pub seq: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct EventDetail {
    #[serde(flatten)]
    pub summary: EventSummary,
    pub payment_intent_id: Option<String>,
    pub payload: String,
    /// The request headers it came with that are no secret (a JSON object); `None` for events
    /// stored before version 9.
    pub headers: Option<String>,
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
    /// Another transaction is running a request under this key right now (it holds the key):
    /// answered 409, as the same instance answers a second request in flight. Only an engine
    /// whose writer connections run transactions side by side returns it (PostgreSQL: another
    /// instance's, or, were the route's in-flight guard not in front, another of this one's).
    InFlight,
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
    /// Of those, the ones applied side by side with others of their transaction, in a few
    /// statements for them all (PostgreSQL's writer; see docs/postgres.md#performance).
    pub deliveries_together: u64,
    /// Relay claims served, and the rows they claimed.
    pub outbox_claims: u64,
    pub outbox_claimed_rows: u64,
    /// Batches of relay results recorded, and the results in them.
    pub outbox_result_batches: u64,
    pub outbox_results: u64,
    /// Times the writer replaced its connection (a panic, an I/O fault).
    pub reopens: u64,
    /// Write connections the store opened: one at start, and one per reopen. Its relay and its
    /// purge write through the writer's, so `serve` opens no other.
    pub connections_opened: u64,
    /// Units of work queued for the writer now, not yet taken.
    pub queued: u64,
}

/// What a [`Store`](super::Store) has done since it started, as `/healthz` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    pub writer: WriterStats,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: &str, next: Option<&str>, lease: Option<(&str, &str)>) -> OutboxRow {
        OutboxRow {
            id: 1,
            order_id: "ord_1".into(),
            recipient: Some("sari@toko.example".into()),
            template: "receipt".into(),
            status: status.into(),
            attempts: 1,
            idempotency_key: "k".into(),
            created_at: "2026-11-29T10:00:00Z".into(),
            next_attempt_at: next.map(str::to_owned),
            lease_owner: lease.map(|(owner, _)| owner.to_owned()),
            lease_until: lease.map(|(_, until)| until.to_owned()),
            last_error: None,
            sent_at: None,
            params: "{}".into(),
            first_tried_at: None,
        }
    }

    #[test]
    fn the_next_try_follows_the_claims_rule_for_backoffs_and_leases() {
        // 2026-11-29T10:15:02.000Z
        let now = 1_795_947_302_000;
        let (past, future) = ("2026-11-29T10:15:01.999Z", "2026-11-29T10:15:02.001Z");
        let at_now = "2026-11-29T10:15:02.000Z";
        let due_since = |at: &str| NextTry::Now { since: at.into() };
        assert_eq!(
            row("pending", Some(past), None).next_try(now),
            due_since(past)
        );
        assert_eq!(
            row("pending", Some(at_now), None).next_try(now),
            due_since(at_now)
        );
        assert_eq!(
            row("pending", Some(future), None).next_try(now),
            NextTry::At(future.into())
        );
        // A live lease: the row is being sent, whatever its next_attempt_at says.
        assert_eq!(
            row("pending", Some(past), Some(("relay-a", future))).next_try(now),
            NextTry::Leased {
                owner: "relay-a".into(),
                until: future.into()
            }
        );
        // A lease that ran out (its relay died) holds nothing.
        assert_eq!(
            row("pending", Some(past), Some(("relay-a", at_now))).next_try(now),
            due_since(past)
        );
        assert_eq!(
            row("pending", Some(future), Some(("relay-a", past))).next_try(now),
            NextTry::At(future.into())
        );
        for status in ["sent", "dead", "skipped"] {
            assert_eq!(row(status, None, None).next_try(now), NextTry::Never);
        }
        assert_eq!(row("pending", None, None).next_try(now), NextTry::Never);
        assert_eq!(
            row("pending", Some("not a time"), None).next_try(now),
            NextTry::At("not a time".into())
        );
    }
}
