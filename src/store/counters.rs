//! What every engine's writer shares: its counters, and the answers it holds until COMMIT.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use tokio::sync::oneshot;

use super::model::{Claimed, IdempotentOutcome, WriterStats};
use super::{CommitFaults, Outcome, StoreError, WriteError};

/// Where a unit of work's answer goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, WriteError>>;

/// What an engine's writer has done since it started: for `/healthz`, `/metrics`, and for tests
/// that must know that deliveries shared a transaction. One per store, whatever its engine.
#[derive(Debug)]
pub struct WriterCounters {
    pub(crate) transactions: AtomicU64,
    pub(crate) deliveries: AtomicU64,
    pub(crate) deliveries_together: AtomicU64,
    pub(crate) outbox_claims: AtomicU64,
    pub(crate) outbox_claimed_rows: AtomicU64,
    pub(crate) outbox_result_batches: AtomicU64,
    pub(crate) outbox_results: AtomicU64,
    pub(crate) reopens: AtomicU64,
    pub(crate) connections_opened: AtomicU64,
    /// Not a count: the units of work queued for the writer and not yet taken (a gauge).
    pub(crate) queued: std::sync::atomic::AtomicI64,
    /// Not a count: the commits the tests told this writer to fail (see [`CommitFaults`]),
    /// beside the counters because every commit path reads both.
    pub(crate) commit_faults: CommitFaults,
    /// How long each COMMIT took (the wait for the disk, or for the server's WAL flush).
    pub(crate) commit_seconds: Histogram,
    /// Units of work (deliveries, claims, results, API requests) each committed transaction held.
    pub(crate) batch_units: Histogram,
}

impl Default for WriterCounters {
    fn default() -> Self {
        WriterCounters {
            transactions: AtomicU64::default(),
            deliveries: AtomicU64::default(),
            deliveries_together: AtomicU64::default(),
            outbox_claims: AtomicU64::default(),
            outbox_claimed_rows: AtomicU64::default(),
            outbox_result_batches: AtomicU64::default(),
            outbox_results: AtomicU64::default(),
            reopens: AtomicU64::default(),
            connections_opened: AtomicU64::default(),
            queued: std::sync::atomic::AtomicI64::default(),
            commit_faults: CommitFaults::default(),
            // 0.1 ms to about 3 s.
            commit_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
            // 1 to 4096.
            batch_units: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
        }
    }
}

/// The writer's histograms, shared with whoever reports them (`/metrics`): a clone reads the
/// same buckets.
#[derive(Debug, Clone)]
pub struct WriterHistograms {
    pub commit_seconds: Histogram,
    pub batch_units: Histogram,
}

impl WriterCounters {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A transaction of `units` units committed, its COMMIT taking `took`.
    pub(crate) fn committed(&self, units: usize, took: std::time::Duration) {
        Self::add(&self.transactions, 1);
        self.commit_seconds.observe(took.as_secs_f64());
        self.batch_units.observe(units as f64);
    }

    /// `n` units queued for the writer (negative: taken).
    pub(crate) fn queue(&self, n: i64) {
        self.queued.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn histograms(&self) -> WriterHistograms {
        WriterHistograms {
            commit_seconds: self.commit_seconds.clone(),
            batch_units: self.batch_units.clone(),
        }
    }

    pub(crate) fn read(&self) -> WriterStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WriterStats {
            transactions: get(&self.transactions),
            deliveries: get(&self.deliveries),
            deliveries_together: get(&self.deliveries_together),
            outbox_claims: get(&self.outbox_claims),
            outbox_claimed_rows: get(&self.outbox_claimed_rows),
            outbox_result_batches: get(&self.outbox_result_batches),
            outbox_results: get(&self.outbox_results),
            reopens: get(&self.reopens),
            queued: self.queued.load(Ordering::Relaxed).max(0) as u64,
            connections_opened: get(&self.connections_opened),
        }
    }
}

/// Work done inside the open transaction, waiting for COMMIT before it is answered.
pub(crate) enum Done {
    Delivery(Reply<Outcome>, Result<Outcome, StoreError>),
    Idempotent(
        Reply<IdempotentOutcome>,
        Result<IdempotentOutcome, StoreError>,
    ),
    OutboxClaim(Reply<Claimed>, Result<Claimed, StoreError>),
    OutboxResults(Reply<Vec<bool>>, Result<Vec<bool>, StoreError>),
}

impl Done {
    /// Sends the result. The caller may have gone (client disconnected); committed work stays
    /// committed, and a retry finds it (a duplicate, or the stored response).
    pub(crate) fn answer(self) {
        match self {
            Done::Delivery(reply, result) => drop(reply.send(result.map_err(WriteError::from))),
            Done::Idempotent(reply, result) => drop(reply.send(result.map_err(WriteError::from))),
            Done::OutboxClaim(reply, result) => drop(reply.send(result.map_err(WriteError::from))),
            Done::OutboxResults(reply, result) => {
                drop(reply.send(result.map_err(WriteError::from)))
            }
        }
    }

    /// Answers with `error` (a 503 to the caller): the transaction holding this work did not
    /// commit.
    pub(crate) fn fail(self, error: impl Fn() -> StoreError) {
        match self {
            Done::Delivery(reply, _) => Done::Delivery(reply, Err(error())).answer(),
            Done::Idempotent(reply, _) => Done::Idempotent(reply, Err(error())).answer(),
            Done::OutboxClaim(reply, _) => Done::OutboxClaim(reply, Err(error())).answer(),
            Done::OutboxResults(reply, _) => Done::OutboxResults(reply, Err(error())).answer(),
        }
    }

    /// Counts what this committed work did.
    pub(crate) fn count(&self, counters: &WriterCounters) {
        match self {
            Done::Delivery(_, Ok(_)) => WriterCounters::add(&counters.deliveries, 1),
            Done::OutboxClaim(_, Ok(rows)) => {
                WriterCounters::add(&counters.outbox_claims, 1);
                WriterCounters::add(&counters.outbox_claimed_rows, rows.len());
            }
            Done::OutboxResults(_, Ok(recorded)) => {
                WriterCounters::add(&counters.outbox_result_batches, 1);
                WriterCounters::add(&counters.outbox_results, recorded.len());
            }
            _ => {}
        }
    }
}
