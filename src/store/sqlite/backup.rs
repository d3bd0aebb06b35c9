//! Online backup with SQLite's backup API: consistent while deliveries continue.

use std::path::Path;
use std::time::Duration;

use rusqlite::backup::{Backup, StepResult};
use rusqlite::Connection;

use super::{open_existing, StoreError};
use crate::store::model::BackupReport;

/// Copies the database at `source` to `out` and checks the copy.
///
/// The copy is taken in one backup step, i.e. inside one read transaction: in WAL mode that does
/// not block the writer, and unlike a page-by-page copy it cannot be restarted forever by a
/// writer that never pauses. It is written to `OUT.partial` and renamed into place only after
/// `PRAGMA integrity_check` passes, so `out` is either a whole, checked copy or absent.
pub fn backup_database(
    source: &Path,
    out: &Path,
    busy_timeout: Duration,
) -> Result<BackupReport, StoreError> {
    crate::store::copy::check_backup_path(out)?;
    let out_error = |reason: String| StoreError::BackupOut {
        path: out.display().to_string(),
        reason,
    };
    let src = open_existing(source, false, busy_timeout)?;
    let partial = out.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    let copied = copy_and_check(&src, &partial, out).map_err(|e| match e {
        e @ StoreError::Database(_) => out_error(format!("writing {}: {e}", partial.display())),
        other => other,
    });
    if copied.is_err() {
        // Nothing half-written is left beside the backup the user asked for.
        let _ = std::fs::remove_file(&partial);
    }
    copied
}

/// Copies `src` into a new database at `partial`, checks it, and renames it to `out`.
fn copy_and_check(
    src: &Connection,
    partial: &Path,
    out: &Path,
) -> Result<BackupReport, StoreError> {
    let mut dst = Connection::open(partial)?;
    {
        let backup = Backup::new(src, &mut dst)?;
        loop {
            match backup.step(-1)? {
                StepResult::Done => break,
                StepResult::More => continue,
                // Another connection holds a lock the copy needs; wait as the busy timeout would.
                StepResult::Busy | StepResult::Locked => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    let check: String = dst.query_row("PRAGMA integrity_check", [], |row| row.get(0))?;
    if check != "ok" {
        return Err(StoreError::Integrity(check));
    }
    let report = BackupReport {
        pages: dst.query_row("PRAGMA page_count", [], |row| row.get(0))?,
        processed_events: dst.query_row("SELECT count(*) FROM processed_events", [], |row| {
            row.get(0)
        })?,
        orders: dst.query_row("SELECT count(*) FROM orders", [], |row| row.get(0))?,
    };
    drop(dst);
    // On the disk before it is reported: the copy's data (SQLite synced its commits; this says
    // so whatever the journal mode), then its name in the directory.
    let out_error = |what: &str, e: std::io::Error| StoreError::BackupOut {
        path: out.display().to_string(),
        reason: format!("{what}: {e}"),
    };
    std::fs::File::open(partial)
        .and_then(|f| f.sync_all())
        .map_err(|e| out_error("syncing the copy", e))?;
    std::fs::rename(partial, out)
        .map_err(|e| out_error("renaming the checked copy into place", e))?;
    crate::durable::sync_parent(out).map_err(|e| out_error("syncing its directory", e))?;
    Ok(report)
}
