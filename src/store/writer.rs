//! The single writer: one thread owns the only write connection.
//!
//! Why one thread: SQLite has one write lock per database. Pooled writers only take turns on it
//! (and time out with `SQLITE_BUSY` under load), while a single owner never waits on itself and
//! can group deliveries: it takes whatever is queued (up to `batch_max`), opens one
//! `BEGIN IMMEDIATE`, runs each delivery, commits once with `synchronous=FULL`, and only then
//! answers each delivery. A failing delivery rolls back alone: the first pass runs without
//! savepoints, and if a delivery fails the batch is rolled back and the rest rerun with a
//! SAVEPOINT each (see `commit_batch`). No timer:
//! a lone delivery on an empty queue commits at once. `batch_max = 1` gives one transaction per
//! delivery through the same code.
//!
//! Invariant: a delivery's answer is `Ok` only if the COMMIT that contains it succeeded.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::oneshot;
use tracing::Span;

use super::events::{record_event_and_apply, Outcome, Retention};
use super::idempotency::{run_idempotent, IdempotentOutcome, IdempotentRequest};
use super::statements::Statements;
use super::{open_for_writing, purge, StoreError};
use crate::clock::SharedClock;
use crate::domain::NormalizedEvent;

#[derive(Debug, Clone)]
pub struct WriterConfig {
    pub db_path: PathBuf,
    /// Most deliveries committed by one transaction.
    pub batch_max: usize,
    /// Deliveries waiting for the writer before new ones get 503.
    pub queue_capacity: usize,
    pub retention: Retention,
    pub busy_timeout: Duration,
    /// Caps the database at this many pages (`PRAGMA max_page_count`); writes past it fail
    /// like a full disk. `None`: no cap but the disk's.
    pub max_page_count: Option<u64>,
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

type Reply<T> = oneshot::Sender<Result<T, WriteError>>;

/// One unit of work for its own savepoint in a batch, with the span of the request that sent it.
struct RecordJob {
    work: Work,
    span: Span,
}

enum Work {
    /// A verified webhook delivery: claim the event and apply its effects.
    Delivery {
        event: NormalizedEvent,
        payload: String,
        reply: Reply<Outcome>,
    },
    /// A request to sekali's own API under an Idempotency-Key.
    Idempotent {
        request: IdempotentRequest,
        reply: Reply<IdempotentOutcome>,
    },
}

impl Work {
    /// Answers 503: the work did not commit.
    fn fail(self) {
        match self {
            Work::Delivery { reply, .. } => Done::Delivery(reply, Err(transaction_lost())).answer(),
            Work::Idempotent { reply, .. } => {
                Done::Idempotent(reply, Err(transaction_lost())).answer()
            }
        }
    }
}

/// Work done inside the open transaction, waiting for COMMIT before it is answered.
enum Done {
    Delivery(Reply<Outcome>, Result<Outcome, StoreError>),
    Idempotent(
        Reply<IdempotentOutcome>,
        Result<IdempotentOutcome, StoreError>,
    ),
}

impl Done {
    /// Sends the result. The caller may have gone (client disconnected); committed work stays
    /// committed, and a retry finds it (a duplicate, or the stored response).
    fn answer(self) {
        match self {
            Done::Delivery(reply, result) => drop(reply.send(result.map_err(WriteError::from))),
            Done::Idempotent(reply, result) => drop(reply.send(result.map_err(WriteError::from))),
        }
    }

    /// Answers 503: the transaction holding this work did not commit.
    fn fail(self) {
        match self {
            Done::Delivery(reply, _) => Done::Delivery(reply, Err(transaction_lost())).answer(),
            Done::Idempotent(reply, _) => Done::Idempotent(reply, Err(transaction_lost())).answer(),
        }
    }
}

enum Job {
    Record(Box<RecordJob>),
    PurgeBatch {
        limit: usize,
        reply: Reply<purge::Purged>,
    },
    Shutdown,
}

/// A handle to the writer thread; cheap to clone.
#[derive(Clone)]
pub struct Writer {
    queue: SyncSender<Job>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
    reopens: Arc<AtomicU64>,
}

impl Writer {
    /// Opens the database (creating it and applying the schema) and starts the writer thread.
    pub fn start(config: WriterConfig, clock: SharedClock) -> Result<Self, StoreError> {
        // Open once here so a bad path or a too-new schema fails startup, not the first delivery.
        let conn = open_writer_connection(&config)?;
        let (queue, jobs) = mpsc::sync_channel(config.queue_capacity.max(1));
        let reopens = Arc::new(AtomicU64::new(0));
        let counter = reopens.clone();
        let thread = std::thread::Builder::new()
            .name("sekali-writer".into())
            .spawn(move || run(conn, jobs, config, clock, &counter))
            .expect("spawning the writer thread");
        Ok(Writer {
            queue,
            thread: Arc::new(Mutex::new(Some(thread))),
            reopens,
        })
    }

    /// How many times the writer has replaced its connection since it started (after a panic
    /// or a connection fault such as an I/O error). Reported by `/healthz`.
    pub fn reopens(&self) -> u64 {
        self.reopens.load(Ordering::Relaxed)
    }

    /// Claims `event` and applies its effects; resolves after the COMMIT that contains it.
    pub async fn record(
        &self,
        event: NormalizedEvent,
        payload: String,
    ) -> Result<Outcome, WriteError> {
        let (reply, answer) = oneshot::channel();
        let job = RecordJob {
            work: Work::Delivery {
                event,
                payload,
                reply,
            },
            span: Span::current(),
        };
        self.submit(Job::Record(Box::new(job)))?;
        answer.await.unwrap_or(Err(WriteError::WriterGone))
    }

    /// Runs `request` under its Idempotency-Key in the writer's transaction; resolves after the
    /// COMMIT that contains it.
    pub async fn idempotent(
        &self,
        request: IdempotentRequest,
    ) -> Result<IdempotentOutcome, WriteError> {
        let (reply, answer) = oneshot::channel();
        let job = RecordJob {
            work: Work::Idempotent { request, reply },
            span: Span::current(),
        };
        self.submit(Job::Record(Box::new(job)))?;
        answer.await.unwrap_or(Err(WriteError::WriterGone))
    }

    /// Deletes up to `limit` expired event ids and idempotency keys in one transaction.
    pub async fn purge_batch(&self, limit: usize) -> Result<purge::Purged, WriteError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::PurgeBatch { limit, reply })?;
        answer.await.unwrap_or(Err(WriteError::WriterGone))
    }

    fn submit(&self, job: Job) -> Result<(), WriteError> {
        self.queue.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => WriteError::QueueFull,
            TrySendError::Disconnected(_) => WriteError::WriterGone,
        })
    }

    /// Lets the writer finish everything already queued, then stops it and waits. Blocking.
    pub fn shutdown(&self) {
        // `send` (not try_send): wait for room so the request cannot be lost on a full queue.
        let _ = self.queue.send(Job::Shutdown);
        if let Some(thread) = self.thread.lock().expect("writer thread lock").take() {
            let _ = thread.join();
        }
    }
}

fn run(
    mut conn: Connection,
    jobs: Receiver<Job>,
    config: WriterConfig,
    clock: SharedClock,
    reopens: &AtomicU64,
) {
    let batch_max = config.batch_max.max(1);
    let mut batch = Vec::with_capacity(batch_max);
    let mut shutting_down = false;
    while !shutting_down {
        match jobs.recv() {
            Ok(job) => batch.push(job),
            Err(_) => break, // every handle dropped
        }
        // Take what is already queued, without waiting for more.
        while batch.len() < batch_max {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut records = Vec::with_capacity(batch.len());
        let mut others = Vec::new();
        for job in batch.drain(..) {
            match job {
                Job::Record(record) => records.push(*record),
                Job::Shutdown => shutting_down = true,
                other => others.push(other),
            }
        }
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            if !records.is_empty()
                && commit_batch(&conn, records, clock.now_unix(), &config.retention)
            {
                tracing::error!("the write connection failed; reopening it");
                conn = reopen(&config);
                reopens.fetch_add(1, Ordering::Relaxed);
            }
            for job in others {
                if let Job::PurgeBatch { limit, reply } = job {
                    let result = purge::purge_batch_in_transaction(&conn, clock.now_unix(), limit)
                        .map_err(|e| WriteError::Store(e.into()));
                    let _ = reply.send(result);
                }
            }
        }));
        if outcome.is_err() {
            // The jobs of the panicking batch were dropped during unwinding, so their callers
            // got WriterGone (503). Start again from a fresh connection.
            tracing::error!("the writer panicked; reopening its connection");
            let _ = conn.execute_batch("ROLLBACK");
            conn = reopen(&config);
            reopens.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Commit what was queued behind the shutdown request. Anything sent after this loop is
    // dropped with the receiver, so its caller gets WriterGone (503), never silence.
    while let Ok(job) = jobs.try_recv() {
        if let Job::Record(record) = job {
            let _ = commit_batch(&conn, vec![*record], clock.now_unix(), &config.retention);
        }
    }
    tracing::debug!("writer stopped");
}

fn open_writer_connection(config: &WriterConfig) -> Result<Connection, StoreError> {
    // When a batch reruns with a savepoint per delivery (see `commit_batch`), SQLite empties each
    // savepoint's sub-journal at its RELEASE. `temp_store` is left at the default: the
    // sub-journal is then one block of memory of SQLITE_STMTJRNL_SPILL bytes (set in
    // .cargo/config.toml), spilling to a temp file only past that. `temp_store=MEMORY` never
    // spills but grows in 1 KiB chunks: five allocations per journaled page, which was a fifth
    // of the writer's time when every delivery had a savepoint.
    let conn = open_for_writing(&config.db_path, config.busy_timeout)?;
    // The writer checkpoints the WAL itself, after the commit that crosses this many pages, and
    // the deliveries queued meanwhile wait for it. Small checkpoints often rather than SQLite's
    // default of 1000 pages: in six paired runs at 64 connections the p99 fell from 8.7-9.8 ms
    // to 6.4-6.7 ms, with no loss of throughput.
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
    if let Some(pages) = config.max_page_count {
        conn.pragma_update(None, "max_page_count", pages as i64)?;
    }
    Ok(conn)
}

/// See `wal_autocheckpoint` in [`open_writer_connection`].
const WAL_AUTOCHECKPOINT_PAGES: i64 = 250;

fn reopen(config: &WriterConfig) -> Connection {
    loop {
        match open_writer_connection(config) {
            Ok(conn) => return conn,
            Err(e) => {
                tracing::error!(error = ?e, "reopening the write connection failed; retrying in 1s");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// One transaction for all of `records`; answers after COMMIT. Returns true when the connection
/// itself looks broken (I/O error, file replaced or corrupt) and should be reopened.
///
/// Deliveries run first and optimistically, without savepoints: almost every batch succeeds
/// whole, and a savepoint per delivery costs the writer a tenth of its work (SQLite copies each
/// page a delivery touches into the savepoint's journal). If a delivery fails, the transaction
/// is rolled back, that delivery gets its error, and the rest of the batch runs again from the
/// start with a savepoint each ([`commit_with_savepoints`]). Every delivery then ends exactly as
/// if it had had its savepoint all along: the same state before it, the same result, and one
/// failure rolls back alone. API work under an Idempotency-Key cannot run twice (it is an
/// `FnOnce`), so it always runs in its own savepoint, after the deliveries.
fn commit_batch(
    conn: &Connection,
    mut records: Vec<RecordJob>,
    now_unix: i64,
    retention: &Retention,
) -> bool {
    // Stable: deliveries keep their order, and come before API work.
    records.sort_by_key(|job| matches!(job.work, Work::Idempotent { .. }));
    let deliveries = records
        .iter()
        .take_while(|job| matches!(job.work, Work::Delivery { .. }))
        .count();
    if deliveries == 0 {
        return commit_with_savepoints(conn, records, now_unix, retention);
    }
    if let Err(reopen) = begin(conn) {
        records.into_iter().for_each(|job| job.work.fail());
        return reopen;
    }
    let mut db = Statements::new(conn);
    let mut outcomes = Vec::with_capacity(deliveries);
    for (index, job) in records[..deliveries].iter().enumerate() {
        let Work::Delivery { event, payload, .. } = &job.work else {
            unreachable!("the first `deliveries` jobs are deliveries")
        };
        let result = job
            .span
            .in_scope(|| record_event_and_apply(&mut db, event, payload, now_unix, retention));
        match result {
            Ok(outcome) => outcomes.push(outcome),
            Err(e) => {
                drop(db);
                return rerun_without(conn, records, index, e, now_unix, retention);
            }
        }
    }
    let mut done: Vec<Done> = Vec::with_capacity(records.len());
    let mut rest = records.into_iter();
    // `outcomes` first: zip stops at the shorter side without taking from the other one, so the
    // API work after the deliveries stays in `rest`.
    for (outcome, job) in outcomes.into_iter().zip(rest.by_ref()) {
        let Work::Delivery { reply, .. } = job.work else {
            unreachable!("the first `deliveries` jobs are deliveries")
        };
        done.push(Done::Delivery(reply, Ok(outcome)));
    }
    finish_in_savepoints(conn, db, rest, done, now_unix, retention)
}

/// The optimistic pass of [`commit_batch`] failed at `records[failed]` with `error`: roll back,
/// answer that delivery with its error, and run the others again with a savepoint each.
fn rerun_without(
    conn: &Connection,
    mut records: Vec<RecordJob>,
    failed: usize,
    error: StoreError,
    now_unix: i64,
    retention: &Retention,
) -> bool {
    let poisoned = records.remove(failed);
    if conn.is_autocommit() {
        // SQLite rolled the whole transaction back by itself (it does on SQLITE_FULL,
        // SQLITE_IOERR and similar): the connection may be unusable, so nothing is retried.
        tracing::error!(error = ?error, "the batch transaction is lost; everything in it gets 503");
        poisoned.work.fail();
        records.into_iter().for_each(|job| job.work.fail());
        return matches!(&error, StoreError::Sqlite(e) if is_connection_fault(e));
    }
    if let Err(e) = conn.execute_batch("ROLLBACK") {
        tracing::error!(error = ?StoreError::from(e), "could not roll back a failed batch; everything in it gets 503");
        poisoned.work.fail();
        records.into_iter().for_each(|job| job.work.fail());
        return true;
    }
    if let Work::Delivery { event, reply, .. } = poisoned.work {
        poisoned
            .span
            .in_scope(|| log_delivery_failure(&event, &error));
        Done::Delivery(reply, Err(error)).answer();
    }
    if records.is_empty() {
        return false;
    }
    tracing::info!(
        deliveries = records.len(),
        "rerunning the rest of the batch with a savepoint each"
    );
    commit_with_savepoints(conn, records, now_unix, retention)
}

/// The transaction is lost (`broken` says why): roll back what is left and answer 503 to all of
/// `done`. Returns true when the connection should be reopened.
fn abandon(conn: &Connection, done: Vec<Done>, broken: StoreError) -> bool {
    // The savepoint could not be undone, or SQLite rolled the whole transaction back by itself
    // (it does on SQLITE_FULL, SQLITE_IOERR and similar): nothing in this batch may commit.
    tracing::error!(error = ?broken, "the batch transaction is lost; everything in it gets 503");
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    done.into_iter().for_each(Done::fail);
    matches!(&broken, StoreError::Sqlite(e) if is_connection_fault(e))
}

/// One transaction for all of `records`, one savepoint each; answers after COMMIT. The
/// fallback of [`commit_batch`]; returns what it returns.
fn commit_with_savepoints(
    conn: &Connection,
    records: Vec<RecordJob>,
    now_unix: i64,
    retention: &Retention,
) -> bool {
    if let Err(reopen) = begin(conn) {
        records.into_iter().for_each(|job| job.work.fail());
        return reopen;
    }
    let done = Vec::with_capacity(records.len());
    finish_in_savepoints(
        conn,
        Statements::new(conn),
        records,
        done,
        now_unix,
        retention,
    )
}

/// Runs each of `jobs` in its own savepoint, after the work already `done` in the open
/// transaction, then commits and answers everything. Returns what [`commit_batch`] returns.
fn finish_in_savepoints(
    conn: &Connection,
    mut db: Statements<'_>,
    jobs: impl IntoIterator<Item = RecordJob>,
    mut done: Vec<Done>,
    now_unix: i64,
    retention: &Retention,
) -> bool {
    for RecordJob { work, span } in jobs {
        let (finished, broken) = span.in_scope(|| run_work(&mut db, work, now_unix, retention));
        done.push(finished);
        if let Some(broken) = broken {
            drop(db);
            return abandon(conn, done, broken);
        }
    }
    drop(db);
    commit_and_answer(conn, done)
}

/// Opens the batch's write transaction. `Err(reopen)` when it did not open: the caller answers
/// 503 to everything, and reopens the connection if `reopen`.
fn begin(conn: &Connection) -> Result<(), bool> {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let reopen = is_connection_fault(&e);
        tracing::error!(error = ?StoreError::from(e), "could not begin the write transaction");
        return Err(reopen);
    }
    if fault_injected("writer::after_begin") {
        let _ = conn.execute_batch("ROLLBACK");
        return Err(false);
    }
    Ok(())
}

/// COMMITs the open transaction holding `done`, then answers each; 503 to all if it fails.
/// Returns true when the connection should be reopened.
fn commit_and_answer(conn: &Connection, done: Vec<Done>) -> bool {
    if fault_injected("writer::before_commit") {
        let _ = conn.execute_batch("ROLLBACK");
        done.into_iter().for_each(Done::fail);
        return false;
    }
    let committed = if fault_injected("writer::commit_io_error") {
        Err(injected_io_error())
    } else {
        conn.execute_batch("COMMIT")
    };
    if let Err(e) = committed {
        let broken = is_connection_fault(&e);
        tracing::error!(error = ?StoreError::from(e), "COMMIT failed; everything in the batch gets 503");
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        done.into_iter().for_each(Done::fail);
        return broken;
    }
    if fault_injected("writer::after_commit") {
        // Committed, but the answers are lost, as when the process dies right after COMMIT:
        // the callers get 503 and the provider's redelivery is answered as a duplicate.
        return false;
    }
    done.into_iter().for_each(Done::answer);
    false
}

/// Runs one unit of work in its savepoint. The second value is set when the enclosing
/// transaction is no longer usable.
fn run_work(
    db: &mut Statements<'_>,
    work: Work,
    now_unix: i64,
    retention: &Retention,
) -> (Done, Option<StoreError>) {
    match work {
        Work::Delivery {
            event,
            payload,
            reply,
        } => {
            let keep = |outcome: &Outcome| *outcome != Outcome::Duplicate;
            match in_savepoint(
                db,
                |c| record_event_and_apply(c, &event, &payload, now_unix, retention),
                keep,
            ) {
                Ok(result) => {
                    if let Err(e) = &result {
                        log_delivery_failure(&event, e);
                    }
                    (Done::Delivery(reply, result), None)
                }
                Err(broken) => (Done::Delivery(reply, Err(transaction_lost())), Some(broken)),
            }
        }
        Work::Idempotent { request, reply } => {
            let client = request.client.clone();
            match in_savepoint(
                db,
                |db| run_idempotent(db.conn(), request, now_unix),
                |_| true,
            ) {
                Ok(result) => {
                    if let Err(e) = &result {
                        tracing::error!(client, error = ?e, "API work failed and was rolled back alone");
                    }
                    (Done::Idempotent(reply, result), None)
                }
                Err(broken) => (
                    Done::Idempotent(reply, Err(transaction_lost())),
                    Some(broken),
                ),
            }
        }
    }
}

/// A delivery's own failure, rolled back alone. The provider and event id are fields here
/// because the request's `delivery` span exists only at `debug`.
fn log_delivery_failure(event: &NormalizedEvent, error: &StoreError) {
    tracing::error!(
        provider = %event.provider,
        event_id = event.event_id,
        error = ?error,
        "delivery failed and was rolled back alone"
    );
}

/// Errors after which this connection should not be trusted again. Busy and full are not among
/// them: they heal without a new connection.
fn is_connection_fault(error: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::*;
    matches!(
        error,
        rusqlite::Error::SqliteFailure(e, _)
            if matches!(e.code, SystemIoFailure | NotADatabase | CannotOpen | DatabaseCorrupt | ReadOnly)
    )
}

/// Runs `work` inside `SAVEPOINT delivery`, rolled back unless it succeeded and `keep` says so.
/// The inner result is the work's own (an error there was rolled back alone); the outer error
/// means the enclosing transaction is no longer usable.
fn in_savepoint<T>(
    db: &mut Statements<'_>,
    work: impl FnOnce(&mut Statements<'_>) -> Result<T, StoreError>,
    keep: impl Fn(&T) -> bool,
) -> Result<Result<T, StoreError>, StoreError> {
    db.prepare("SAVEPOINT delivery")?.execute([])?;
    let result = work(db);
    if db.conn().is_autocommit() {
        return Err(match result {
            Err(e) => e,
            Ok(_) => transaction_lost(),
        });
    }
    if !matches!(&result, Ok(value) if keep(value)) {
        db.prepare("ROLLBACK TO delivery")?.execute([])?;
    }
    db.prepare("RELEASE delivery")?.execute([])?;
    Ok(result)
}

fn transaction_lost() -> StoreError {
    StoreError::Sqlite(rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
        Some("the batch transaction did not commit".into()),
    ))
}

/// The error SQLite reports when the disk or the file fails under it (tests only: the
/// `writer::commit_io_error` fault point stands for a COMMIT that fails this way).
fn injected_io_error() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
        Some("fault injected at writer::commit_io_error".into()),
    )
}

/// True when the named fault point is configured to fire (tests with `failpoints` only;
/// without the feature this is a constant `false`).
fn fault_injected(_name: &'static str) -> bool {
    fail::fail_point!(_name, |_| true);
    false
}
