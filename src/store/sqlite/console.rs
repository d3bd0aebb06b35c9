//! The console's logouts (`console_logouts`).

use rusqlite::{params, Connection, OptionalExtension};

use super::outbox::in_write_transaction;
use super::StoreError;
use crate::clock::iso_seconds;

/// Records that `session` (a hash) was logged out of; forgets logouts of sessions that have
/// ended anyway by `now_unix`. One write transaction.
pub fn end_session(
    conn: &Connection,
    session: &str,
    expires_unix: i64,
    now_unix: i64,
) -> Result<(), StoreError> {
    in_write_transaction(conn, || {
        conn.execute(
            "DELETE FROM console_logouts WHERE expires_at <= ?1",
            [iso_seconds(now_unix)],
        )?;
        conn.execute(
            "INSERT INTO console_logouts (session, expires_at) VALUES (?1, ?2)
             ON CONFLICT (session) DO NOTHING",
            params![session, iso_seconds(expires_unix)],
        )?;
        Ok(())
    })
}

/// Whether `session` was logged out of.
pub fn session_ended(conn: &Connection, session: &str) -> rusqlite::Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM console_logouts WHERE session = ?1")?
        .query_row([session], |_| Ok(()))
        .optional()?
        .is_some())
}
