//! `sekali bench --cleanup`: after the run and its check, every row the run wrote and its
//! `.eml` files are removed, so that a load test leaves a database and a mail directory as it
//! found them.
//!
//! The relay may still be sending the run's emails: the server's relay claims them as soon as
//! they are committed, and writes each one's file before it records it `sent`. So the rows go
//! in one transaction that first checks that none of them is leased to a relay
//! ([`Maintenance::delete_run`]); while some are, the cleanup waits for their results (or for
//! their leases to run out, if their relay died), at most [`CLEANUP_MAX_WAIT`]. Once the rows
//! are gone no relay can claim them, and the files are removed after: each only if it is the
//! run's own (named after one of the run's email keys, a regular file, and holding its order
//! id), then the directory is synced, so that the removals survive a power cut as the files'
//! creation did.
//!
//! What remains possible: a relay that overran its lease, still writing a claimed email when
//! the rows were deleted, writes its file after the cleanup looked. That file stays; its row is
//! gone, and the relay's result for it is refused.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::store::{RunDeletion, RunEmail, RunMarker, StoreError};

/// How long the cleanup waits for a relay to finish the run's emails it holds: longer than
/// the default lease (`--relay-lease`, 5 minutes), so that the emails of a relay that died
/// holding them become free within it.
pub const CLEANUP_MAX_WAIT: Duration = Duration::from_secs(6 * 60);

/// How often the cleanup looks again while a relay holds some of the run's emails.
const CLEANUP_POLL: Duration = Duration::from_millis(100);

/// Why the cleanup did not finish.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "{emails} of the run's emails were still held by a relay after {waited_s} s; nothing was \
         deleted (the run's rows are those whose order id starts with {marker})"
    )]
    StillHeld {
        emails: i64,
        waited_s: u64,
        marker: String,
    },
    #[error("the run's rows are deleted, but removing {path} failed: {source}")]
    Remove {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the run's rows and files are deleted, but syncing the mail directory {path} failed, so \
         a power cut may bring files back: {source}"
    )]
    Sync {
        path: String,
        source: std::io::Error,
    },
}

/// What the cleanup removed.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CleanedUp {
    pub events: usize,
    pub orders: usize,
    pub transitions: usize,
    pub payments: usize,
    pub emails: usize,
    /// `.eml` files removed (and temporary files of an email being written, on a file system
    /// without unnamed files).
    pub files: usize,
    /// Files named as one of the run's emails that were left, because they were not a regular
    /// file or did not hold its order id: not provably the run's own.
    pub files_kept: Vec<String>,
    /// How long it waited for a relay to finish the run's emails it held, in seconds (0: none
    /// held any).
    pub waited_s: f64,
}

/// Deletes the rows of `run` in `db` (waiting while a relay holds some of its emails), then its
/// files in `mail_dir`.
pub fn clean_up(db: &Path, run: &RunMarker, mail_dir: &Path) -> Result<CleanedUp, CleanupError> {
    use crate::clock::{Clock, SystemClock};
    let store = crate::store::maintenance(&crate::store::Location::from(db.to_path_buf()), true)?;
    let started = Instant::now();
    // Whether a relay held some of the run's emails: what the cleanup then waited for.
    let mut relay_held = false;
    let deleted = loop {
        match store.delete_run(run, SystemClock.now_millis())? {
            RunDeletion::Deleted(deleted) => break deleted,
            RunDeletion::Leased { emails } if started.elapsed() >= CLEANUP_MAX_WAIT => {
                return Err(CleanupError::StillHeld {
                    emails,
                    waited_s: CLEANUP_MAX_WAIT.as_secs(),
                    marker: run.as_str().to_owned(),
                });
            }
            RunDeletion::Leased { emails } => {
                if !relay_held {
                    eprintln!(
                        "cleanup: a relay is sending {emails} of the run's emails; waiting for \
                         it to finish before deleting the run's rows and files"
                    );
                    relay_held = true;
                }
                std::thread::sleep(CLEANUP_POLL);
            }
        }
    };
    let waited_s = if relay_held {
        started.elapsed().as_secs_f64()
    } else {
        0.0
    };
    let (files, files_kept) = remove_files(mail_dir, &deleted.emails)?;
    Ok(CleanedUp {
        events: deleted.events,
        orders: deleted.orders,
        transitions: deleted.transitions,
        payments: deleted.payments,
        emails: deleted.emails.len(),
        files,
        files_kept,
        waited_s,
    })
}

/// Removes each email's file (`<key>.eml`, and `.<key>.eml.tmp` of one being written) from
/// `dir` when it is the run's own, then syncs `dir`. The files removed, and those kept.
fn remove_files(dir: &Path, emails: &[RunEmail]) -> Result<(usize, Vec<String>), CleanupError> {
    let mut removed = 0;
    let mut kept = Vec::new();
    if !dir.is_dir() {
        return Ok((removed, kept));
    }
    for email in emails {
        // A key is hex (a SHA-256): anything else, read from the database, names no file of
        // ours, and could name one outside the directory.
        let key = email.idempotency_key.as_str();
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        for name in [format!("{key}.eml"), format!(".{key}.eml.tmp")] {
            let path = dir.join(&name);
            match is_the_runs_own(&path, &email.order_id) {
                Ok(None) => {}
                Ok(Some(true)) => match std::fs::remove_file(&path) {
                    Ok(()) => removed += 1,
                    // Gone meanwhile: a temporary file its writer renamed, say.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(removal_error(&path, e)),
                },
                Ok(Some(false)) => kept.push(path.display().to_string()),
                Err(e) => return Err(removal_error(&path, e)),
            }
        }
    }
    if removed > 0 {
        crate::durable::sync_dir(dir).map_err(|source| CleanupError::Sync {
            path: dir.display().to_string(),
            source,
        })?;
    }
    Ok((removed, kept))
}

/// `None` when there is no such file; else whether it is a regular file holding `order_id` (an
/// email names its order in its subject and text).
fn is_the_runs_own(path: &Path, order_id: &str) -> std::io::Result<Option<bool>> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !metadata.file_type().is_file() {
        return Ok(Some(false));
    }
    let bytes = std::fs::read(path)?;
    Ok(Some(
        bytes
            .windows(order_id.len().max(1))
            .any(|w| w == order_id.as_bytes()),
    ))
}

fn removal_error(path: &Path, source: std::io::Error) -> CleanupError {
    CleanupError::Remove {
        path: path.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::remove_files;
    use crate::store::RunEmail;

    fn email(key: &str, order_id: &str) -> RunEmail {
        RunEmail {
            idempotency_key: key.into(),
            order_id: order_id.into(),
        }
    }

    /// Only a regular file named after one of the run's keys and naming its order goes: a file
    /// of that name that does not, a link, a key that is not hex, and every other file stay.
    #[test]
    fn only_the_runs_own_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("aa01.eml", "Subject: Payment received for order bench_5_1");
        write(
            ".aa01.eml.tmp",
            "Subject: Payment received for order bench_5_1",
        );
        write("bb02.eml", "Subject: Payment received for order ord_1001");
        write("cc03.eml", "Subject: Payment received for order ord_1002");
        write("real.eml", "Subject: Payment received for order bench_5_9");
        std::os::unix::fs::symlink(dir.path().join("real.eml"), dir.path().join("dd04.eml"))
            .unwrap();
        let emails = [
            email("aa01", "bench_5_1"),
            // Its name, not its content: kept.
            email("bb02", "bench_5_2"),
            email("dd04", "bench_5_9"),
            email("../real", "bench_5_9"),
            // No file: nothing to do.
            email("ee05", "bench_5_5"),
        ];
        let (removed, kept) = remove_files(dir.path(), &emails).unwrap();
        assert_eq!(removed, 2);
        let kept: Vec<String> = kept
            .iter()
            .map(|p| p.rsplit('/').next().unwrap().to_owned())
            .collect();
        assert_eq!(kept, ["bb02.eml", "dd04.eml"]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["bb02.eml", "cc03.eml", "dd04.eml", "real.eml"]);
    }

    #[test]
    fn a_mail_directory_that_does_not_exist_has_nothing_to_remove() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("mail");
        assert_eq!(
            remove_files(&missing, &[email("aa01", "bench_5_1")]).unwrap(),
            (0, Vec::new())
        );
        assert!(!missing.exists());
    }
}
