//! The store: the one interface the rest of sekali speaks to keep what it must not lose.
//!
//! Routes, jobs and commands use [`Store`] (the server's side: deliveries, the orders API, the
//! relay's claims and results, purge batches, reads) and [`Maintenance`] (an operator's command
//! on one connection), in domain types ([`model`], [`crate::domain`]). No engine type crosses
//! this line: each engine lives in its own folder with all of its SQL ([`sqlite`], the embedded
//! default), and `tests/store_conformance.rs` holds the one suite every engine must pass.
//!
//! The contract every engine keeps, whatever its locking:
//! - [`Store::record`] claims the event id and applies the event's decision in ONE transaction,
//!   and resolves only after that transaction is durable. A live claim makes a redelivery
//!   [`Outcome::Duplicate`] with nothing written.
//! - [`Store::create_order`] runs a key's first request, its order and its stored response in one
//!   transaction; a repeat replays the stored response byte for byte.
//! - The outbox is claimed under a lease; a result is recorded only while its relay still holds
//!   the lease, and a whole batch of results commits together.
//! - An error means nothing was committed: the caller answers 503 and the sender retries.

pub mod changes;
pub mod copy;
pub mod counters;
mod location;
pub mod model;
pub(crate) mod payments;
pub mod postgres;
pub mod sqlite;

use futures_util::future::BoxFuture;

pub use crate::domain::Outcome;
use crate::domain::{NormalizedEvent, OrderStatus};
pub use changes::{Change, ChangeCursor, ChangeRow, MAX_CHANGES_PAGE};
pub use location::{maintenance, open, Location, Options};
pub use model::{
    BackupReport, ClaimRequest, Claimed, ClaimedEmail, ClaimedForward, DeletedRun, EventCount,
    EventDetail, EventQuery, EventSummary, ForwardRow, IdempotentOutcome, NewOrder, NextTry,
    OperatorChange, OrderView, OrdersOutsideRuns, OutboxAttempt, OutboxBacklog, OutboxKind,
    OutboxQuery, OutboxRow, PaymentView, Purged, Retried, RunCounts, RunDeletion, RunEmail,
    RunMarker, SendOutcome, SendResult, SetStatusError, Skipped, StoreStats, StoredResponse,
    Transition, WriterStats, DEFAULT_PURGE_BATCH, RUN_ORDER_PREFIX,
};
/// PostgreSQL writers per instance by default (`serve --pg-writers`).
pub use postgres::writer::DEFAULT_WRITERS as DEFAULT_PG_WRITERS;

/// A store failure, in engine-neutral kinds. What the database itself reported is kept as the
/// source of [`StoreError::Database`] (SQLite's extended result code, PostgreSQL's SQLSTATE), so
/// that a log line still says what the disk or the server said.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database file {0} does not exist")]
    Missing(String),
    /// A database server's database without sekali's tables, opened by a command that only
    /// reads: not the database `serve` uses (which creates them), or not yet served.
    #[error("the database {0} holds no sekali tables")]
    NoTables(String),
    /// The file could not be opened or created; `reason` says why in terms of the file system
    /// (the directory is missing or not writable), which SQLite's "unable to open database file"
    /// does not.
    #[error("cannot open the database file {path}: {reason}")]
    CannotOpen { path: String, reason: String },
    /// The database server could not be reached or refused the connection; `reason` is what it
    /// said (a wrong password, an unknown database, no route to the host).
    #[error("cannot connect to the database {target}: {reason}")]
    CannotConnect { target: String, reason: String },
    /// The database opens but cannot keep sekali's promises as it is set up (a file that can
    /// only be read, a journal mode without durable commits, a server that acknowledges commits
    /// before they are on disk). Found at open, so `serve` refuses to start instead of
    /// answering every delivery 503, or acknowledging what it could lose. The text says what is
    /// wrong and what to change.
    #[error("{0}")]
    Unfit(String),
    /// The database reported an error.
    #[error(transparent)]
    Database(DatabaseError),
    #[error("the database has schema version {found}; this sekali knows up to {known}")]
    SchemaTooNew { found: i64, known: i64 },
    #[error("the database holds sekali's tables but no schema version (PRAGMA user_version is 0), so sekali cannot tell what to migrate; a copy made with `sqlite3 .dump` loses the version: set it to the version of the sekali that wrote the file (`sqlite3 FILE 'PRAGMA user_version = N'`; `schema.sql` of that version names N), or copy databases with `sekali backup`, which keeps it")]
    SchemaUnversioned,
    /// A fault point fired (tests with the `failpoints` feature only).
    #[error("fault injected at {0}")]
    Injected(&'static str),
    #[error("refusing to overwrite {0}")]
    Exists(String),
    #[error("cannot write the backup {path}: {reason}")]
    BackupOut { path: String, reason: String },
    #[error("the backup copy failed its integrity check: {0}")]
    Integrity(String),
    #[error("a stored event could not be read: {0}")]
    StoredEvent(String),
    /// A blocking task of the store could not run (the runtime is shutting down).
    #[error("the store's blocking task did not run: {0}")]
    Blocking(String),
}

/// How a database error bears on what the caller does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Goes away by itself (a lock held elsewhere, a full disk, a serialization failure, a
    /// pool with no free connection): nothing was committed, retry later.
    Transient,
    /// The connection itself is broken (an I/O fault under it, a server that went away): also
    /// transient, and the engine replaces the connection before its next transaction.
    ConnectionLost,
    /// Another transaction's changes conflicted with this one (a deadlock, a serialization
    /// failure), and the database undid it: transient, and running it again at once usually
    /// succeeds (the engine does, a few times, before answering 503).
    Conflict,
    /// Retrying the same thing fails the same way (a constraint, a malformed statement).
    Permanent,
}

/// An error the database reported, with its kind. Displays as the engine's own error, whose
/// source chain it keeps.
#[derive(Debug)]
pub struct DatabaseError {
    pub kind: ErrorKind,
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl DatabaseError {
    pub fn new(kind: ErrorKind, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        DatabaseError {
            kind,
            source: Box::new(source),
        }
    }

    /// The engine's own error.
    pub fn engine_error(&self) -> &(dyn std::error::Error + 'static) {
        &*self.source
    }
}

impl std::fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for DatabaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
}

impl StoreError {
    pub fn database(
        kind: ErrorKind,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError::Database(DatabaseError::new(kind, source))
    }

    /// True for faults that go away by themselves (lock held elsewhere, disk full, a lost
    /// connection): the caller should retry later.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Database(e) => e.kind != ErrorKind::Permanent,
            StoreError::Blocking(_) => true,
            _ => false,
        }
    }

    /// True for a conflict with another transaction, worth running again at once.
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Database(e) if e.kind == ErrorKind::Conflict)
    }

    /// True when the connection that reported it should be replaced.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, StoreError::Database(e) if e.kind == ErrorKind::ConnectionLost)
    }
}

/// Commits a store is told to fail, to show that an error means nothing was committed: the
/// conformance suite's "fail the next commit", on every engine. The writer takes one before
/// each COMMIT; while any is left, it rolls the transaction back instead and answers every
/// unit of work in it with an error, as when the database refuses the COMMIT. Nothing outside
/// the tests sets it.
#[derive(Debug, Clone, Default)]
pub struct CommitFaults(std::sync::Arc<std::sync::atomic::AtomicU32>);

impl CommitFaults {
    /// The next `n` commits fail.
    pub fn fail_next(&self, n: u32) {
        self.0.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// True when this commit is to fail (and one fewer is left).
    pub fn take(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.0
            .fetch_update(SeqCst, SeqCst, |left| left.checked_sub(1))
            .is_ok()
    }
}

/// Why a write did not happen. Every variant means "not committed": the caller answers 503.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("the write queue is full")]
    QueueFull,
    #[error("the writer is not running")]
    WriterGone,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `POST /orders` under an Idempotency-Key: the key's record, the order and the response to
/// store, all committed together.
pub struct CreateOrder {
    /// Who is calling (the API token's name): keys are scoped per client.
    pub client: String,
    pub key: String,
    /// What identifies the request: the same key with another fingerprint is refused.
    pub fingerprint: String,
    pub retention_secs: i64,
    pub order: NewOrder,
    /// The response to store and send, from the created order, or from `None` when the order id
    /// exists already. The route's wording, run inside the transaction: the store only keeps it.
    pub respond: Respond,
}

/// Words the response to a new Idempotency-Key (see [`CreateOrder::respond`]).
pub type Respond = Box<dyn FnOnce(Option<&OrderView>) -> StoredResponse + Send>;

/// A page of orders: by id, after the cursor `after`, optionally of one status.
#[derive(Debug, Clone, Default)]
pub struct OrderQuery {
    pub status: Option<OrderStatus>,
    pub after: Option<String>,
    pub limit: u32,
}

/// The server's store. Every method may be called from any task; none blocks the async
/// executor (an engine runs its blocking work on threads of its own).
pub trait Store: Send + Sync {
    /// Claims `event` and applies its effects (`payload` is the raw verified body, kept for
    /// inspection); resolves after the commit that contains it.
    fn record(
        &self,
        event: NormalizedEvent,
        payload: String,
    ) -> BoxFuture<'_, Result<Outcome, WriteError>>;

    /// Creates an API order under its Idempotency-Key, or replays the key's stored response.
    fn create_order(
        &self,
        request: CreateOrder,
    ) -> BoxFuture<'_, Result<IdempotentOutcome, WriteError>>;

    /// Claims up to `request.limit` due rows of `request.outbox` under a lease for
    /// `request.owner`, in the writer's transaction. Forwarded changes: the oldest unfinished
    /// change of each order only, so that an order's changes go in order.
    fn claim(&self, request: ClaimRequest) -> BoxFuture<'_, Result<Claimed, WriteError>>;

    /// Records a relay batch's results for rows of `outbox` in one transaction; per result,
    /// whether `owner` still held the row's lease (false: not recorded).
    fn record_results(
        &self,
        outbox: OutboxKind,
        owner: String,
        results: Vec<SendResult>,
    ) -> BoxFuture<'_, Result<Vec<bool>, WriteError>>;

    /// [`Store::claim`] of emails.
    fn claim_outbox(
        &self,
        request: ClaimRequest,
    ) -> BoxFuture<'_, Result<Vec<ClaimedEmail>, WriteError>> {
        let request = ClaimRequest {
            outbox: OutboxKind::Email,
            ..request
        };
        Box::pin(async move { Ok(self.claim(request).await?.emails()) })
    }

    /// [`Store::record_results`] of emails.
    fn record_outbox_results(
        &self,
        owner: String,
        results: Vec<SendResult>,
    ) -> BoxFuture<'_, Result<Vec<bool>, WriteError>> {
        self.record_results(OutboxKind::Email, owner, results)
    }

    /// [`Store::claim`] of changes to forward.
    fn claim_forwards(
        &self,
        request: ClaimRequest,
    ) -> BoxFuture<'_, Result<Vec<ClaimedForward>, WriteError>> {
        let request = ClaimRequest {
            outbox: OutboxKind::Forward,
            ..request
        };
        Box::pin(async move { Ok(self.claim(request).await?.forwards()) })
    }

    /// [`Store::record_results`] of forwarded changes.
    fn record_forward_results(
        &self,
        owner: String,
        results: Vec<SendResult>,
    ) -> BoxFuture<'_, Result<Vec<bool>, WriteError>> {
        self.record_results(OutboxKind::Forward, owner, results)
    }

    /// Deletes up to `limit` expired event ids and idempotency keys in one transaction.
    fn purge_batch(&self, limit: usize) -> BoxFuture<'_, Result<Purged, WriteError>>;

    /// One order, with its history.
    fn order(&self, order_id: String) -> BoxFuture<'_, Result<Option<OrderView>, StoreError>>;

    /// A page of orders, without their histories.
    fn orders(&self, query: OrderQuery) -> BoxFuture<'_, Result<Vec<OrderView>, StoreError>>;

    /// Up to `limit` order changes after `after` (from the first without it), in commit order:
    /// a client that pages on from the last one's cursor misses none and sees none twice.
    fn changes(
        &self,
        after: Option<ChangeCursor>,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Change>, StoreError>>;

    /// Each outbox's backlog as of `now_ms`: emails, then forwarded changes.
    fn outbox_backlog(
        &self,
        now_ms: i64,
    ) -> BoxFuture<'_, Result<[(OutboxKind, OutboxBacklog); 2], StoreError>>;

    /// Ok when the database answers a read.
    fn check_health(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Proves the database takes writes now: a write transaction through the writer (behind
    /// what is queued) that runs the purge's delete with a limit of 0, so it changes nothing.
    /// It takes SQLite's write lock, and PostgreSQL refuses it on a read-only server or
    /// connection. A disk that fails only when pages are written shows in the next delivery's
    /// commit instead.
    fn check_writable(&self) -> BoxFuture<'_, Result<(), WriteError>> {
        Box::pin(async move { self.purge_batch(0).await.map(|_| ()) })
    }

    /// What the store has done since it started (for `/healthz`, and tests that must know that
    /// deliveries shared a transaction).
    fn stats(&self) -> StoreStats;

    /// The writer's commit latency and batch sizes, shared (for `/metrics`).
    fn writer_histograms(&self) -> counters::WriterHistograms;

    /// Finishes everything already queued, then stops. Blocking.
    fn shutdown(&self);
}

/// An operator's command on the database (`sekali events`, `outbox`, `orders set-status`,
/// `purge`, `backup`, and the load generator's checks and cleanup), on a connection of its own.
pub trait Maintenance {
    /// The events that match `query`, newest first, filtered by the engine (a listing of the
    /// last hour of a large table must not read every row into the command).
    fn events(&self, query: &EventQuery) -> Result<Vec<EventSummary>, StoreError>;

    /// Every stored event with this id (one per provider at most).
    fn find_events(
        &self,
        event_id: &str,
        provider: Option<&str>,
    ) -> Result<Vec<EventDetail>, StoreError>;

    /// One order, with its history.
    fn order(&self, order_id: &str) -> Result<Option<OrderView>, StoreError>;

    /// The audit trail of one order (`order_transitions`), oldest first; empty for an order
    /// that does not exist.
    fn transitions(&self, order_id: &str) -> Result<Vec<Transition>, StoreError>;

    /// The outbox rows that match `query`, newest first, filtered by the engine.
    fn outbox(&self, query: &OutboxQuery) -> Result<Vec<OutboxRow>, StoreError>;

    fn outbox_row(&self, id: i64) -> Result<Option<OutboxRow>, StoreError>;

    /// `sekali outbox retry`: makes row `id` due at `now_ms`, if it is dead (its attempts and
    /// first try reset) or pending under no live lease (its attempts and first try kept); says
    /// what it did, or why it did nothing (see [`Retried`]). One transaction: no relay's claim
    /// or result falls between the look and the change.
    fn retry(&self, id: i64, now_ms: i64) -> Result<Retried, StoreError>;

    /// `sekali outbox skip`: a pending or dead email is never sent (status `skipped`, its
    /// `last_error` saying an operator did it); unless a relay is sending it right now. One
    /// transaction.
    fn skip_email(&self, id: i64, now_ms: i64) -> Result<Skipped, StoreError>;

    /// Every result recorded for row `row_id` of `outbox`, oldest first (the console's order
    /// story).
    fn outbox_attempts(
        &self,
        outbox: OutboxKind,
        row_id: i64,
    ) -> Result<Vec<OutboxAttempt>, StoreError>;

    /// A console session (`session`: a hash of its cookie) logged out of: refused from now on
    /// by every instance until `expires_unix`, when it would have ended anyway.
    fn end_console_session(
        &self,
        session: &str,
        expires_unix: i64,
        now_unix: i64,
    ) -> Result<(), StoreError>;

    /// Whether the console session `session` was logged out of.
    fn console_session_ended(&self, session: &str) -> Result<bool, StoreError>;

    /// The events received since `since_unix`, counted by provider and outcome (the console's
    /// overview).
    fn event_counts(&self, since_unix: i64) -> Result<Vec<EventCount>, StoreError>;

    /// The forwarding rows that match `query`, newest first (`sekali forward list`).
    fn forwards(&self, query: &OutboxQuery) -> Result<Vec<ForwardRow>, StoreError>;

    /// One forwarding row, with the body of its message (`sekali forward show`).
    fn forward_row(&self, id: i64) -> Result<Option<(ForwardRow, String)>, StoreError>;

    /// `sekali forward retry`: as [`Maintenance::retry`], for a forwarding row.
    fn retry_forward(&self, id: i64, now_ms: i64) -> Result<Retried, StoreError>;

    /// `sekali forward skip`: a pending or dead row is never sent, and its order's later
    /// changes may go; unless a relay is sending it right now. One transaction.
    fn skip_forward(&self, id: i64, now_ms: i64) -> Result<Skipped, StoreError>;

    /// Turns forwarding on (every change from now on also queued for the shop's endpoint) or
    /// off; whether that changed anything.
    fn set_forwarding(&self, on: bool, now_unix: i64) -> Result<bool, StoreError>;

    /// The operator's override: any status but the one the order has, recorded as a transition
    /// by `operator` with the operator's name and reason, with the customer notice the new status
    /// carries. Returns the previous status.
    fn set_status_by_operator(
        &self,
        order_id: &str,
        change: &OperatorChange,
        now_unix: i64,
    ) -> Result<OrderStatus, SetStatusError>;

    /// A whole purge pass: batches in their own transactions until one comes back short.
    fn purge_all_expired(&self, now_unix: i64, batch: usize) -> Result<Purged, StoreError>;

    /// A consistent copy of the database at `out`, checked and durable before this returns.
    fn backup(&self, out: &std::path::Path) -> Result<BackupReport, StoreError>;

    /// Every row of every table of [`copy::TABLES`], from one consistent snapshot, table by
    /// table in that order: `visit(table, row)` (what `sekali copy` moves to another engine).
    fn export(&self, visit: copy::Visit<'_>) -> Result<(), StoreError>;

    /// Rows of one load-generator run: events whose id, and orders and emails whose order id,
    /// contain `marker`.
    fn run_counts(&self, marker: &str) -> Result<RunCounts, StoreError>;

    /// Orders whose id is not a load-generator run's (`bench_{hex run id}_…`): real orders,
    /// which the load generator refuses to write beside. Their count, and up to `examples` ids.
    fn orders_outside_runs(&self, examples: u32) -> Result<OrdersOutsideRuns, StoreError>;

    /// Deletes every row one load-generator run wrote, in ONE write transaction: its events,
    /// orders, their transitions and payments, and its emails, whose keys and orders it returns
    /// (to remove their files). Unless one of its emails is leased to a relay at `now_ms`: a
    /// relay may be writing it now, and would write a file after the deletion, so nothing is
    /// deleted and [`RunDeletion::Leased`] says how many are (the caller waits, and asks again).
    /// Checked in the same transaction, so no relay can claim a row between the check and the
    /// deletion; once committed, no relay can claim one at all.
    fn delete_run(&self, run: &RunMarker, now_ms: i64) -> Result<RunDeletion, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::{StoreError, WriteError};
    use crate::telemetry::ErrorChain;

    #[test]
    fn a_logged_store_error_keeps_sqlites_extended_code_and_repeats_no_cause() {
        let io = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR_FSYNC),
            Some("disk I/O error".into()),
        );
        let error = WriteError::Store(StoreError::from(io));
        let line = ErrorChain(&error).to_string();
        // The two transparent wrappers add nothing; SQLite's own error then names its extended
        // code (1034, SQLITE_IOERR_FSYNC), not nested Debug (`Store(Sqlite(SqliteFailure(…)))`).
        assert_eq!(line, "disk I/O error: Error code 1034: disk I/O error");
    }
}
