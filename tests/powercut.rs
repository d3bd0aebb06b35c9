//! Power-cut tests on a lossy FUSE filesystem (`powercut/lossyfs.rs`): what survives a cut is
//! what was synced, data with `fsync` of the file and names with `fsync` of the directory.
//!
//! The first two tests check the filesystem itself, through the mounted path. The SQLite tests
//! check that the harness tells a durable commit from a lucky one: in WAL mode with
//! `synchronous=FULL` every acknowledged commit survives (also through sekali's own writer
//! connection, and in a writer process killed mid-stream), with `NORMAL` some do not; in
//! rollback-journal mode only `EXTRA` keeps them. The last test checks that a panicking test
//! leaves no mount behind.
//!
//! Needs `/dev/fuse` and root or `fusermount3`. A cut models a machine losing power, which also
//! kills every process using the files: in-process, the tests close their files and connections
//! before cutting; `a_killed_writer_loses_no_acknowledged_commit` kills a real writer process.

#[path = "powercut/lossyfs.rs"]
mod lossyfs;

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lossyfs::{is_mounted, CutReport, LossyMount};
use rusqlite::config::DbConfig;
use rusqlite::Connection;

/// `fsync(2)` on a directory: makes its current entries durable.
fn sync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

/// Creates (or truncates) `path`, writes `bytes` and fsyncs the file, not its directory.
fn write_synced(path: &Path, bytes: &[u8]) {
    let mut file = File::create(path).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn unsynced_writes_and_truncates_are_undone_at_a_cut_and_synced_bytes_survive() {
    let mount = LossyMount::new().unwrap();
    let (log, kept) = (mount.path().join("log"), mount.path().join("kept"));
    let mut log_file = File::create(&log).unwrap();
    let mut kept_file = File::create(&kept).unwrap();
    sync_dir(mount.path());

    log_file.write_all(b"synced").unwrap();
    log_file.sync_all().unwrap();
    log_file.write_all(b" then lost").unwrap(); // read back and closed, never synced
    kept_file.write_all(b"0123456789").unwrap();
    kept_file.sync_data().unwrap(); // fdatasync counts as a sync of the data
    kept_file.set_len(4).unwrap(); // a truncate, never synced
    drop((log_file, kept_file));
    assert_eq!(fs::read(&log).unwrap(), b"synced then lost");
    assert_eq!(fs::metadata(&kept).unwrap().len(), 4);

    let report = mount.cut();
    assert_eq!(fs::read(&log).unwrap(), b"synced");
    assert_eq!(fs::read(&kept).unwrap(), b"0123456789");
    assert_eq!(
        fs::metadata(&kept).unwrap().len(),
        10,
        "no size from before the cut"
    );
    let expected = CutReport {
        files_reverted: 2,
        bytes_dropped: 10 + 6,
        ..CutReport::default()
    };
    assert_eq!(report, expected);
    assert_eq!(
        mount.cut(),
        CutReport::default(),
        "a second cut has nothing to drop"
    );
    // One request per system call: the kernel caches no writes (no writeback cache).
    let counters = mount.counters();
    let calls = (counters.writes, counters.fsyncs, counters.fsyncdirs);
    assert_eq!(calls, (3, 2, 1), "{counters:?}");
}

#[test]
fn a_name_is_durable_only_once_its_directory_is_synced() {
    let mount = LossyMount::new().unwrap();
    let dir = mount.path();
    let (name, tmp) = (dir.join("state"), dir.join("state.tmp"));

    // Created and fsynced, its directory not synced: gone.
    write_synced(&name, b"v1");
    let report = mount.cut();
    assert!(!name.exists());
    assert_eq!((report.entries_reverted, report.inodes_forgotten), (1, 1));

    // The same after fsync(dir): it survives.
    write_synced(&name, b"v1");
    sync_dir(dir);
    mount.cut();
    assert_eq!(fs::read(&name).unwrap(), b"v1");

    // A rename not followed by a directory sync is undone: the old name is back.
    fs::rename(&name, dir.join("renamed")).unwrap();
    assert_eq!(mount.cut().entries_reverted, 2);
    assert_eq!(fs::read(&name).unwrap(), b"v1");
    assert!(!dir.join("renamed").exists());

    // Write-fsync-rename over the old file without a directory sync: the old file is back.
    write_synced(&tmp, b"v2");
    fs::rename(&tmp, &name).unwrap();
    assert_eq!(fs::read(&name).unwrap(), b"v2");
    let report = mount.cut();
    assert_eq!((report.entries_reverted, report.inodes_forgotten), (1, 1));
    assert_eq!(fs::read(&name).unwrap(), b"v1");
    assert!(!tmp.exists());

    // With the directory sync, the replacement is durable.
    write_synced(&tmp, b"v2");
    fs::rename(&tmp, &name).unwrap();
    sync_dir(dir);
    let durably_replaced = CutReport {
        inodes_forgotten: 1,
        ..CutReport::default()
    };
    assert_eq!(mount.cut(), durably_replaced);
    assert_eq!(fs::read(&name).unwrap(), b"v2");
    assert!(!tmp.exists());

    // An unlink not followed by a directory sync is undone too.
    fs::remove_file(&name).unwrap();
    mount.cut();
    assert_eq!(fs::read(&name).unwrap(), b"v2");

    // A synced file in a synced subdirectory whose own name is not durable: all gone.
    fs::create_dir(dir.join("sub")).unwrap();
    write_synced(&dir.join("sub/file"), b"x");
    sync_dir(&dir.join("sub"));
    mount.cut();
    assert!(!dir.join("sub").exists());
}

/// Rows in each transaction, and transactions, of the SQLite tests.
const ROWS_PER_COMMIT: i64 = 5;
const COMMITS: i64 = 200;

/// Opens (creating) a database in WAL mode with the given `synchronous` setting, and syncs the
/// directory. SQLite does not sync the directory after creating the main database file; it does
/// after creating a WAL or a rollback journal, which, in the same directory, makes the
/// database's name durable too, at the first commit. An application that does not want to rely
/// on that (or must not lose a database before its first commit) syncs the directory itself.
///
/// The connection never checkpoints on close: a power cut kills the process, and a killed
/// process does not checkpoint either. Checkpoints run every 100 WAL pages.
fn open_db(db: &Path, synchronous: &str) -> Connection {
    let conn = Connection::open(db).unwrap();
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .unwrap();
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous}; PRAGMA wal_autocheckpoint=100;
         CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT NOT NULL);"
    ))
    .unwrap();
    sync_dir(db.parent().unwrap());
    conn
}

/// Commits transaction `n` (from 1) of `ROWS_PER_COMMIT` rows, ids following on.
fn commit(conn: &Connection, n: i64) {
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    for id in (n - 1) * ROWS_PER_COMMIT + 1..=n * ROWS_PER_COMMIT {
        let body = format!("{id:08}").repeat(64);
        conn.execute("INSERT INTO t (id, body) VALUES (?1, ?2)", (id, body))
            .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
}

/// After a cut: the rows a fresh connection finds. They must pass `PRAGMA integrity_check`
/// and be a prefix of what was committed (a lost commit takes every later one with it).
fn rows_after_cut(db: &Path) -> i64 {
    let conn = Connection::open(db).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let (rows, max): (i64, i64) = conn
        .query_row("SELECT count(*), coalesce(max(id), 0) FROM t", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(rows, max, "the rows are not a prefix of the commits");
    rows
}

/// Commits `COMMITS` transactions on a lossy mount, closes the connection, cuts the power and
/// returns the rows acknowledged and the rows found after the cut.
fn commit_then_cut(synchronous: &str) -> (i64, i64) {
    let mount = LossyMount::new().unwrap();
    let db = mount.path().join("sekali.db");
    let mut acknowledged = 0;
    {
        let conn = open_db(&db, synchronous);
        for n in 1..=COMMITS {
            commit(&conn, n);
            acknowledged = n * ROWS_PER_COMMIT; // COMMIT returned: the row is acknowledged
        }
    }
    let ops = mount.counters().ops;
    let report = mount.cut();
    let found = rows_after_cut(&db);
    eprintln!("synchronous={synchronous}: {acknowledged} acknowledged, {found} found; {report:?}");
    eprintln!("requests before the cut: {ops:?}");
    (acknowledged, found)
}

#[test]
fn with_synchronous_full_every_acknowledged_commit_survives_a_cut() {
    let (acknowledged, found) = commit_then_cut("FULL");
    assert_eq!(acknowledged, COMMITS * ROWS_PER_COMMIT);
    assert_eq!(found, acknowledged);
}

/// The control: the harness must catch a setting that acknowledges commits before they are
/// durable. With `synchronous=NORMAL` in WAL mode, SQLite syncs the WAL only at checkpoints.
#[test]
fn with_synchronous_normal_acknowledged_commits_are_lost_at_a_cut() {
    let (acknowledged, found) = commit_then_cut("NORMAL");
    assert!(
        found < acknowledged,
        "{acknowledged} acknowledged rows all survived the cut"
    );
    assert!(found > 0, "the rows of the last checkpoint are durable");
}

/// sekali's own writer connection (`store::open_for_writing`: WAL, `synchronous=FULL`, its
/// WAL-coalescing VFS) keeps every acknowledged commit. sekali does not sync the directory after
/// creating the database: SQLite's sync of the directory after creating the WAL makes the
/// database's name durable too, as both are in the one directory.
#[test]
fn sekalis_writer_connection_keeps_every_acknowledged_commit() {
    let mount = LossyMount::new().unwrap();
    let db = mount.path().join("sekali.db");
    {
        let conn = sekali::store::open_for_writing(&db, Duration::from_secs(5)).unwrap();
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
            .unwrap();
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
            .unwrap();
        for n in 1..=COMMITS {
            commit(&conn, n);
        }
    }
    let report = mount.cut();
    let found = rows_after_cut(&db);
    eprintln!("sekali's writer: {found} found; {report:?}");
    assert_eq!(found, COMMITS * ROWS_PER_COMMIT);
}

/// In rollback-journal mode (`journal_mode=DELETE`) a commit is the unlink of the journal. Under
/// the strict model that unlink is durable only once the directory is synced, which
/// `synchronous=EXTRA` does and `FULL` does not: after a cut the journal is back, hot, and SQLite
/// rolls the acknowledged commit back. (ext4 usually keeps the unlink; POSIX does not promise it.)
#[test]
fn in_rollback_journal_mode_only_synchronous_extra_keeps_a_commit() {
    for (synchronous, kept) in [("FULL", false), ("EXTRA", true)] {
        let mount = LossyMount::new().unwrap();
        let db = mount.path().join("sekali.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA journal_mode=DELETE; PRAGMA synchronous={synchronous};
             CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL);"
        ))
        .unwrap();
        sync_dir(mount.path());
        commit(&conn, 1);
        drop(conn);
        let report = mount.cut();
        let found = rows_after_cut(&db);
        eprintln!("journal_mode=DELETE, synchronous={synchronous}: {found} found; {report:?}");
        assert_eq!(found == ROWS_PER_COMMIT, kept, "synchronous={synchronous}");
    }
}

/// Not a test on its own: the writer process of `a_killed_writer_loses_no_acknowledged_commit`
/// (this test binary, run again). It prints `committed N` once transaction N's COMMIT returned
/// and commits until it is killed.
#[test]
#[ignore = "the writer process of a_killed_writer_loses_no_acknowledged_commit"]
fn writer_process() {
    let Some(db) = std::env::var_os("POWERCUT_WRITER_DB") else {
        return;
    };
    let conn = open_db(Path::new(&db), "FULL");
    for n in 1.. {
        commit(&conn, n);
        println!("committed {n}");
    }
}

/// The real thing: a writer process is killed (SIGKILL) in the middle of its commits, then the
/// power is cut. Every commit it acknowledged is there.
#[test]
fn a_killed_writer_loses_no_acknowledged_commit() {
    let mount = LossyMount::new().unwrap();
    let db = mount.path().join("sekali.db");
    let mut writer = Command::new(std::env::current_exe().unwrap())
        .args([
            "writer_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("POWERCUT_WRITER_DB", &db)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut acknowledged = 0;
    for line in BufReader::new(writer.stdout.take().unwrap()).lines() {
        if let Some(n) = line.unwrap().strip_prefix("committed ") {
            acknowledged = n.parse::<i64>().unwrap() * ROWS_PER_COMMIT;
            if acknowledged >= COMMITS * ROWS_PER_COMMIT {
                writer.kill().unwrap();
            }
        }
    }
    writer.wait().unwrap();
    assert!(
        acknowledged >= COMMITS * ROWS_PER_COMMIT,
        "the writer stopped on its own"
    );
    let report = mount.cut();
    let found = rows_after_cut(&db);
    eprintln!("killed writer: {acknowledged} acknowledged, {found} found; {report:?}");
    assert!(
        found >= acknowledged,
        "{acknowledged} acknowledged, {found} found"
    );
}

/// A test that panics with its mount in use leaves no mount behind: unwinding drops the
/// `LossyMount` (after the file declared after it), which unmounts. A file still open from
/// elsewhere does not keep the mount point busy: the mount is detached lazily and that file
/// is served until it is closed. (The panic message in the output is expected.)
#[test]
fn a_test_that_panics_leaves_no_mount_behind() {
    let (send, receive) = mpsc::channel::<(PathBuf, File)>();
    let outcome = std::thread::spawn(move || {
        let mount = LossyMount::new().unwrap();
        let outlives = mount.path().join("outlives");
        fs::write(&outlives, "still served").unwrap();
        send.send((mount.path().to_owned(), File::open(&outlives).unwrap()))
            .unwrap();
        let _open = File::create(mount.path().join("open")).unwrap();
        assert!(is_mounted(mount.path()));
        panic!("a test fails with its mount in use (this panic is expected)");
    })
    .join();
    assert!(outcome.is_err());
    let (path, mut outlives) = receive.recv().unwrap();
    assert!(!is_mounted(&path), "{} is still mounted", path.display());
    assert!(!path.exists(), "the mount point was not removed");
    let mut content = String::new();
    outlives.read_to_string(&mut content).unwrap();
    assert_eq!(content, "still served");
}
