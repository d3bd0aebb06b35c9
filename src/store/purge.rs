//! Deleting expired event ids, in bounded batches.

use rusqlite::{params, Connection};

use crate::clock::iso_seconds;

/// Rows deleted per transaction: small enough that deliveries queued behind a batch wait only
/// milliseconds.
pub const DEFAULT_PURGE_BATCH: usize = 5000;

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

/// One batch in its own `BEGIN IMMEDIATE` transaction; returns how many rows it deleted.
pub fn purge_batch_in_transaction(
    conn: &Connection,
    now_unix: i64,
    limit: usize,
) -> rusqlite::Result<usize> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    match purge_expired_events(conn, now_unix, limit) {
        Ok(deleted) => {
            conn.execute_batch("COMMIT")?;
            Ok(deleted)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// A whole purge pass on a connection of its own (the `sekali purge` command): batches of
/// `batch` rows, each in its own transaction, until one comes back short.
pub fn purge_all_expired(
    conn: &Connection,
    now_unix: i64,
    batch: usize,
) -> rusqlite::Result<usize> {
    let mut total = 0;
    loop {
        let deleted = purge_batch_in_transaction(conn, now_unix, batch)?;
        total += deleted;
        if deleted < batch {
            return Ok(total);
        }
    }
}
