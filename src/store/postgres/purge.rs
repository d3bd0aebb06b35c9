//! Deleting expired event ids, in bounded batches.

use super::{Db, StoreError};
use crate::clock::iso_seconds;
use crate::store::model::Purged;

/// Deletes up to `limit` `processed_events` rows whose `expires_at` has passed. Parked rows are
/// kept: they are work waiting for their order, not a deduplication record. Orders and outbox
/// rows are never purged. Runs in the caller's transaction.
pub fn purge_expired_events(
    db: &mut Db<'_, '_>,
    now_unix: i64,
    limit: usize,
) -> Result<usize, StoreError> {
    // By primary key (SQLite's went by rowid). SKIP LOCKED: a row a writer holds right now (a
    // redelivery claiming an expired id again, an event being parked or linked) is left to it
    // rather than deleted under it; the writer's batch is neither blocked by the purge nor
    // deadlocked with it, and the next batch finds the row if it is still expired.
    let deleted = db.execute(
        "DELETE FROM processed_events WHERE (provider, event_id) IN (
             SELECT provider, event_id FROM processed_events
             WHERE expires_at <= $1 AND outcome <> 'parked'
             LIMIT $2::bigint FOR UPDATE SKIP LOCKED)",
        &[&iso_seconds(now_unix), &(limit as i64)],
    )?;
    Ok(deleted as usize)
}

/// One batch (up to `limit` rows of each table) in the caller's transaction: the caller (the
/// writer, or the `sekali purge` command, which loops until a batch comes back short, see
/// [`Purged::was_full`]) opens and commits it, and checks its commit faults.
pub fn purge_batch(db: &mut Db<'_, '_>, now_unix: i64, limit: usize) -> Result<Purged, StoreError> {
    let events = purge_expired_events(db, now_unix, limit)?;
    let idempotency_keys = super::idempotency::purge_expired_keys(db, now_unix, limit)?;
    Ok(Purged {
        events,
        idempotency_keys,
    })
}
