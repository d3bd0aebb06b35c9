//! The console's logouts (`console_logouts`).

use super::{Db, StoreError};
use crate::clock::iso_seconds;

/// Records that `session` (a hash) was logged out of; forgets logouts of sessions that have
/// ended anyway by `now_unix`. In the caller's transaction.
pub fn end_session(
    db: &mut Db<'_, '_>,
    session: &str,
    expires_unix: i64,
    now_unix: i64,
) -> Result<(), StoreError> {
    db.execute(
        "DELETE FROM console_logouts WHERE expires_at <= $1",
        &[&iso_seconds(now_unix)],
    )?;
    db.execute(
        "INSERT INTO console_logouts (session, expires_at) VALUES ($1, $2)
         ON CONFLICT (session) DO NOTHING",
        &[&session, &iso_seconds(expires_unix)],
    )?;
    Ok(())
}

/// Whether `session` was logged out of.
pub fn session_ended(db: &mut Db<'_, '_>, session: &str) -> Result<bool, StoreError> {
    Ok(db
        .query_opt(
            "SELECT 1 FROM console_logouts WHERE session = $1",
            &[&session],
        )?
        .is_some())
}
