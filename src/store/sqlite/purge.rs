//! Deleting expired event ids, in bounded batches.

use rusqlite::{params, Connection};

use crate::clock::iso_seconds;
use crate::store::model::Purged;
use crate::store::{CommitFaults, StoreError};

/// Deletes up to `limit` `processed_events` rows whose `expires_at` has passed. Parked rows are
/// kept: they are work waiting for their order, not a deduplication record. Orders and outbox
/// rows are never purged. Runs in the caller's transaction if one is open.
pub fn purge_expired_events(
    conn: &Connection,
    now_unix: i64,
    limit: usize,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "DELETE FROM processed_events WHERE rowid IN (
             SELECT rowid FROM processed_events
             WHERE expires_at <= ?1 AND outcome <> 'parked'
             LIMIT ?2)",
    )?
    .execute(params![iso_seconds(now_unix), limit as i64])
}

/// One batch (up to `limit` rows of each table) in its own `BEGIN IMMEDIATE` transaction.
pub fn purge_batch_in_transaction(
    conn: &Connection,
    now_unix: i64,
    limit: usize,
    faults: &CommitFaults,
) -> Result<Purged, StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = purge_expired_events(conn, now_unix, limit).and_then(|events| {
        let idempotency_keys = super::idempotency::purge_expired_keys(conn, now_unix, limit)?;
        Ok(Purged {
            events,
            idempotency_keys,
        })
    });
    match result {
        Ok(_) if faults.take() => {
            conn.execute_batch("ROLLBACK")?;
            Err(StoreError::Injected("the purge batch's COMMIT"))
        }
        Ok(purged) => {
            conn.execute_batch("COMMIT")?;
            Ok(purged)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e.into())
        }
    }
}

/// A whole purge pass on a connection of its own (the `sekali purge` command): batches in their
/// own transactions until one comes back short.
pub fn purge_all_expired(
    conn: &Connection,
    now_unix: i64,
    batch: usize,
) -> Result<Purged, StoreError> {
    let mut total = Purged::default();
    let no_faults = CommitFaults::default();
    loop {
        let purged = purge_batch_in_transaction(conn, now_unix, batch, &no_faults)?;
        total += purged;
        if !purged.was_full(batch) {
            return Ok(total);
        }
    }
}
