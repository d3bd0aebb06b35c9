//! `Idempotency-Key` for sekali's own API: look up, compare, do the work, store the response,
//! all inside the caller's transaction (the writer's savepoint).
//!
//! Because the claim, the work and the stored response commit together, a row is always
//! complete: no `processing` state is ever visible, and no lease is needed (a crash rolls all
//! of it back, and the same key is then simply new).

use rusqlite::{params, Connection, OptionalExtension};

use super::orders::insert_api_order;
use super::StoreError;
use crate::clock::iso_seconds;
use crate::store::model::{IdempotentOutcome, StoredResponse};
use crate::store::CreateOrder;

/// Runs `request` under its key inside the caller's transaction: a new key creates the order
/// and stores the response `request.respond` renders for it.
pub fn run_idempotent(
    conn: &Connection,
    request: CreateOrder,
    now_unix: i64,
) -> Result<IdempotentOutcome, StoreError> {
    let now = iso_seconds(now_unix);
    let existing = conn
        .prepare_cached(
            "SELECT fingerprint, response_status, response_content_type, response_body
             FROM idempotency_keys WHERE client = ?1 AND key = ?2 AND expires_at > ?3",
        )?
        .query_row(params![request.client, request.key, now], |row| {
            Ok((
                row.get::<_, String>(0)?,
                StoredResponse {
                    status: row.get(1)?,
                    content_type: row.get(2)?,
                    body: row.get(3)?,
                },
            ))
        })
        .optional()?;
    if let Some((fingerprint, stored)) = existing {
        return Ok(if fingerprint == request.fingerprint {
            IdempotentOutcome::Replayed(stored)
        } else {
            IdempotentOutcome::FingerprintMismatch
        });
    }
    let created = insert_api_order(conn, &request.order, &request.client, now_unix)?;
    let response = (request.respond)(created.as_ref());
    // An expired row for this key counts as absent: it is replaced.
    conn.prepare_cached(
        "INSERT INTO idempotency_keys (client, key, fingerprint, status, response_status, response_body,
                                       response_content_type, created_at, expires_at)
         VALUES (?1, ?2, ?3, 'completed', ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (client, key) DO UPDATE SET
             fingerprint = excluded.fingerprint, status = excluded.status,
             response_status = excluded.response_status, response_body = excluded.response_body,
             response_content_type = excluded.response_content_type,
             created_at = excluded.created_at, expires_at = excluded.expires_at",
    )?
    .execute(params![
        request.client,
        request.key,
        request.fingerprint,
        response.status,
        response.body,
        response.content_type,
        now,
        iso_seconds(now_unix + request.retention_secs),
    ])?;
    Ok(IdempotentOutcome::Fresh(response))
}

/// Deletes up to `limit` expired keys; runs in the caller's transaction.
pub fn purge_expired_keys(
    conn: &Connection,
    now_unix: i64,
    limit: usize,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "DELETE FROM idempotency_keys WHERE rowid IN (
             SELECT rowid FROM idempotency_keys WHERE expires_at <= ?1 LIMIT ?2)",
    )?
    .execute(params![iso_seconds(now_unix), limit as i64])
}
