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
//!
//! The outbox relay inside `serve` writes through the same thread: its claims and its results
//! are units of work in the batch, so they share the deliveries' commit (one fsync) instead of
//! fighting them for SQLite's write lock. Webhooks keep priority: a claim that arrives while the
//! writer is busy (deliveries at [`BUSY_DELIVERIES_PER_SEC`] or more lately, or queueing for it:
//! batches of [`BUSY_BATCH_DELIVERIES`] on average; or, while any deliveries come, the relay's
//! batches having had [`RELAY_SHARE_WHILE_DELIVERING_PERCENT`] of its time) waits until it is
//! not, or at most [`CLAIM_MAX_DEFER`], and is then served with at most [`CLAIM_UNDER_LOAD`]
//! rows. So under saturating load the relay trickles, under a lighter one it takes at most a
//! quarter of the writer, no delivery waits behind more than one small claim, and once the load
//! ends the relay drains at full speed.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;
use tracing::Span;

use super::events::{record_event_and_apply, Outcome};
use super::idempotency::run_idempotent;
use super::outbox;
use super::statements::Statements;
use super::{open_for_writing, purge, StoreError};
use crate::clock::SharedClock;
use crate::domain::NormalizedEvent;
use crate::store::counters::{Done, Reply, WriterCounters};
use crate::store::model::{
    ClaimRequest, Claimed, IdempotentOutcome, OutboxKind, Purged, SendResult, WriterStats,
};
use crate::store::{CommitFaults, CreateOrder, WriteError};

#[derive(Debug, Clone)]
pub struct WriterConfig {
    pub db_path: PathBuf,
    /// Most deliveries committed by one transaction.
    pub batch_max: usize,
    /// Deliveries waiting for the writer before new ones get 503.
    pub queue_capacity: usize,
    pub busy_timeout: Duration,
    /// Caps the database at this many pages (`PRAGMA max_page_count`); writes past it fail
    /// like a full disk. `None`: no cap but the disk's.
    pub max_page_count: Option<u64>,
    /// Reads stored bodies back, to build the ledger of a database from before it (see
    /// [`rebuild_ledger`](super::rebuild::rebuild_ledger)); `None` leaves that to a sekali that
    /// has one (`serve` does).
    pub reread: Option<super::events::RereadStored>,
    /// Commits to fail on purpose (the conformance suite's "fail the next commit").
    pub commit_faults: CommitFaults,
}

/// The writer is busy when it has committed deliveries at this rate or more over the last
/// [`BUSY_WINDOW`] (or when they queue for it: [`BUSY_BATCH_DELIVERIES`]): relay claims then
/// wait. A third of what this kind of machine carries, far
/// above what a shop's providers send for long.
pub const BUSY_DELIVERIES_PER_SEC: usize = 10_000;
/// The writer is also busy when its batches over the last [`BUSY_WINDOW`] held this many
/// deliveries or more on average: deliveries then arrive faster than it commits them, and wait
/// for it, whatever the rate. A slow disk saturates the writer far below
/// [`BUSY_DELIVERIES_PER_SEC`] (seen here: 7,400/s with fsyncs of 1-2 ms, the relay then
/// running through the load and the deliveries' p99 at 2.4 times that of `--no-relay`). A
/// steady load that the writer keeps up with leaves its batches small: at most the deliveries
/// in flight, a few per commit.
pub const BUSY_BATCH_DELIVERIES: usize = 16;
/// How far back the writer looks to tell whether it is busy.
pub const BUSY_WINDOW: Duration = Duration::from_millis(100);
/// The longest a relay claim waits for the writer not to be busy.
pub const CLAIM_MAX_DEFER: Duration = Duration::from_secs(10);
/// The most rows a claim that waited out [`CLAIM_MAX_DEFER`] gets, while the writer is busy.
pub const CLAIM_UNDER_LOAD: usize = 64;
/// While deliveries come, however slowly, the writer is also busy once its batches that held
/// relay work took this share of the last [`BUSY_WINDOW`] (in percent). Below the busy rate a
/// relay draining a backlog otherwise claims back to back: seen here at 2,000 deliveries/s over
/// a 200,000-email backlog, its batches took 45 % of the writer's time, the deliveries' own
/// another 44 %, and a delivery waited behind them (p99 37-42 ms, against 17 ms with no
/// backlog). A steady load's email alone needs about 5 %.
pub const RELAY_SHARE_WHILE_DELIVERING_PERCENT: u32 = 25;

/// One unit of work for its own savepoint in a batch, with the span of the request that sent it.
struct RecordJob {
    work: Work,
    span: Span,
}

// A delivery carries its event inline: every `Work` travels inside a `Box<RecordJob>` already,
// and a second box would be a second allocation per delivery.
#[allow(clippy::large_enum_variant)]
enum Work {
    /// A verified webhook delivery: claim the event and apply its effects.
    Delivery {
        event: NormalizedEvent,
        payload: String,
        reply: Reply<Outcome>,
    },
    /// A request to sekali's own API under an Idempotency-Key.
    Idempotent {
        request: CreateOrder,
        reply: Reply<IdempotentOutcome>,
    },
    /// The relay inside `serve` claiming due outbox rows.
    OutboxClaim {
        request: ClaimRequest,
        reply: Reply<Claimed>,
    },
    /// The relay inside `serve` recording the results of a batch it sent.
    OutboxResults {
        owner: String,
        results: Vec<SendResult>,
        outbox: OutboxKind,
        reply: Reply<Vec<bool>>,
    },
}

impl Work {
    /// Answers 503: the work did not commit.
    fn fail(self) {
        self.failed(transaction_lost()).answer()
    }

    /// The answer that this work failed with `error`.
    fn failed(self, error: StoreError) -> Done {
        match self {
            Work::Delivery { reply, .. } => Done::Delivery(reply, Err(error)),
            Work::Idempotent { reply, .. } => Done::Idempotent(reply, Err(error)),
            Work::OutboxClaim { reply, .. } => Done::OutboxClaim(reply, Err(error)),
            Work::OutboxResults { reply, .. } => Done::OutboxResults(reply, Err(error)),
        }
    }

    fn is_delivery(&self) -> bool {
        matches!(self, Work::Delivery { .. })
    }

    fn is_relay(&self) -> bool {
        matches!(self, Work::OutboxClaim { .. } | Work::OutboxResults { .. })
    }

    /// The answer to the unit's own failure, which was rolled back alone; logged.
    fn failed_alone(self, error: StoreError) -> Done {
        log_failure_alone(&self, &error);
        self.failed(error)
    }
}

enum Job {
    Record(Box<RecordJob>),
    PurgeBatch { limit: usize, reply: Reply<Purged> },
    Shutdown,
}

/// A handle to the writer thread; cheap to clone.
#[derive(Clone)]
pub struct Writer {
    queue: SyncSender<Job>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
    counters: Arc<WriterCounters>,
}

impl Writer {
    /// Opens the database (creating it and applying the schema) and starts the writer thread.
    pub fn start(config: WriterConfig, clock: SharedClock) -> Result<Self, StoreError> {
        // Open once here so a bad path or a too-new schema fails startup, not the first delivery.
        let counters = Arc::new(WriterCounters {
            commit_faults: config.commit_faults.clone(),
            ..WriterCounters::default()
        });
        let conn = open_writer_connection(&config, &counters)?;
        if let Some(reread) = config.reread {
            super::rebuild::rebuild_ledger(&conn, reread, clock.now_unix())?;
        }
        let (queue, jobs) = mpsc::sync_channel(config.queue_capacity.max(1));
        let shared = counters.clone();
        let thread = std::thread::Builder::new()
            .name("sekali-writer".into())
            .spawn(move || run(conn, jobs, config, clock, &shared))
            .expect("spawning the writer thread");
        Ok(Writer {
            queue,
            thread: Arc::new(Mutex::new(Some(thread))),
            counters,
        })
    }

    /// What the writer has done since it started.
    pub fn stats(&self) -> WriterStats {
        self.counters.read()
    }

    pub fn histograms(&self) -> crate::store::counters::WriterHistograms {
        self.counters.histograms()
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
    pub async fn idempotent(&self, request: CreateOrder) -> Result<IdempotentOutcome, WriteError> {
        let (reply, answer) = oneshot::channel();
        let job = RecordJob {
            work: Work::Idempotent { request, reply },
            span: Span::current(),
        };
        self.submit(Job::Record(Box::new(job)))?;
        answer.await.unwrap_or(Err(WriteError::WriterGone))
    }

    /// Claims due outbox rows for the relay inside `serve`, in the writer's transaction; resolves
    /// after its COMMIT. While the writer is busy with deliveries, the claim waits (see the
    /// module docs).
    pub async fn claim_outbox(&self, request: ClaimRequest) -> Result<Claimed, WriteError> {
        let (reply, answer) = oneshot::channel();
        let job = RecordJob {
            work: Work::OutboxClaim { request, reply },
            span: Span::current(),
        };
        self.submit_waiting(Job::Record(Box::new(job))).await?;
        answer.await.unwrap_or(Err(WriteError::WriterGone))
    }

    /// Records the results of a batch the relay inside `serve` sent, all in one of the writer's
    /// transactions; resolves after its COMMIT with, per result, whether `owner` still held the
    /// row's lease.
    pub async fn record_outbox_results(
        &self,
        owner: String,
        results: Vec<SendResult>,
        outbox: OutboxKind,
    ) -> Result<Vec<bool>, WriteError> {
        let (reply, answer) = oneshot::channel();
        let job = RecordJob {
            work: Work::OutboxResults {
                owner,
                results,
                outbox,
                reply,
            },
            span: Span::current(),
        };
        self.submit_waiting(Job::Record(Box::new(job))).await?;
        answer.await.unwrap_or(Err(WriteError::WriterGone))
    }

    /// Like `submit`, but the relay's work does not take a full queue's refusal as an answer:
    /// it waits for room, a little at a time, so deliveries keep the queue's places.
    async fn submit_waiting(&self, mut job: Job) -> Result<(), WriteError> {
        loop {
            match self.queue.try_send(job) {
                Ok(()) => {
                    self.counters.queue(1);
                    fail::fail_point!("writer::queued");
                    return Ok(());
                }
                Err(TrySendError::Full(returned)) => {
                    job = returned;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(TrySendError::Disconnected(_)) => return Err(WriteError::WriterGone),
            }
        }
    }

    /// Deletes up to `limit` expired event ids and idempotency keys in one transaction.
    pub async fn purge_batch(&self, limit: usize) -> Result<Purged, WriteError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::PurgeBatch { limit, reply })?;
        answer.await.unwrap_or(Err(WriteError::WriterGone))
    }

    fn submit(&self, job: Job) -> Result<(), WriteError> {
        self.queue.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => WriteError::QueueFull,
            TrySendError::Disconnected(_) => WriteError::WriterGone,
        })?;
        self.counters.queue(1);
        // Tests (`failpoints`): a callback here counts the jobs handed to the writer, so a test
        // knows when all of its deliveries wait in the queue (see `writer::before_batch`).
        fail::fail_point!("writer::queued");
        Ok(())
    }

    /// Lets the writer finish everything already queued, then stops it and waits. Blocking.
    pub fn shutdown(&self) {
        // `send` (not try_send): wait for room so the request cannot be lost on a full queue.
        if self.queue.send(Job::Shutdown).is_ok() {
            self.counters.queue(1);
        }
        if let Some(thread) = self.thread.lock().expect("writer thread lock").take() {
            let _ = thread.join();
        }
    }
}

/// "Now", read once per batch.
#[derive(Debug, Clone, Copy)]
struct Now {
    unix: i64,
    millis: i64,
}

impl Now {
    fn of(clock: &SharedClock) -> Now {
        let millis = clock.now_millis();
        Now {
            unix: clock.now_unix(),
            millis,
        }
    }
}

fn run(
    mut conn: Connection,
    jobs: Receiver<Job>,
    config: WriterConfig,
    clock: SharedClock,
    counters: &WriterCounters,
) {
    let batch_max = config.batch_max.max(1);
    let mut batch = Vec::with_capacity(batch_max);
    // Relay claims waiting for the writer not to be busy, with when each arrived.
    let mut waiting_claims: Vec<(RecordJob, Instant)> = Vec::new();
    // Deliveries per batch over the last BUSY_WINDOW, to tell a busy writer.
    let mut recent = RecentDeliveries::default();
    let mut shutting_down = false;
    while !shutting_down {
        let received = match waiting_claims.first() {
            None => jobs.recv().map_err(|_| RecvTimeoutError::Disconnected),
            // Looked at again once the busy window has passed: when a load ends, no job comes
            // to wake the writer, and the relay sat idle until its claim's defer was up (10 s
            // of a 200,000-email backlog left untouched after each benchmark's load).
            Some((_, since)) => jobs.recv_timeout(
                CLAIM_MAX_DEFER
                    .saturating_sub(since.elapsed())
                    .min(BUSY_WINDOW),
            ),
        };
        match received {
            Ok(job) => {
                counters.queue(-1);
                batch.push(job)
            }
            Err(RecvTimeoutError::Timeout) => {} // time to look at the waiting claims again
            Err(RecvTimeoutError::Disconnected) => break, // every handle dropped
        }
        // Tests (`failpoints`): `pause` here holds the writer with the first job of its next
        // batch taken and the rest left queued; once released, it takes all of them (up to
        // `batch_max`) into one batch. So a test knows which deliveries share a transaction.
        fail::fail_point!("writer::before_batch");
        // Take what is already queued, without waiting for more.
        while batch.len() < batch_max {
            match jobs.try_recv() {
                Ok(job) => {
                    counters.queue(-1);
                    batch.push(job)
                }
                Err(_) => break,
            }
        }
        let mut records = Vec::with_capacity(batch.len());
        let mut others = Vec::new();
        for job in batch.drain(..) {
            match job {
                Job::Record(record) if matches!(record.work, Work::OutboxClaim { .. }) => {
                    waiting_claims.push((*record, Instant::now()))
                }
                Job::Record(record) => records.push(*record),
                Job::Shutdown => shutting_down = true,
                other => others.push(other),
            }
        }
        let busy = recent.add(
            Instant::now(),
            records.iter().filter(|job| job.work.is_delivery()).count(),
        );
        for (mut claim, since) in std::mem::take(&mut waiting_claims) {
            if !busy {
                records.push(claim);
            } else if since.elapsed() >= CLAIM_MAX_DEFER || shutting_down {
                if let Work::OutboxClaim { request, .. } = &mut claim.work {
                    request.limit = request.limit.min(CLAIM_UNDER_LOAD);
                }
                records.push(claim);
            } else {
                waiting_claims.push((claim, since));
            }
        }
        let relay_work = records.iter().any(|job| job.work.is_relay());
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let started = Instant::now();
            if !records.is_empty() && commit_batch(&conn, records, Now::of(&clock), counters) {
                tracing::error!("the write connection failed; reopening it");
                conn = reopen(&config, counters);
                counters.reopens.fetch_add(1, Ordering::Relaxed);
            }
            if relay_work {
                recent.add_relay_time(started.elapsed());
            }
            for job in others {
                if let Job::PurgeBatch { limit, reply } = job {
                    let result = purge::purge_batch_in_transaction(
                        &conn,
                        clock.now_unix(),
                        limit,
                        &counters.commit_faults,
                    )
                    .map_err(WriteError::Store);
                    let _ = reply.send(result);
                }
            }
        }));
        if outcome.is_err() {
            // The jobs of the panicking batch were dropped during unwinding, so their callers
            // got WriterGone (503). Start again from a fresh connection.
            tracing::error!("the writer panicked; reopening its connection");
            let _ = conn.execute_batch("ROLLBACK");
            conn = reopen(&config, counters);
            counters.reopens.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Commit what was queued behind the shutdown request. Anything sent after this loop is
    // dropped with the receiver, so its caller gets WriterGone (503), never silence.
    let leftovers: Vec<RecordJob> = waiting_claims
        .into_iter()
        .map(|(claim, _)| claim)
        .chain(jobs.try_iter().filter_map(|job| match job {
            Job::Record(record) => Some(*record),
            _ => None,
        }))
        .collect();
    for record in leftovers {
        let _ = commit_batch(&conn, vec![record], Now::of(&clock), counters);
    }
    tracing::debug!("writer stopped");
}

/// The batches of the last [`BUSY_WINDOW`]: when each began, its deliveries, and how long it
/// took if it held relay work.
#[derive(Default)]
struct RecentDeliveries {
    batches: std::collections::VecDeque<(Instant, usize, Duration)>,
    total: usize,
    /// The time of the batches in the window that held relay work (a claim, results).
    relay_time: Duration,
    /// Batches in the window that held deliveries (others, the relay's alone, say nothing of
    /// how deliveries queue).
    with_deliveries: usize,
}

impl RecentDeliveries {
    /// Counts a batch of `deliveries` committed at `now`; true when the writer is busy (see the
    /// module docs).
    fn add(&mut self, now: Instant, deliveries: usize) -> bool {
        self.batches.push_back((now, deliveries, Duration::ZERO));
        self.total += deliveries;
        self.with_deliveries += usize::from(deliveries > 0);
        while let Some(&(at, n, relay)) = self.batches.front() {
            if now.duration_since(at) <= BUSY_WINDOW {
                break;
            }
            self.batches.pop_front();
            self.total -= n;
            self.with_deliveries -= usize::from(n > 0);
            self.relay_time -= relay;
        }
        let window_ms = BUSY_WINDOW.as_millis() as usize;
        let fast = self.total * 1000 >= BUSY_DELIVERIES_PER_SEC * window_ms;
        let queueing =
            self.with_deliveries > 0 && self.total >= BUSY_BATCH_DELIVERIES * self.with_deliveries;
        let relay_has_its_share = self.with_deliveries > 0
            && self.relay_time * 100 >= BUSY_WINDOW * RELAY_SHARE_WHILE_DELIVERING_PERCENT;
        fast || queueing || relay_has_its_share
    }

    /// The batch counted last held relay work and took `took` (the whole batch, deliveries in
    /// it included: they waited for the relay's part as well).
    fn add_relay_time(&mut self, took: Duration) {
        if let Some((_, _, relay)) = self.batches.back_mut() {
            *relay += took;
            self.relay_time += took;
        }
    }
}

fn open_writer_connection(
    config: &WriterConfig,
    counters: &WriterCounters,
) -> Result<Connection, StoreError> {
    // When a batch reruns with a savepoint per delivery (see `commit_batch`), SQLite empties each
    // savepoint's sub-journal at its RELEASE. `temp_store` is left at the default: the
    // sub-journal is then held in memory up to SQLite's default spill size (64 KiB), spilling to
    // a temp file past that (see .cargo/config.toml for why not more). `temp_store=MEMORY`
    // never spills but grows in 1 KiB chunks: five allocations per journaled page, which was a
    // fifth of the writer's time when every delivery had a savepoint.
    let conn = open_for_writing(&config.db_path, config.busy_timeout)?;
    WriterCounters::add(&counters.connections_opened, 1);
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

fn reopen(config: &WriterConfig, counters: &WriterCounters) -> Connection {
    loop {
        match open_writer_connection(config, counters) {
            Ok(conn) => return conn,
            Err(e) => {
                tracing::error!(error = %crate::telemetry::ErrorChain(&e), "reopening the write connection failed; retrying in 1s");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// One transaction for all of `records`; answers after COMMIT. Returns true when the connection
/// itself looks broken (I/O error, file replaced or corrupt) and should be reopened.
///
/// Deliveries and the relay's work run first and optimistically, without savepoints: almost
/// every batch succeeds whole, and a savepoint costs SQLite a copy of each page the work touches
/// in the savepoint's journal (a tenth of the writer's work for deliveries; for a relay batch
/// of thousands of rows, its whole size written to a temporary file). If one of them fails, the
/// transaction is rolled back, that unit gets its error, and the rest of the batch runs again
/// from the start with a savepoint each ([`commit_with_savepoints`]). Every unit then ends
/// exactly as if it had had its savepoint all along: the same state before it, the same result,
/// and one failure rolls back alone. All of them can run twice: a rolled-back claim or result
/// left nothing, and nothing was answered before COMMIT. API work under an Idempotency-Key
/// cannot (it is an `FnOnce`), so it always runs in its own savepoint, after the rest.
fn commit_batch(
    conn: &Connection,
    mut records: Vec<RecordJob>,
    now: Now,
    counters: &WriterCounters,
) -> bool {
    // Stable: deliveries keep their order, and come before the relay's work, which is ordered
    // so that a claim sees the results recorded before it; API work comes last.
    records.sort_by_key(|job| match job.work {
        Work::Delivery { .. } => 0,
        Work::OutboxResults { .. } => 1,
        Work::OutboxClaim { .. } => 2,
        Work::Idempotent { .. } => 3,
    });
    let optimistic = records
        .iter()
        .take_while(|job| !matches!(job.work, Work::Idempotent { .. }))
        .count();
    if optimistic == 0 {
        return commit_with_savepoints(conn, records, now, counters);
    }
    if let Err(reopen) = begin(conn) {
        records.into_iter().for_each(|job| job.work.fail());
        return reopen;
    }
    let mut db = Statements::new(conn);
    let mut ran = Vec::with_capacity(optimistic);
    for (index, job) in records[..optimistic].iter().enumerate() {
        match job
            .span
            .in_scope(|| run_rerunnable(&mut db, &job.work, now))
        {
            Ok(output) => ran.push(output),
            Err(e) => {
                drop(db);
                return rerun_without(conn, records, index, e, now, counters);
            }
        }
    }
    let mut done: Vec<Done> = Vec::with_capacity(records.len());
    let mut rest = records.into_iter();
    // `ran` first: zip stops at the shorter side without taking from the other one, so the API
    // work after the optimistic pass stays in `rest`.
    for (output, job) in ran.into_iter().zip(rest.by_ref()) {
        done.push(output.done(job.work));
    }
    finish_in_savepoints(conn, db, rest, done, now, counters)
}

/// What a unit of the optimistic pass produced, to be answered after COMMIT.
enum Ran {
    Delivery(Outcome),
    Claim(Claimed),
    Results(Vec<bool>),
}

impl Ran {
    /// Whether its savepoint keeps what it did: a duplicate delivery's is rolled back.
    fn keeps(&self) -> bool {
        !matches!(self, Ran::Delivery(Outcome::Duplicate))
    }

    /// The answer to `work`, the unit that produced this.
    fn done(self, work: Work) -> Done {
        match (self, work) {
            (Ran::Delivery(outcome), Work::Delivery { reply, .. }) => {
                Done::Delivery(reply, Ok(outcome))
            }
            (Ran::Claim(rows), Work::OutboxClaim { reply, .. }) => {
                Done::OutboxClaim(reply, Ok(rows))
            }
            (Ran::Results(owned), Work::OutboxResults { reply, .. }) => {
                Done::OutboxResults(reply, Ok(owned))
            }
            _ => unreachable!("a unit's output is of its own kind"),
        }
    }
}

/// Runs a delivery, a claim or a batch of results in the open transaction: in the first pass
/// of [`commit_batch`] as it is, in the rerun inside its savepoint (see [`run_work`]).
fn run_rerunnable(db: &mut Statements<'_>, work: &Work, now: Now) -> Result<Ran, StoreError> {
    Ok(match work {
        Work::Delivery { event, payload, .. } => {
            Ran::Delivery(record_event_and_apply(db, event, payload, now.unix)?)
        }
        Work::OutboxClaim { request, .. } => Ran::Claim(outbox::claim_due_in_transaction(
            db.conn(),
            request,
            now.millis,
        )?),
        Work::OutboxResults {
            owner,
            results,
            outbox: kind,
            ..
        } => Ran::Results(outbox::record_results_in_transaction(
            db.conn(),
            *kind,
            owner,
            results,
            now.millis,
        )?),
        Work::Idempotent { .. } => unreachable!("API work always runs in its own savepoint"),
    })
}

/// The optimistic pass of [`commit_batch`] failed at `records[failed]` with `error`: roll back,
/// answer that unit with its error, and run the others again with a savepoint each.
fn rerun_without(
    conn: &Connection,
    mut records: Vec<RecordJob>,
    failed: usize,
    error: StoreError,
    now: Now,
    counters: &WriterCounters,
) -> bool {
    let poisoned = records.remove(failed);
    if conn.is_autocommit() {
        // SQLite rolled the whole transaction back by itself (it does on SQLITE_FULL,
        // SQLITE_IOERR and similar): the connection may be unusable, so nothing is retried.
        tracing::error!(error = %crate::telemetry::ErrorChain(&error), "the batch transaction is lost; everything in it gets 503");
        poisoned.work.fail();
        records.into_iter().for_each(|job| job.work.fail());
        return error.is_connection_lost();
    }
    if let Err(e) = conn.execute_batch("ROLLBACK") {
        tracing::error!(error = %crate::telemetry::ErrorChain(&StoreError::from(e)), "could not roll back a failed batch; everything in it gets 503");
        poisoned.work.fail();
        records.into_iter().for_each(|job| job.work.fail());
        return true;
    }
    let RecordJob { work, span } = poisoned;
    span.in_scope(|| work.failed_alone(error)).answer();
    if records.is_empty() {
        return false;
    }
    tracing::info!(
        units = records.len(),
        "rerunning the rest of the batch with a savepoint each"
    );
    commit_with_savepoints(conn, records, now, counters)
}

/// The transaction is lost (`broken` says why): roll back what is left and answer 503 to all of
/// `done`. Returns true when the connection should be reopened.
fn abandon(conn: &Connection, done: Vec<Done>, broken: StoreError) -> bool {
    // The savepoint could not be undone, or SQLite rolled the whole transaction back by itself
    // (it does on SQLITE_FULL, SQLITE_IOERR and similar): nothing in this batch may commit.
    tracing::error!(error = %crate::telemetry::ErrorChain(&broken), "the batch transaction is lost; everything in it gets 503");
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    done.into_iter().for_each(|d| d.fail(transaction_lost));
    broken.is_connection_lost()
}

/// One transaction for all of `records`, one savepoint each; answers after COMMIT. The
/// fallback of [`commit_batch`]; returns what it returns.
fn commit_with_savepoints(
    conn: &Connection,
    records: Vec<RecordJob>,
    now: Now,
    counters: &WriterCounters,
) -> bool {
    if let Err(reopen) = begin(conn) {
        records.into_iter().for_each(|job| job.work.fail());
        return reopen;
    }
    let done = Vec::with_capacity(records.len());
    finish_in_savepoints(conn, Statements::new(conn), records, done, now, counters)
}

/// Runs each of `jobs` in its own savepoint, after the work already `done` in the open
/// transaction, then commits and answers everything. Returns what [`commit_batch`] returns.
fn finish_in_savepoints(
    conn: &Connection,
    mut db: Statements<'_>,
    jobs: impl IntoIterator<Item = RecordJob>,
    mut done: Vec<Done>,
    now: Now,
    counters: &WriterCounters,
) -> bool {
    for RecordJob { work, span } in jobs {
        let (finished, broken) = span.in_scope(|| run_work(&mut db, work, now));
        done.push(finished);
        if let Some(broken) = broken {
            drop(db);
            return abandon(conn, done, broken);
        }
    }
    drop(db);
    commit_and_answer(conn, done, counters)
}

/// Opens the batch's write transaction. `Err(reopen)` when it did not open: the caller answers
/// 503 to everything, and reopens the connection if `reopen`.
fn begin(conn: &Connection) -> Result<(), bool> {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let e = StoreError::from(e);
        let reopen = e.is_connection_lost();
        tracing::error!(error = %crate::telemetry::ErrorChain(&e), "could not begin the write transaction");
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
fn commit_and_answer(conn: &Connection, done: Vec<Done>, counters: &WriterCounters) -> bool {
    if fault_injected("writer::before_commit") || counters.commit_faults.take() {
        let _ = conn.execute_batch("ROLLBACK");
        done.into_iter().for_each(|d| d.fail(transaction_lost));
        return false;
    }
    let commit_started = std::time::Instant::now();
    let committed = if fault_injected("writer::commit_io_error") {
        Err(injected_io_error())
    } else {
        conn.execute_batch("COMMIT")
    };
    let commit_took = commit_started.elapsed();
    if let Err(e) = committed {
        let e = StoreError::from(e);
        let broken = e.is_connection_lost();
        tracing::error!(error = %crate::telemetry::ErrorChain(&e), "COMMIT failed; everything in the batch gets 503");
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        done.into_iter().for_each(|d| d.fail(transaction_lost));
        return broken;
    }
    counters.committed(done.len(), commit_took);
    done.iter().for_each(|d| d.count(counters));
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
fn run_work(db: &mut Statements<'_>, work: Work, now: Now) -> (Done, Option<StoreError>) {
    let work = match work {
        Work::Idempotent { request, reply } => {
            let client = request.client.clone();
            return match in_savepoint(
                db,
                |db| run_idempotent(db.conn(), request, now.unix),
                |_| true,
            ) {
                Ok(result) => {
                    if let Err(e) = &result {
                        log_api_failure(&client, e);
                    }
                    (Done::Idempotent(reply, result), None)
                }
                Err(broken) => (
                    Done::Idempotent(reply, Err(transaction_lost())),
                    Some(broken),
                ),
            };
        }
        rerunnable => rerunnable,
    };
    match in_savepoint(db, |db| run_rerunnable(db, &work, now), Ran::keeps) {
        Ok(Ok(ran)) => (ran.done(work), None),
        Ok(Err(e)) => (work.failed_alone(e), None),
        Err(broken) => (work.failed(transaction_lost()), Some(broken)),
    }
}

/// A delivery's own failure, rolled back alone. The provider and event id are fields here
/// because the request's `delivery` span exists only at `debug`.
fn log_delivery_failure(event: &NormalizedEvent, error: &StoreError) {
    tracing::error!(
        provider = %event.provider,
        event_id = event.event_id,
        error = %crate::telemetry::ErrorChain(error),
        "delivery failed and was rolled back alone"
    );
}

/// A unit's own failure, rolled back alone.
fn log_failure_alone(work: &Work, error: &StoreError) {
    match work {
        Work::Delivery { event, .. } => log_delivery_failure(event, error),
        Work::Idempotent { request, .. } => log_api_failure(&request.client, error),
        Work::OutboxClaim { .. } => {
            tracing::warn!(error = %crate::telemetry::ErrorChain(error), "the relay's claim failed and was rolled back alone")
        }
        Work::OutboxResults { .. } => {
            tracing::warn!(error = %crate::telemetry::ErrorChain(error), "recording the relay's results failed and was rolled back alone")
        }
    }
}

fn log_api_failure(client: &str, error: &StoreError) {
    tracing::error!(client, error = %crate::telemetry::ErrorChain(error), "API work failed and was rolled back alone");
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
    StoreError::from(rusqlite::Error::SqliteFailure(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_is_busy_while_deliveries_come_at_the_busy_rate_and_not_after() {
        let mut recent = RecentDeliveries::default();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // 10,000/s over the 100 ms window is 1,000 deliveries, here in batches of 10 (too small
        // to say they queue): 999 are not busy, 1,000 are.
        for i in 0..99 {
            assert!(!recent.add(at(i / 2), 10));
        }
        assert!(!recent.add(at(50), 9));
        assert!(recent.add(at(50), 1));
        // Once the window has passed them, the same batches count for nothing.
        assert!(!recent.add(at(151), 0));
        // A trickle never makes it busy.
        for ms in 0..200 {
            assert!(!recent.add(at(200 + ms), 5));
        }
    }

    /// A slow disk saturates the writer far below the busy rate: deliveries then queue, and its
    /// batches grow to the connections waiting.
    #[test]
    fn the_writer_is_busy_while_deliveries_queue_for_it_at_any_rate() {
        let mut recent = RecentDeliveries::default();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // Batches of 50 every 10 ms: 5,000/s, half the busy rate, but each waited a commit.
        assert!(recent.add(at(0), 50));
        assert!(recent.add(at(10), 50));
        // The relay's own batches (no delivery) do not dilute the average.
        assert!(recent.add(at(15), 0));
        // Batches of 15 on average, just under: not busy.
        let mut recent = RecentDeliveries::default();
        assert!(!recent.add(at(0), 10));
        assert!(!recent.add(at(5), 20));
        assert!(!recent.add(at(6), 15));
        // The load ends: the window empties and the relay is served at once.
        let mut recent = RecentDeliveries::default();
        assert!(recent.add(at(0), 64));
        assert!(!recent.add(at(101), 0));
    }

    /// Below the busy rate, a relay draining a backlog takes at most a quarter of the writer
    /// while deliveries come; alone, all of it.
    #[test]
    fn the_relay_gets_a_quarter_of_the_writer_while_deliveries_come_and_all_of_it_after() {
        let mut recent = RecentDeliveries::default();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let ms = Duration::from_millis;
        // A trickle of deliveries, and relay batches of 8 ms: 24 ms of the last 100 is not yet
        // its share, 25 ms is.
        assert!(!recent.add(at(0), 2));
        for start in [0, 8, 16] {
            recent.add(at(start), 0);
            recent.add_relay_time(ms(8));
        }
        assert!(!recent.add(at(30), 2));
        recent.add_relay_time(ms(1)); // that batch held results too
        assert!(recent.add(at(40), 2));
        // The relay's time leaves the window with its batches: by 125 ms only the 1 ms of the
        // batch of 30 ms is left.
        assert!(!recent.add(at(125), 2));
        // With no delivery in the window, the relay may take the writer whole.
        let mut recent = RecentDeliveries::default();
        for start in (0..=100).step_by(10) {
            assert!(!recent.add(at(start), 0));
            recent.add_relay_time(ms(10));
        }
    }
}
