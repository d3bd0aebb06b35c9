//! The writer's connection goes through `store::wal_vfs`, which hands each commit's WAL frames
//! to the OS in one write. What it must never change: what other connections read, and that a
//! commit is in the file once COMMIT returns.
//!
//! The tests take a lock to run one at a time: the write-count check reads `/proc/self/io`,
//! which counts the write calls of the whole test process.

use std::sync::Mutex;
use std::time::Duration;

use rusqlite::Connection;
use sekali::store::{open_for_writing, wal_vfs};

const FRAME: u64 = 4096 + 24;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Write system calls this process has made so far.
fn write_calls() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("syscw:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn wal_size(db: &std::path::Path) -> u64 {
    std::fs::metadata(db.with_extension("db-wal")).map_or(0, |m| m.len())
}

/// One transaction of `rows` rows of about 2 KB each into a scratch table.
fn commit_rows(conn: &Connection, first: i64, rows: i64) {
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    for id in first..first + rows {
        conn.execute(
            "INSERT INTO scratch (id, body) VALUES (?1, ?2)",
            (id, format!("{id:08}").repeat(250)),
        )
        .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
}

#[test]
fn the_wal_coalescing_vfs_writes_each_commit_at_once_and_others_read_it_whole() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("sekali.db");
    let writer = open_for_writing(&db, Duration::from_secs(5)).unwrap();
    writer
        .execute_batch("CREATE TABLE scratch (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        .unwrap();
    // A plain connection, through SQLite's default VFS, reading alongside.
    let reader = Connection::open(&db).unwrap();

    // One commit of about 50 frames.
    let (wal_before, calls_before) = (wal_size(&db), write_calls());
    commit_rows(&writer, 0, 100);
    let (wal_after, calls_after) = (wal_size(&db), write_calls());
    let frames = (wal_after - wal_before) / FRAME;
    let calls = calls_after - calls_before;
    assert!(frames >= 40, "the commit wrote {frames} frames");
    // SQLite alone makes two calls per frame; merged, the commit is a handful.
    assert!(
        calls <= 4,
        "{calls} write calls for one commit of {frames} frames"
    );

    // What the commit wrote is there for a connection that does not use the VFS.
    let (count, total): (i64, i64) = reader
        .query_row("SELECT count(*), sum(length(body)) FROM scratch", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((count, total), (100, 100 * 2000));

    // Many commits, checkpoints that copy the WAL back and restart it, a rollback in between.
    for round in 0..40 {
        commit_rows(&writer, 1000 + round * 10, 10);
    }
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    writer
        .execute("DELETE FROM scratch WHERE id < 50", [])
        .unwrap();
    writer.execute_batch("ROLLBACK").unwrap();
    writer
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    commit_rows(&writer, 5000, 30);
    assert_eq!(
        reader
            .query_row("SELECT count(*) FROM scratch", [], |r| r.get::<_, i64>(0))
            .unwrap(),
        100 + 400 + 30
    );
    let body: String = reader
        .query_row("SELECT body FROM scratch WHERE id = 5029", [], |r| r.get(0))
        .unwrap();
    assert_eq!(body, "00005029".repeat(250));

    // Closed without a checkpoint, as after a crash: reopened plainly, the file is whole.
    drop(writer);
    drop(reader);
    let plain = Connection::open(&db).unwrap();
    let check: String = plain
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    assert_eq!(
        plain
            .query_row("SELECT count(*) FROM scratch", [], |r| r.get::<_, i64>(0))
            .unwrap(),
        530
    );

    // The VFS is refused for a connection whose commits would not sync the WAL.
    let unsynced = wal_vfs::open(&db).unwrap();
    unsynced
        .pragma_update(None, "synchronous", "NORMAL")
        .unwrap();
    let refused = wal_vfs::check_full_sync(&unsynced).unwrap_err();
    assert!(
        refused.to_string().contains("synchronous=FULL"),
        "{refused}"
    );
}

/// A transaction too big for the page cache makes SQLite write frames to the WAL before its
/// COMMIT. If it is then rolled back, those frames must never reach the file later: another
/// connection (the outbox relay, a `sqlite3` shell) may meanwhile commit its own frames at the
/// same offsets.
#[test]
fn frames_of_a_rolled_back_transaction_never_overwrite_another_connections_commit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (rows_deleted, cache_pages) in [(2200, None), (3800, None), (4200, None), (300, Some(20))] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("sekali.db");
        let writer = open_for_writing(&db, Duration::from_secs(5)).unwrap();
        writer
            .execute_batch("CREATE TABLE scratch (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
            .unwrap();
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        for id in 0..5000 {
            writer
                .execute(
                    "INSERT INTO scratch (id, body) VALUES (?1, randomblob(1000))",
                    [id],
                )
                .unwrap();
        }
        writer.execute_batch("COMMIT").unwrap();
        writer
            .query_row("PRAGMA wal_checkpoint", [], |_| Ok(()))
            .unwrap();
        if let Some(pages) = cache_pages {
            writer.pragma_update(None, "cache_size", pages).unwrap();
        }

        // Like a purge batch that fails: big enough to spill, then rolled back.
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        writer
            .execute("DELETE FROM scratch WHERE id < ?1", [rows_deleted])
            .unwrap();
        writer.execute_batch("ROLLBACK").unwrap();

        other_connection_commits_50_rows(&db);

        // The write connection carries on, then closes.
        let seen: i64 = writer
            .query_row("SELECT count(*) FROM scratch", [], |r| r.get(0))
            .unwrap();
        assert_eq!(seen, 5050);
        commit_rows_blob(&writer, 2_000_000, 10);
        drop(writer);

        assert_whole(&db, 5060);
    }
}

fn commit_rows_blob(conn: &Connection, first: i64, rows: i64) {
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    for id in first..first + rows {
        conn.execute(
            "INSERT INTO scratch (id, body) VALUES (?1, randomblob(1000))",
            [id],
        )
        .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
}

/// The same, when the rolled-back transaction ran under `locking_mode=EXCLUSIVE` (which takes
/// no shared-memory locks) and the connection then returns to normal locking.
#[test]
fn frames_rolled_back_in_exclusive_mode_never_overwrite_a_later_commit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("sekali.db");
    let writer = open_for_writing(&db, Duration::from_secs(5)).unwrap();
    writer
        .execute_batch("CREATE TABLE scratch (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        .unwrap();
    commit_rows_blob(&writer, 0, 5000);
    writer
        .query_row("PRAGMA wal_checkpoint", [], |_| Ok(()))
        .unwrap();
    writer.pragma_update(None, "cache_size", 20).unwrap();
    writer
        .execute_batch("PRAGMA locking_mode=EXCLUSIVE")
        .unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    writer
        .execute("DELETE FROM scratch WHERE id < 300", [])
        .unwrap();
    writer.execute_batch("ROLLBACK").unwrap();
    writer.execute_batch("PRAGMA locking_mode=NORMAL").unwrap();
    // An empty write transaction: its end takes the WAL out of exclusive mode.
    writer.execute_batch("BEGIN IMMEDIATE; ROLLBACK").unwrap();

    other_connection_commits_50_rows(&db);
    let seen: i64 = writer
        .query_row("SELECT count(*) FROM scratch", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen, 5050);
    drop(writer);

    assert_whole(&db, 5050);
}

/// Another connection, through SQLite's default VFS (as the outbox relay or a `sqlite3` shell
/// would be), commits 50 rows with ids from 1,000,000.
fn other_connection_commits_50_rows(db: &std::path::Path) {
    let other = Connection::open(db).unwrap();
    other.busy_timeout(Duration::from_secs(5)).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    for id in 0..50 {
        other
            .execute(
                "INSERT INTO scratch (id, body) VALUES (?1, zeroblob(3000))",
                [1_000_000 + id],
            )
            .unwrap();
    }
    other.execute_batch("COMMIT").unwrap();
}

/// A fresh plain connection finds the file whole, `total` rows, and the other connection's 50
/// rows intact.
fn assert_whole(db: &std::path::Path, total: i64) {
    let fresh = Connection::open(db).unwrap();
    let check: String = fresh
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap_or_else(|e| e.to_string());
    assert_eq!(check, "ok");
    let theirs: i64 = fresh
        .query_row(
            "SELECT count(*) FROM scratch WHERE id >= 1000000 AND id < 2000000
                 AND body = zeroblob(3000)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(theirs, 50, "the other connection's rows are intact");
    let rows: i64 = fresh
        .query_row("SELECT count(*) FROM scratch", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, total);
}
