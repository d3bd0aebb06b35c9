//! The writers' counters, the same for every engine.

use std::sync::atomic::{AtomicU64, Ordering};

use super::model::WriterStats;
use super::CommitFaults;

/// What an engine's writer has done since it started: for `/healthz`, and for tests that must
/// know that deliveries shared a transaction. One per store, whatever its engine.
#[derive(Debug, Default)]
pub struct WriterCounters {
    pub(crate) transactions: AtomicU64,
    pub(crate) deliveries: AtomicU64,
    pub(crate) outbox_claims: AtomicU64,
    pub(crate) outbox_claimed_rows: AtomicU64,
    pub(crate) outbox_result_batches: AtomicU64,
    pub(crate) outbox_results: AtomicU64,
    pub(crate) reopens: AtomicU64,
    pub(crate) connections_opened: AtomicU64,
    /// Not a count: the commits the tests told this writer to fail (see [`CommitFaults`]),
    /// beside the counters because every commit path reads both.
    pub(crate) commit_faults: CommitFaults,
}

impl WriterCounters {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> WriterStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WriterStats {
            transactions: get(&self.transactions),
            deliveries: get(&self.deliveries),
            outbox_claims: get(&self.outbox_claims),
            outbox_claimed_rows: get(&self.outbox_claimed_rows),
            outbox_result_batches: get(&self.outbox_result_batches),
            outbox_results: get(&self.outbox_results),
            reopens: get(&self.reopens),
            connections_opened: get(&self.connections_opened),
        }
    }
}
