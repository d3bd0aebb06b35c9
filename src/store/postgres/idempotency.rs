//! `Idempotency-Key` for sekali's own API: look up, compare, do the work, store the response,
//! all inside the caller's transaction (the writer's savepoint).
//!
//! Because the claim, the work and the stored response commit together, a row is always
//! complete: no `processing` state is ever visible, and no lease is needed (a crash rolls all
//! of it back, and the same key is then simply new).
//!
//! With several instances on one database, the key is held first (a transaction-scoped advisory
//! lock, taken without waiting): a request under the same key on another instance while the
//! first's transaction runs finds it held and is answered 409 with Retry-After, as one instance
//! answers a second request in flight ([`IdempotentOutcome::InFlight`]); once the first commits,
//! a retry replays what it committed (or, if it rolled back, runs itself). Then the key's row is
//! claimed (inserted, before the work); it holds a placeholder response that only its own
//! transaction can see, and the real one replaces it before the commit.

use super::orders::insert_api_order;
use super::{get, Db, StoreError};
use crate::clock::iso_seconds;
use crate::store::model::{IdempotentOutcome, StoredResponse};
use crate::store::{CreateOrder, ErrorKind};

/// Runs `request` under its key inside the caller's transaction: a new key creates the order
/// and stores the response `request.respond` renders for it.
pub fn run_idempotent(
    db: &mut Db<'_, '_>,
    request: CreateOrder,
    now_unix: i64,
) -> Result<IdempotentOutcome, StoreError> {
    let now = iso_seconds(now_unix);
    let expires_at = iso_seconds(now_unix + request.retention_secs);
    // In flight elsewhere: another transaction holds the key (it may not have inserted the row
    // yet, or its insert is not visible): 409 now rather than wait for its end. Within one
    // instance the route's in-flight set answers first, so this is another instance.
    let key = format!("idempotency\u{1f}{}\u{1f}{}", request.client, request.key);
    let free: bool = get(
        &db.query_one(
            "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))",
            &[&key],
        )?,
        0,
    )?;
    if !free {
        return Ok(IdempotentOutcome::InFlight);
    }
    // The claim. A new key inserts its row; an expired row for this key counts as absent and is
    // taken over (as SQLite's upsert replaced it). A live row is left as it is, and nothing
    // comes back. Every claim of the key holds it first, so none waits here for another's; and
    // were one to, it would wait on the primary key for the first's end and then find the
    // committed row (live: nothing comes back) or, after a rollback, insert its own. So two
    // requests under one key never both do the work. The row is locked either way (ON CONFLICT
    // DO UPDATE locks the existing row even when its WHERE refuses the update), so the purge
    // (FOR UPDATE SKIP LOCKED) cannot delete it under the read below.
    let claimed = db.query_opt(
        "INSERT INTO idempotency_keys (client, key, fingerprint, status, response_status, response_body,
                                       response_content_type, created_at, expires_at)
         VALUES ($1, $2, $3, 'completed', 0, '', '', $4, $5)
         ON CONFLICT (client, key) DO UPDATE SET
             fingerprint = excluded.fingerprint, status = excluded.status,
             response_status = excluded.response_status, response_body = excluded.response_body,
             response_content_type = excluded.response_content_type,
             created_at = excluded.created_at, expires_at = excluded.expires_at
         WHERE idempotency_keys.expires_at <= excluded.created_at
         RETURNING 1",
        &[
            &request.client,
            &request.key,
            &request.fingerprint,
            &now,
            &expires_at,
        ],
    )?;
    if claimed.is_none() {
        // A live row for this key, committed by an earlier request: replay it, or refuse a
        // different request under the same key. (READ COMMITTED: this statement sees what the
        // conflicting transaction committed.)
        let existing = db.query_opt(
            "SELECT fingerprint, response_status, response_content_type, response_body
             FROM idempotency_keys WHERE client = $1 AND key = $2 AND expires_at > $3",
            &[&request.client, &request.key, &now],
        )?;
        let row = existing.ok_or_else(|| {
            // The claim found a live row that this read does not: only under an isolation
            // level whose snapshot predates that row's commit. Transient: the batch reruns.
            StoreError::database(
                ErrorKind::Transient,
                std::io::Error::other(
                    "the idempotency key's row was committed after this transaction's snapshot",
                ),
            )
        })?;
        let fingerprint: String = get(&row, 0)?;
        let status: i64 = get(&row, 1)?;
        let stored = StoredResponse {
            status: u16::try_from(status).map_err(|_| {
                StoreError::database(
                    ErrorKind::Permanent,
                    std::io::Error::other(format!(
                        "idempotency_keys.response_status holds {status}, not an HTTP status"
                    )),
                )
            })?,
            content_type: get(&row, 2)?,
            body: get(&row, 3)?,
        };
        return Ok(if fingerprint == request.fingerprint {
            IdempotentOutcome::Replayed(stored)
        } else {
            IdempotentOutcome::FingerprintMismatch
        });
    }
    let created = insert_api_order(db, &request.order, &request.client, now_unix)?;
    let response = (request.respond)(created.as_ref());
    // The claimed row gets its response, in the same transaction: no other one ever sees the
    // placeholder.
    db.execute(
        "UPDATE idempotency_keys SET response_status = $3, response_body = $4,
                response_content_type = $5
         WHERE client = $1 AND key = $2",
        &[
            &request.client,
            &request.key,
            &i64::from(response.status),
            &response.body,
            &response.content_type,
        ],
    )?;
    Ok(IdempotentOutcome::Fresh(response))
}

/// Deletes up to `limit` expired keys; runs in the caller's transaction.
pub fn purge_expired_keys(
    db: &mut Db<'_, '_>,
    now_unix: i64,
    limit: usize,
) -> Result<usize, StoreError> {
    // By key (the table has no rowid here). SKIP LOCKED: a key's row that a request is taking
    // over right now (an expired key used again, locked by its upsert) is left to it, rather
    // than deleted under it or waited for; the next batch finds it if it is still expired.
    let deleted = db.execute(
        "DELETE FROM idempotency_keys WHERE (client, key) IN (
             SELECT client, key FROM idempotency_keys WHERE expires_at <= $1
             LIMIT $2::bigint FOR UPDATE SKIP LOCKED)",
        &[&iso_seconds(now_unix), &(limit as i64)],
    )?;
    Ok(deleted as usize)
}
