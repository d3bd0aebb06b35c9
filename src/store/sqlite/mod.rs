//! The embedded SQLite engine, the default: every SQL statement sekali runs on SQLite, its
//! schema and migrations, the single writer thread and the read pool.
//!
//! Write path: one dedicated thread ([`writer::Writer`]) owns the only write connection; HTTP
//! handlers and the relay hand it work through a bounded queue, and it commits whatever is
//! queued in one transaction. Read path: a pool of read-only connections ([`ReadPool`]). WAL
//! mode lets the two run side by side. [`SqliteStore`] puts the two behind
//! [`Store`](super::Store); [`SqliteMaintenance`] is one connection for a command.

pub mod backup;
pub mod console;
pub mod copy;
pub mod events;
pub mod forward;
pub mod idempotency;
pub mod ledger;
pub mod orders;
pub mod outbox;
pub mod purge;
pub mod reads;
pub mod rebuild;
pub mod runs;
pub mod schema;
pub mod statements;
pub mod writer;

mod engine;

use std::path::Path;
use std::time::Duration;

use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, OpenFlags};

use super::ErrorKind;
pub use super::StoreError;
pub use engine::{SqliteMaintenance, SqliteStore};
pub use writer::{Writer, WriterConfig};

impl From<rusqlite::Error> for StoreError {
    /// SQLite's result code decides the kind: a lock or a full disk passes; an I/O fault, a
    /// file that is no longer a database or no longer writable breaks the connection.
    fn from(error: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode::*;
        let kind = match &error {
            rusqlite::Error::SqliteFailure(e, _) => match e.code {
                SystemIoFailure | NotADatabase | CannotOpen | DatabaseCorrupt | ReadOnly => {
                    ErrorKind::ConnectionLost
                }
                DatabaseBusy | DatabaseLocked | DiskFull | OutOfMemory => ErrorKind::Transient,
                _ => ErrorKind::Permanent,
            },
            _ => ErrorKind::Permanent,
        };
        StoreError::database(kind, error)
    }
}

impl From<r2d2::Error> for StoreError {
    /// The read pool found no connection in time: the database is busy or gone for now.
    fn from(error: r2d2::Error) -> Self {
        StoreError::database(ErrorKind::Transient, error)
    }
}

/// How long a statement waits for another process's lock before failing with `SQLITE_BUSY`
/// (answered as 503, which both providers retry).
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub type ReadPool = r2d2::Pool<SqliteConnectionManager>;

fn apply_connection_pragmas(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<()> {
    conn.busy_timeout(busy_timeout)?;
    // FULL: the WAL is synced at every commit, so a 2xx (sent only after COMMIT) means durable.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

/// Opens (creating if needed) the database for writing: WAL, `synchronous=FULL`, busy timeout,
/// schema applied.
pub fn open_for_writing(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let created = !path.exists();
    let conn = Connection::open(path).map_err(|e| explain_open_failure(path, e))?;
    refuse_read_only(&conn, path)?;
    apply_connection_pragmas(&conn, busy_timeout)?;
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        // Refused, not warned of: in rollback-journal mode a commit is the journal's unlink,
        // which `synchronous=FULL` does not sync into its directory, so a power cut can bring
        // the journal back and roll an acknowledged commit back (the power-cut tests show it).
        return Err(StoreError::Unfit(format!(
            "database file {} could not be switched to WAL mode (it stays in `{mode}` mode), on which sekali's durability rests; WAL needs a local file system (not a network share) that supports shared memory",
            path.display()
        )));
    }
    // After a checkpoint the WAL file is truncated back to this size, so a burst does not leave
    // a large file behind for good.
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES)?;
    schema::migrate(&conn)?;
    if created {
        // SQLite syncs the directory when it creates the WAL, but not when it creates the
        // database file itself: until the directory is synced, a power cut can take the file's
        // name, and with it every commit a 2xx promised.
        crate::durable::sync_parent(path).map_err(|e| StoreError::CannotOpen {
            path: path.display().to_string(),
            reason: format!("syncing its directory: {e}"),
        })?;
    }
    Ok(conn)
}

/// Turns SQLite's "unable to open database file" into what the operator can act on: the file's
/// absolute path and what is wrong with its directory.
fn explain_open_failure(path: &Path, error: rusqlite::Error) -> StoreError {
    let is_cannot_open = matches!(
        &error,
        rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::CannotOpen
    );
    if !is_cannot_open {
        return error.into();
    }
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let dir = absolute.parent().unwrap_or(Path::new("/"));
    let reason = if !dir.is_dir() {
        format!("the directory {} does not exist", dir.display())
    } else if !can_create_files_in(dir) {
        format!(
            "the directory {} is not writable by this user (sekali creates the file and its -wal and -shm files there)",
            dir.display()
        )
    } else if absolute.is_dir() {
        "it is a directory".to_owned()
    } else {
        error.to_string()
    };
    StoreError::CannotOpen {
        path: absolute.display().to_string(),
        reason,
    }
}

/// Whether this process can create a file in `dir` (tried, then removed: permission bits alone
/// say nothing of ACLs, read-only mounts or root).
fn can_create_files_in(dir: &Path) -> bool {
    let probe = dir.join(format!(".sekali-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            true
        }
        Err(e) => e.kind() == std::io::ErrorKind::AlreadyExists,
    }
}

fn refuse_read_only(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    if conn.is_readonly(rusqlite::MAIN_DB)? {
        return Err(StoreError::Unfit(format!(
            "database file {} can only be opened read-only; sekali must be able to write it (and create its -wal and -shm files beside it)",
            path.display()
        )));
    }
    Ok(())
}

/// See `journal_size_limit` in [`open_for_writing`].
pub const WAL_SIZE_LIMIT_BYTES: i64 = 32 * 1024 * 1024;

/// Opens an existing database for a maintenance command; a missing file is an error rather
/// than a new empty database. The schema is brought up to date when `writable`.
pub fn open_existing(
    path: &Path,
    writable: bool,
    busy_timeout: Duration,
) -> Result<Connection, StoreError> {
    if !path.exists() {
        return Err(StoreError::Missing(path.display().to_string()));
    }
    let flags = if writable {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags)?;
    if writable {
        refuse_read_only(&conn, path)?;
        apply_connection_pragmas(&conn, busy_timeout)?;
        schema::migrate(&conn)?;
    } else {
        conn.busy_timeout(busy_timeout)?;
    }
    Ok(conn)
}

/// A pool of read-only connections for health checks and inspection. The file must already
/// exist (the writer creates it first).
pub fn read_pool(path: &Path, size: u32, busy_timeout: Duration) -> Result<ReadPool, StoreError> {
    let manager = SqliteConnectionManager::file(path)
        .with_flags(OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .with_init(move |conn| conn.busy_timeout(busy_timeout));
    Ok(r2d2::Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .connection_timeout(Duration::from_secs(5))
        .build(manager)?)
}

#[cfg(test)]
mod tests {
    /// Fails with the bundled SQLite built with `SQLITE_STMTJRNL_SPILL=262144`: the statement
    /// journal of an UPDATE that outgrew it could not spill to its temp file, and the whole
    /// transaction failed with SQLITE_FULL, the disk nowhere near full.
    #[test]
    fn a_statement_journal_that_spills_to_its_temp_file_commits() {
        let dir = std::env::temp_dir().join(format!("sekali-spill-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conn =
            super::open_for_writing(&dir.join("spill.db"), std::time::Duration::from_secs(1))
                .unwrap();
        conn.execute_batch(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);
             WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 4000)
             INSERT INTO t SELECT x, hex(randomblob(200)) FROM c;",
        )
        .unwrap();
        // About 1.8 MB of pages, journaled by one statement inside a transaction (and again
        // inside a savepoint, as the writer runs the relay's claims).
        conn.execute_batch(
            "BEGIN IMMEDIATE; UPDATE t SET v = hex(randomblob(200)); COMMIT;
             BEGIN IMMEDIATE; SAVEPOINT s; UPDATE t SET v = hex(randomblob(200)); RELEASE s;
             COMMIT;",
        )
        .unwrap();
        drop(conn);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// SQLite's result code decides what a store error means to its caller: a lock or a full
    /// disk passes by itself, an I/O fault also takes a new connection, a constraint never
    /// passes.
    #[test]
    fn sqlites_codes_map_to_the_kinds_of_store_error() {
        let error = |code| {
            super::StoreError::from(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(code),
                None,
            ))
        };
        let kind = |code| match error(code) {
            super::StoreError::Database(e) => e.kind,
            other => panic!("{other:?}"),
        };
        use super::ErrorKind::*;
        assert_eq!(kind(rusqlite::ffi::SQLITE_BUSY), Transient);
        assert_eq!(kind(rusqlite::ffi::SQLITE_FULL), Transient);
        assert_eq!(kind(rusqlite::ffi::SQLITE_IOERR_FSYNC), ConnectionLost);
        assert_eq!(kind(rusqlite::ffi::SQLITE_CORRUPT), ConnectionLost);
        assert_eq!(kind(rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE), Permanent);
        assert!(error(rusqlite::ffi::SQLITE_IOERR_FSYNC).is_transient());
        assert!(!error(rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE).is_transient());
    }

    /// An in-memory database has no WAL: it stands for any file SQLite cannot put in WAL mode.
    #[test]
    fn a_database_that_cannot_be_in_wal_mode_is_refused_for_writing() {
        let refused = super::open_for_writing(
            std::path::Path::new(":memory:"),
            std::time::Duration::from_secs(1),
        );
        assert!(
            matches!(&refused, Err(super::StoreError::Unfit(why)) if why.contains("`memory` mode")),
            "{refused:?}"
        );
    }

    /// The bundled SQLite was built with the options in `.cargo/config.toml` (a build that
    /// missed them would still be correct, only slower).
    #[test]
    fn bundled_sqlite_has_the_configured_options() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let options: Vec<String> = conn
            .prepare("PRAGMA compile_options")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            !options.iter().any(|o| o.starts_with("STMTJRNL_SPILL")),
            "{options:?}"
        );
        // No memory statistics and no memory management: each took a global mutex on the
        // writer's hot path.
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
    }
}
