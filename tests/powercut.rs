//! Power-cut tests on a lossy FUSE filesystem (`powercut/lossyfs.rs`): what survives a cut is
//! what was synced, data with `fsync` of the file and names with `fsync` of the directory.
//!
//! The first three tests check the filesystem itself, through the mounted path (the third its
//! opt-in model of Linux, where an `fsync` also keeps the file's names). The SQLite tests
//! check that the harness tells a durable commit from a lucky one (the controls): in WAL mode
//! with `synchronous=FULL` every acknowledged commit survives (also through sekali's own writer
//! connection), with `NORMAL` some do not; in rollback-journal mode only `EXTRA` keeps them. One
//! test checks that a panicking test leaves no mount behind. The next two run the real
//! `sekali serve` on the mount under load, with power cuts (see their docs). The next writes a
//! `sekali backup` onto the mount and cuts the power as soon as the command has reported it.
//!
//! The last three run PostgreSQL (when installed) with its data directory on the mount (see
//! [`pg`]): with `synchronous_commit = on` every acknowledged commit survives a cut, with `off`
//! (the control) some do not; and `sekali serve --db postgres://...`, itself off the mount, loses
//! no acknowledged delivery through power cuts of its database server. That last one mounts with
//! `fsync` keeping names (`lossyfs::Options::fsync_keeps_names`): PostgreSQL counts on Linux's
//! filesystems for that, and under the strict model a second cut loses a database created before
//! the first (see the test's documentation).
//!
//! Needs `/dev/fuse` and root or `fusermount3`. A cut models a machine losing power, which also
//! kills every process using the files: in-process, the tests close their files and connections
//! before cutting; the `sekali serve` tests kill the server with SIGKILL first.
//!
//! The binary has its own `main` (`harness = false`, the tests run by libtest-mimic, with
//! libtest's flags): started with `SEKALI_LOSSYFS_SERVE` set, it is the filesystem's server
//! process instead (see `powercut/lossyfs.rs`).

#[path = "powercut/lossyfs.rs"]
mod lossyfs;

#[allow(dead_code)]
#[path = "api/helpers.rs"]
mod helpers;

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use lossyfs::{is_mounted, CutReport, LossyMount};
use rusqlite::config::DbConfig;
use rusqlite::Connection;

/// A test for libtest-mimic, named after its function; a panic fails it, as under libtest.
macro_rules! trial {
    ($test:ident) => {
        libtest_mimic::Trial::test(stringify!($test), || {
            $test();
            Ok(())
        })
    };
}

fn main() -> std::process::ExitCode {
    if let Some(mount_point) = std::env::var_os(lossyfs::SERVE_ENV) {
        return match lossyfs::serve(Path::new(&mount_point)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!(
                    "lossyfs: serving {}: {e}",
                    Path::new(&mount_point).display()
                );
                std::process::ExitCode::FAILURE
            }
        };
    }
    let tests = [
        trial!(unsynced_writes_and_truncates_are_undone_at_a_cut_and_synced_bytes_survive),
        trial!(a_name_is_durable_only_once_its_directory_is_synced),
        trial!(with_fsync_keeping_names_a_synced_file_keeps_its_path),
        trial!(with_synchronous_full_every_acknowledged_commit_survives_a_cut),
        trial!(with_synchronous_normal_acknowledged_commits_are_lost_at_a_cut),
        trial!(sekalis_writer_connection_keeps_every_acknowledged_commit),
        trial!(in_rollback_journal_mode_only_synchronous_extra_keeps_a_commit),
        trial!(a_test_that_panics_leaves_no_mount_behind),
        trial!(power_cuts_under_mixed_load_lose_nothing_acknowledged_and_every_sent_email_is_whole),
        trial!(power_cuts_while_relaying_over_smtp_mark_sent_only_what_the_server_accepted),
        trial!(a_backup_reported_done_survives_a_power_cut_whole),
        trial!(postgres_with_synchronous_commit_on_keeps_every_acknowledged_commit_at_a_cut),
        trial!(postgres_with_synchronous_commit_off_loses_acknowledged_commits_at_a_cut),
        trial!(power_cuts_under_load_on_postgres_lose_no_acknowledged_delivery),
    ];
    libtest_mimic::run(&libtest_mimic::Arguments::from_args(), tests.into()).exit_code()
}

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

/// `lossyfs::Options::fsync_keeps_names` (for PostgreSQL, see
/// `power_cuts_under_load_on_postgres_lose_no_acknowledged_delivery`): an `fsync` of a file or
/// directory also makes durable the names on the way to it, its old names going; nothing else.
fn with_fsync_keeping_names_a_synced_file_keeps_its_path() {
    let mount = LossyMount::with(lossyfs::Options {
        fsync_keeps_names: true,
        ..lossyfs::Options::default()
    })
    .unwrap();
    let dir = mount.path();

    // A new file in a new directory, fsynced (no fsyncdir): both names survive; a file beside
    // it, written and not synced, does not.
    fs::create_dir(dir.join("base")).unwrap();
    write_synced(&dir.join("base/1"), b"one");
    fs::write(dir.join("base/2"), b"two").unwrap();
    let report = mount.cut();
    assert_eq!(fs::read(dir.join("base/1")).unwrap(), b"one");
    assert!(!dir.join("base/2").exists());
    assert_eq!((report.entries_reverted, report.inodes_forgotten), (1, 1));

    // A new directory, fsynced: its name survives.
    fs::create_dir(dir.join("db")).unwrap();
    sync_dir(&dir.join("db"));
    mount.cut();
    assert!(dir.join("db").is_dir());

    // Renamed, then fsynced: the new name survives and the old one is gone.
    fs::rename(dir.join("base/1"), dir.join("db/1")).unwrap();
    File::open(dir.join("db/1")).unwrap().sync_all().unwrap();
    mount.cut();
    assert_eq!(fs::read(dir.join("db/1")).unwrap(), b"one");
    assert!(!dir.join("base/1").exists());

    // An unlink is durable only with a sync of its directory, as before.
    fs::remove_file(dir.join("db/1")).unwrap();
    write_synced(&dir.join("base/3"), b"three");
    mount.cut();
    assert_eq!(fs::read(dir.join("db/1")).unwrap(), b"one");
    assert_eq!(fs::read(dir.join("base/3")).unwrap(), b"three");
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

fn with_synchronous_full_every_acknowledged_commit_survives_a_cut() {
    let (acknowledged, found) = commit_then_cut("FULL");
    assert_eq!(acknowledged, COMMITS * ROWS_PER_COMMIT);
    assert_eq!(found, acknowledged);
}

/// The control: the harness must catch a setting that acknowledges commits before they are
/// durable. With `synchronous=NORMAL` in WAL mode, SQLite syncs the WAL only at checkpoints.
fn with_synchronous_normal_acknowledged_commits_are_lost_at_a_cut() {
    let (acknowledged, found) = commit_then_cut("NORMAL");
    assert!(
        found < acknowledged,
        "{acknowledged} acknowledged rows all survived the cut"
    );
    assert!(found > 0, "the rows of the last checkpoint are durable");
}

/// sekali's own writer connection (`store::open_for_writing`: WAL, `synchronous=FULL`) keeps
/// every acknowledged commit. It syncs the directory after creating the database (SQLite's own
/// sync of the directory after creating the WAL would make the name durable at the first commit;
/// sekali does not count on it).
fn sekalis_writer_connection_keeps_every_acknowledged_commit() {
    let mount = LossyMount::new().unwrap();
    let db = mount.path().join("sekali.db");
    {
        let conn = sekali::store::sqlite::open_for_writing(&db, Duration::from_secs(5)).unwrap();
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

/// A test that panics with its mount in use leaves no mount behind: unwinding drops the
/// `LossyMount` (after the file declared after it), which unmounts. A file still open from
/// elsewhere does not keep the mount point busy: the mount is detached lazily and that file
/// is served until it is closed. (The panic message in the output is expected.)
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

// ---------------------------------------------------------------------------------------------
// The real binary: `sekali serve` on the lossy mount, under load, with power cuts.

mod serve {
    use std::collections::{BTreeMap, HashMap, HashSet};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use rusqlite::Connection;
    use serde_json::json;

    use super::helpers::{port_from_log, rust_log_with_listening_line, wait_until_healthy};
    use super::lossyfs::{CutReport, LossyMount};

    pub const STRIPE_SECRET: &str = "whsec_powercut_c2VrYWxpLXBvd2VyY3V0";
    pub const API_TOKEN: &str = "tok-powercut-7f3a";

    /// The binary under test: this checkout's, or `SEKALI_POWERCUT_BIN` (to show what the cuts
    /// do to another build, such as one from before a fix).
    pub fn binary() -> PathBuf {
        std::env::var_os("SEKALI_POWERCUT_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_sekali")))
    }

    fn now_unix() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    fn agent() -> ureq::Agent {
        ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(2))
            .timeout(Duration::from_secs(20))
            .build()
    }

    /// `sekali serve` on files in the mount, restarted after each cut on the same files and
    /// the same port.
    pub struct Server {
        child: Option<Child>,
        /// The port the server reported; 0 until it first started.
        pub port: u16,
        dir: PathBuf,
        args: Vec<String>,
        env: Vec<(String, String)>,
        log: PathBuf,
    }

    impl Server {
        /// Starts the server on a port of the system's choosing, which `port` then holds.
        pub fn start(dir: &Path, log: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
            let mut server = Server {
                child: None,
                port: 0,
                dir: dir.to_owned(),
                args: args.iter().map(|a| a.to_string()).collect(),
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                log: log.to_owned(),
            };
            server.spawn();
            server
        }

        fn spawn(&mut self) {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .unwrap();
            let log_start = log.metadata().unwrap().len();
            let mut command = Command::new(binary());
            command
                .args([
                    "serve",
                    // First any free port (0), which the server reports; a restart asks for
                    // that same port again, as the senders keep sending to it.
                    "--listen",
                    &format!("127.0.0.1:{}", self.port),
                    "--db",
                ])
                .arg(self.dir.join("sekali.db"))
                .arg("--mail-dir")
                .arg(self.dir.join("mail"))
                .args([
                    // A killed relay's rows are claimed again once their lease runs out.
                    "--relay-lease",
                    "3s",
                    "--relay-timeout",
                    "2s",
                    "--relay-poll-interval",
                    "20ms",
                ])
                .args(&self.args)
                .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
                .env("SEKALI_API_TOKENS", format!("shop:{API_TOKEN}"))
                .env_remove("MIDTRANS_SERVER_KEY")
                .env_remove("SEKALI_SMTP_URL")
                .env("RUST_LOG", rust_log_with_listening_line("warn"))
                .stdout(Stdio::null())
                .stderr(log);
            for (name, value) in &self.env {
                command.env(name, value);
            }
            let child = self.child.insert(command.spawn().unwrap());
            let port = port_from_log(&self.log, log_start, child, Duration::from_secs(30));
            assert!(
                self.port == 0 || port == self.port,
                "restarted on {port}, not on {}",
                self.port
            );
            self.port = port;
            assert!(
                wait_until_healthy(&agent(), port, Duration::from_secs(30)),
                "sekali did not start after a cut; see {}",
                self.log.display()
            );
        }

        /// SIGKILL, then the power cut, then `integrity_check` on what is left, then
        /// `after_the_cut` on the database (what the restarted server will find), then a restart
        /// on the same files.
        pub fn cut_and_restart(
            &mut self,
            mount: &LossyMount,
            after_the_cut: impl FnOnce(&Path),
        ) -> CutReport {
            let mut child = self.child.take().unwrap();
            child.kill().unwrap();
            child.wait().unwrap();
            // The kernel's last release requests for the killed process may still be in flight.
            std::thread::sleep(Duration::from_millis(50));
            let report = mount.cut();
            let check: String = Connection::open(self.dir.join("sekali.db"))
                .unwrap()
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .unwrap();
            assert_eq!(check, "ok", "after a cut");
            after_the_cut(&self.dir.join("sekali.db"));
            self.spawn();
            report
        }

        pub fn stop(&mut self) {
            if let Some(mut child) = self.child.take() {
                Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status()
                    .unwrap();
                child.wait().unwrap();
            }
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// One request of the load: a Stripe event (signed when sent) or an order for the API.
    #[derive(Clone)]
    pub enum Request {
        Event { id: String, body: Vec<u8> },
        Order { key: String, body: String },
    }

    fn stripe_event(id: &str, kind: &str, object: serde_json::Value) -> Request {
        let body = json!({
            "id": id, "object": "event", "api_version": "2024-06-20", "created": 1_732_870_000,
            "livemode": false, "pending_webhooks": 1,
            "request": {"id": null, "idempotency_key": null},
            "type": kind, "data": {"object": object},
        });
        Request::Event {
            id: id.to_owned(),
            body: serde_json::to_vec_pretty(&body).unwrap(),
        }
    }

    /// For order `n`: processing, succeeded (with a receipt address), a partial then a full
    /// refund of its charge, and an order of the orders API under its Idempotency-Key.
    pub fn workload(tag: &str, orders: usize) -> Vec<Request> {
        let mut requests = Vec::new();
        for n in 0..orders {
            let (order, pi) = (format!("ord_{tag}_{n}"), format!("pi_{tag}_{n}"));
            let intent = |status: &str| {
                json!({"id": pi, "object": "payment_intent", "amount": 2500, "amount_received": 2500,
                       "currency": "usd", "status": status, "metadata": {"order_id": order},
                       "receipt_email": format!("c{n}@example.com")})
            };
            let charge = |refunded: i64| {
                json!({"id": format!("ch_{tag}_{n}"), "object": "charge", "amount": 2500,
                       "amount_captured": 2500, "amount_refunded": refunded,
                       "refunded": refunded == 2500, "currency": "usd", "payment_intent": pi,
                       "metadata": {}, "billing_details": {"email": format!("c{n}@example.com")}})
            };
            requests.push(stripe_event(
                &format!("evt_{tag}_{n}_a"),
                "payment_intent.processing",
                intent("processing"),
            ));
            requests.push(stripe_event(
                &format!("evt_{tag}_{n}_b"),
                "payment_intent.succeeded",
                intent("succeeded"),
            ));
            requests.push(stripe_event(
                &format!("evt_{tag}_{n}_c"),
                "charge.refunded",
                charge(1000),
            ));
            requests.push(stripe_event(
                &format!("evt_{tag}_{n}_d"),
                "charge.refunded",
                charge(2500),
            ));
            requests.push(Request::Order {
                key: format!("key-{tag}-{n}"),
                body: json!({"order_id": format!("ord_api_{tag}_{n}"), "amount": 4200 + n,
                             "currency": "usd", "provider": "stripe",
                             "customer_email": format!("api{n}@example.com")})
                .to_string(),
            });
        }
        requests
    }

    /// What the server acknowledged, and every answer that contradicts an earlier
    /// acknowledgement (see [`send`]).
    #[derive(Default)]
    pub struct Acknowledged {
        /// Each event answered 200, with its answer's `status`: the first other than
        /// `duplicate` (the answer to the delivery that applied it), else `duplicate`.
        pub events: Mutex<BTreeMap<String, String>>,
        /// Each order key answered 201: the request's body and the first 201's body.
        pub orders: Mutex<BTreeMap<String, (String, String)>>,
        /// The keys answered 201 without `Idempotent-Replayed` (the answer that created the
        /// order).
        created: Mutex<HashSet<String>>,
        /// Answers that contradict an earlier acknowledgement.
        pub contradictions: Mutex<Vec<String>>,
    }

    impl Acknowledged {
        /// True once `request` was acknowledged.
        pub fn has(&self, request: &Request) -> bool {
            match request {
                Request::Event { id, .. } => self.events.lock().unwrap().contains_key(id),
                Request::Order { key, .. } => self.orders.lock().unwrap().contains_key(key),
            }
        }

        fn contradiction(&self, what: String) {
            self.contradictions.lock().unwrap().push(what);
        }
    }

    /// Sends `request` once; true when it was acknowledged (an event: 200 with its outcome; an
    /// order: 201).
    ///
    /// Each answer is checked against what was acknowledged before, and a contradiction is
    /// recorded in `acked.contradictions`: an event acknowledged before this request was sent
    /// must be answered `duplicate`, and no event may be answered otherwise twice (it was
    /// applied twice, or lost after its answer and applied again); an order key acknowledged
    /// before must be answered with the byte-identical 201 marked `Idempotent-Replayed`, and
    /// only one 201 per key may come unmarked. A delivery lost at a cut after its answer is
    /// caught here when it is sent again, whichever sender sends it.
    pub fn send(agent: &ureq::Agent, port: u16, request: &Request, acked: &Acknowledged) -> bool {
        let known = acked.has(request);
        match request {
            Request::Event { id, body } => {
                let header =
                    sekali::providers::stripe::signature_header(&[STRIPE_SECRET], now_unix(), body);
                let sent = agent
                    .post(&format!("http://127.0.0.1:{port}/webhooks/stripe"))
                    .set("Stripe-Signature", &header)
                    .set("Content-Type", "application/json")
                    .send_bytes(body);
                // The answer's `status`, from a body read whole (a kill can cut it short).
                let outcome = match sent {
                    Ok(r) if r.status() == 200 => r
                        .into_string()
                        .ok()
                        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
                        .and_then(|answer| answer["status"].as_str().map(str::to_owned)),
                    _ => None,
                };
                let Some(outcome) = outcome else {
                    return false;
                };
                let mut events = acked.events.lock().unwrap();
                match events.get_mut(id) {
                    None => {
                        events.insert(id.clone(), outcome);
                    }
                    Some(_) if outcome == "duplicate" => {}
                    Some(first) if known => acked.contradiction(format!(
                        "{id} answered {outcome} when sent after it was acknowledged ({first})"
                    )),
                    Some(first) if first == "duplicate" => *first = outcome,
                    Some(first) => acked.contradiction(format!(
                        "{id} answered {outcome} and {first}: applied twice"
                    )),
                }
                true
            }
            Request::Order { key, body } => {
                let sent = agent
                    .post(&format!("http://127.0.0.1:{port}/orders"))
                    .set("Authorization", &format!("Bearer {API_TOKEN}"))
                    .set("Idempotency-Key", key)
                    .set("Content-Type", "application/json")
                    .send_string(body);
                let answer = match sent {
                    Ok(r) if r.status() == 201 => {
                        let replayed = r.header("Idempotent-Replayed") == Some("true");
                        r.into_string().ok().map(|text| (text, replayed))
                    }
                    _ => None,
                };
                let Some((answer, replayed)) = answer else {
                    return false;
                };
                let mut orders = acked.orders.lock().unwrap();
                let (_, first) = orders
                    .entry(key.clone())
                    .or_insert_with(|| (body.clone(), answer.clone()));
                if *first != answer {
                    acked.contradiction(format!("{key}: a 201 of {answer} after a 201 of {first}"));
                }
                if !replayed && (known || !acked.created.lock().unwrap().insert(key.clone())) {
                    acked.contradiction(format!(
                        "{key}: a 201 not marked Idempotent-Replayed after its first 201 (created again)"
                    ));
                }
                true
            }
        }
    }

    /// Where an order of the workload stands on its one chain; `None` off it.
    fn rank(status: &str) -> Option<usize> {
        ["pending", "paid", "partially_refunded", "refunded"]
            .iter()
            .position(|s| *s == status)
    }

    /// For an event of the workload (`evt_<tag>_<n>_<a|b|c|d>`, see [`workload`]): its order,
    /// and the least status and refunded amount the order has once the event is applied (an
    /// event that finds its order further along is `stale` and leaves it there).
    fn applied_floor(event_id: &str) -> (String, &'static str, i64) {
        let (stem, kind) = event_id.rsplit_once('_').unwrap();
        let floor = match kind {
            "a" => ("pending", 0),
            "b" => ("paid", 0),
            "c" => ("partially_refunded", 1000),
            "d" => ("refunded", 2500),
            _ => panic!("{event_id} is not an event of the workload"),
        };
        (stem.replacen("evt_", "ord_", 1), floor.0, floor.1)
    }

    /// The database as a cut left it, read before the restart: what the restarted server
    /// finds.
    pub struct AfterCut {
        /// `processed_events`: event id to outcome.
        events: HashMap<String, String>,
        /// `orders`: order id to status and refunded amount.
        orders: HashMap<String, (String, i64)>,
        /// The events that changed an order (`order_transitions.event_id`).
        changed: HashSet<String>,
        /// The events that queued an email (`email_outbox.event_id`).
        queued: HashSet<String>,
        /// `idempotency_keys`: key to the stored response body.
        responses: HashMap<String, String>,
        /// The outbox rows still pending under a lease, by key, with their lease (owner and
        /// end): the rows a killed relay held, so may have handed to the transport without its
        /// result being committed. The relay sends a row again only once its lease runs out, so
        /// these, once each, are the only sends again this cut can cause. (A lease still there
        /// at the next cut is the same lease, not a second chance.)
        pub in_flight: Vec<(String, String)>,
    }

    impl AfterCut {
        pub fn read(db: &Path) -> AfterCut {
            let conn = Connection::open(db).unwrap();
            let pairs = |sql: &str| -> Vec<(String, String)> {
                let mut stmt = conn.prepare(sql).unwrap();
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
                rows
            };
            let firsts = |sql: &str| pairs(sql).into_iter().map(|(first, _)| first);
            let mut stmt = conn
                .prepare("SELECT order_id, status, refunded_amount FROM orders")
                .unwrap();
            let orders = stmt
                .query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            AfterCut {
                events: pairs("SELECT event_id, outcome FROM processed_events")
                    .into_iter()
                    .collect(),
                orders,
                changed: firsts("SELECT event_id, '' FROM order_transitions").collect(),
                queued: firsts("SELECT event_id, '' FROM email_outbox").collect(),
                responses: pairs("SELECT key, response_body FROM idempotency_keys")
                    .into_iter()
                    .collect(),
                in_flight: pairs(
                    "SELECT idempotency_key, lease_owner || ' until ' || lease_until
                     FROM email_outbox WHERE status = 'pending' AND lease_owner IS NOT NULL",
                ),
            }
        }

        /// What the acknowledged `events` (id to answer, see [`Acknowledged`]) and `orders`
        /// should have left here and did not: an event's `processed_events` row; for one
        /// answered `processed` or `stale`, its order at least as far as the event takes it;
        /// for one answered `processed`, its transition and (from paid on) its outbox row; an
        /// order's row and its stored response, byte for byte the 201 given.
        pub fn missing(
            &self,
            events: &BTreeMap<String, String>,
            orders: &BTreeMap<String, (String, String)>,
        ) -> Vec<String> {
            let mut missing = Vec::new();
            for (id, answer) in events {
                if !self.events.contains_key(id) {
                    missing.push(format!("{id} ({answer}): no processed_events row"));
                    continue;
                }
                if answer == "processed" || answer == "stale" {
                    let (order, status, refunded) = applied_floor(id);
                    let now = self.orders.get(&order);
                    if !now.is_some_and(|(s, r)| rank(s) >= rank(status) && *r >= refunded) {
                        missing.push(format!(
                            "{id} ({answer}): {order} is {now:?}, short of {status} with {refunded} refunded"
                        ));
                    }
                }
                if answer == "processed" {
                    if !self.changed.contains(id) {
                        missing.push(format!("{id} ({answer}): no order_transitions row"));
                    }
                    if !id.ends_with("_a") && !self.queued.contains(id) {
                        missing.push(format!("{id} ({answer}): no email_outbox row"));
                    }
                }
            }
            for (key, (body, answer)) in orders {
                match self.responses.get(key) {
                    None => missing.push(format!("{key}: no idempotency_keys row")),
                    Some(stored) if stored != answer => missing.push(format!(
                        "{key}: stored response {stored} is not the 201 given, {answer}"
                    )),
                    Some(_) => {}
                }
                let order: serde_json::Value = serde_json::from_str(body).unwrap();
                let order_id = order["order_id"].as_str().unwrap();
                if !self.orders.contains_key(order_id) {
                    missing.push(format!("{key}: no row for its order {order_id}"));
                }
            }
            missing
        }
    }

    /// What the cuts of [`load_with_cuts`] did.
    #[derive(Default)]
    pub struct Cuts {
        pub reports: Vec<CutReport>,
        /// Per cut, how many rows were in flight at it ([`AfterCut::in_flight`]).
        pub in_flight: Vec<usize>,
        /// Per outbox key, the distinct leases on its row that a cut cut short: at most one
        /// send again each.
        pub cut_short: HashMap<String, HashSet<String>>,
        /// Per cut, the acknowledgements (deliveries and orders) from before it, each found
        /// whole after it.
        pub checked: Vec<usize>,
        /// Acknowledged requests sent once more at the end (each answered as before).
        pub resent_acknowledged: usize,
    }

    /// Sends every request (shuffled, a third again as racing redeliveries) from 8 sender
    /// threads, each retrying what is not acknowledged for a second, while `cuts` power cuts
    /// hit the server, evenly spread. After each cut, before the restart, every acknowledgement
    /// from before it must be in what the cut left (see [`AfterCut::missing`]). Then, as
    /// docs/reliability.md says, everything not acknowledged is sent again until it is, and a
    /// quarter of what was acknowledged once more, which must be answered as before; no answer
    /// of the whole run may contradict an acknowledgement (see [`send`]).
    pub fn load_with_cuts(
        mount: &LossyMount,
        server: &Arc<Mutex<Server>>,
        requests: &[Request],
        cuts: usize,
        acked: &Arc<Acknowledged>,
        seed: u64,
    ) -> Cuts {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.extend((0..requests.len() / 3).map(|_| rng.usize(..requests.len())));
        rng.shuffle(&mut order);
        let requests = Arc::new(requests.to_vec());
        let order = Arc::new(order);
        let next = Arc::new(AtomicUsize::new(0));
        let port = server.lock().unwrap().port;
        let senders: Vec<_> = (0..8)
            .map(|_| {
                let (requests, order, next, acked) =
                    (requests.clone(), order.clone(), next.clone(), acked.clone());
                std::thread::spawn(move || {
                    let agent = agent();
                    // As a provider does: a delivery not acknowledged is sent again after a
                    // pause, for a while, before the sender moves on. (Moving on at once burnt
                    // through most of the load while the server restarted, so that few
                    // acknowledgements came before the later cuts.)
                    while let Some(&i) = order.get(next.fetch_add(1, Ordering::SeqCst)) {
                        for _ in 0..100 {
                            if send(&agent, port, &requests[i], &acked) {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                })
            })
            .collect();
        let mut done = Cuts::default();
        for k in 1..=cuts {
            let threshold = k * order.len() / (cuts + 1);
            while next.load(Ordering::SeqCst) < threshold {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Read after the kill and the cut, before the restart: every answer read so far
            // came from a server that is now killed and cut.
            let mut seen = None;
            let report = server.lock().unwrap().cut_and_restart(mount, |db| {
                let events = acked.events.lock().unwrap().clone();
                let orders = acked.orders.lock().unwrap().clone();
                seen = Some((events, orders, AfterCut::read(db)));
            });
            let (events, orders, after) = seen.unwrap();
            let missing = after.missing(&events, &orders);
            assert!(
                missing.is_empty(),
                "cut {k}: {} of {} acknowledgements from before it are not (whole) in what it left: {:?}",
                missing.len(),
                events.len() + orders.len(),
                &missing[..missing.len().min(10)]
            );
            done.reports.push(report);
            done.in_flight.push(after.in_flight.len());
            for (key, lease) in after.in_flight {
                done.cut_short.entry(key).or_default().insert(lease);
            }
            done.checked.push(events.len() + orders.len());
        }
        for sender in senders {
            sender.join().unwrap();
        }
        // Then as the providers do: what was not acknowledged, again until it is; and a
        // quarter of what was (seeded), which must be answered as a duplicate or with the same
        // 201.
        let agent = agent();
        let acknowledged: Vec<bool> = requests.iter().map(|r| acked.has(r)).collect();
        for (request, _) in requests.iter().zip(&acknowledged).filter(|(_, a)| !**a) {
            let mut tries = 0;
            while !send(&agent, port, request, acked) {
                tries += 1;
                assert!(tries < 100, "a request was never acknowledged");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for (request, _) in requests.iter().zip(&acknowledged).filter(|(_, a)| **a) {
            if rng.usize(..4) == 0 {
                assert!(
                    send(&agent, port, request, acked),
                    "an acknowledged request was refused when sent again"
                );
                done.resent_acknowledged += 1;
            }
        }
        let contradictions = acked.contradictions.lock().unwrap();
        assert!(
            contradictions.is_empty(),
            "{} answers contradict an earlier acknowledgement: {:?}",
            contradictions.len(),
            &contradictions[..contradictions.len().min(10)]
        );
        done
    }

    /// Waits until no email is pending (rows a killed relay held wait out their lease).
    pub fn wait_for_the_relay(db: &Path) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let pending: i64 = Connection::open(db)
                .unwrap()
                .query_row(
                    "SELECT count(*) FROM email_outbox WHERE status = 'pending'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            if pending == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "{pending} emails still pending");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The outbox rows (key, status) with a recipient.
    pub fn emails(db: &Path) -> Vec<(String, String)> {
        let conn = Connection::open(db).unwrap();
        let mut stmt = conn
            .prepare("SELECT idempotency_key, status FROM email_outbox WHERE recipient IS NOT NULL")
            .unwrap();
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        rows
    }

    /// Checks that the outbox holds exactly the emails the orders' money calls for: a receipt
    /// per order that took money, and refund notices whose totals rise, each once, to the money
    /// the order gave back (how many depends on the order the refunds arrived in: a full refund
    /// before the partial one is told once, in all). Returns how many emails there are.
    pub fn check_emails_follow_the_money(db: &Path) -> usize {
        let conn = Connection::open(db).unwrap();
        let orders: Vec<(String, Option<i64>, i64)> = conn
            .prepare("SELECT order_id, paid_amount, refunded_amount FROM orders")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let mut emails = 0;
        for (order, paid, refunded) in orders {
            let rows: Vec<(String, i64)> = conn
                .prepare(
                    "SELECT template, json_extract(params, '$.refunded_amount') FROM email_outbox
                     WHERE order_id = ?1 ORDER BY id",
                )
                .unwrap()
                .query_map([&order], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let receipts = rows.iter().filter(|(t, _)| t == "receipt").count();
            assert_eq!(receipts, usize::from(paid.is_some()), "{order}: receipts");
            let totals: Vec<i64> = rows
                .iter()
                .filter(|(t, _)| t == "refund_notice")
                .map(|(_, total)| *total)
                .collect();
            assert!(
                totals.windows(2).all(|w| w[0] < w[1]),
                "{order}: {totals:?}"
            );
            assert_eq!(totals.last().copied().unwrap_or(0), refunded, "{order}");
            emails += rows.len();
        }
        emails
    }

    /// A whole MIME message (it ends with its closing boundary) that names `key` in its
    /// Message-ID.
    pub fn is_whole_email_of(text: &str, key: &str) -> bool {
        let boundary = text
            .split("boundary=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next());
        text.contains(&format!("Message-ID: <{key}@"))
            && boundary.is_some_and(|b| text.trim_end().ends_with(&format!("--{b}--")))
    }
}

/// Fails on the relay that marked a row `sent` before its `.eml` file's data was on the disk:
/// after a cut such files were empty, and those customers' emails were never sent again.
///
/// `sekali serve` on the lossy mount (database and mail directory), under webhooks with racing
/// redeliveries and out-of-order lifecycles, orders of the API under Idempotency-Keys, the relay
/// writing `.eml` files, and the purge deleting ids that expire during the run; five power cuts,
/// each after a SIGKILL, and a restart on the same files after each. Fails too on a writer that
/// answers before its commit is durable (`synchronous=NORMAL`): after a cut, before the
/// restart, acknowledged deliveries and orders are missing (see `serve::load_with_cuts`).
fn power_cuts_under_mixed_load_lose_nothing_acknowledged_and_every_sent_email_is_whole() {
    use serve::*;
    use std::sync::{Arc, Mutex};

    let mount = LossyMount::new().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("server.log");
    let db = mount.path().join("sekali.db");

    // First, ids that expire during the run: the purge deletes them between and across cuts.
    let mut early = Server::start(mount.path(), &log, &["--stripe-retention", "2s"], &[]);
    let expiring = workload("early", 20);
    let acked_early = Arc::new(Acknowledged::default());
    let agent = ureq::AgentBuilder::new().build();
    for request in &expiring {
        assert!(send(&agent, early.port, request, &acked_early));
    }
    early.stop();
    drop(early);

    let server = Arc::new(Mutex::new(Server::start(
        mount.path(),
        &log,
        &["--purge-interval", "1s"],
        &[],
    )));
    let requests = workload("main", 150);
    let acked = Arc::new(Acknowledged::default());
    // Checks after each cut that nothing acknowledged before it is lost, and that no answer
    // contradicts an acknowledgement.
    let cuts = load_with_cuts(&mount, &server, &requests, 5, &acked, 0x9c07);
    wait_for_the_relay(&db);
    let port = server.lock().unwrap().port;

    // Nor at the end: only what was not acknowledged was sent again (with a sample of the
    // rest), so an acknowledged delivery lost to a cut would be missing here.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let stored: std::collections::HashSet<String> = conn
        .prepare("SELECT event_id FROM processed_events")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let acked_events = acked.events.lock().unwrap().clone();
    let lost: Vec<&String> = acked_events
        .keys()
        .filter(|id| !stored.contains(*id))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged, then lost to a cut: {lost:?}"
    );
    // The expired ids were purged; their orders stay.
    assert!(
        stored.iter().all(|id| !id.starts_with("evt_early")),
        "the purge ran"
    );
    let early_orders: i64 = conn
        .query_row(
            "SELECT count(*) FROM orders WHERE order_id LIKE 'ord_early_%' AND status = 'refunded'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(early_orders, 20);
    // Every order ends refunded, through one chain of status changes.
    let refunded: i64 = conn
        .query_row(
            "SELECT count(*) FROM orders WHERE order_id LIKE 'ord_main_%' AND status = 'refunded' AND refunded_amount = 2500",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(refunded, 150);

    // Every 201 of the orders API is replayed byte for byte for its key.
    let agent = ureq::AgentBuilder::new().build();
    let orders = acked.orders.lock().unwrap().clone();
    assert_eq!(orders.len(), 150);
    for (key, (body, first_answer)) in &orders {
        let replay = agent
            .post(&format!("http://127.0.0.1:{port}/orders"))
            .set("Authorization", &format!("Bearer {API_TOKEN}"))
            .set("Idempotency-Key", key)
            .set("Content-Type", "application/json")
            .send_string(body)
            .unwrap();
        assert_eq!(replay.status(), 201, "{key}");
        assert_eq!(replay.header("Idempotent-Replayed"), Some("true"), "{key}");
        assert_eq!(&replay.into_string().unwrap(), first_answer, "{key}");
    }

    // Every email is sent, and every sent email is whole on the disk with its Message-ID.
    let emails = emails(&db);
    assert_eq!(emails.len(), check_emails_follow_the_money(&db));
    assert!(emails.len() >= 170, "a refund notice at least per order");
    for (key, status) in &emails {
        assert_eq!(status, "sent", "{key}");
        let path = mount.path().join("mail").join(format!("{key}.eml"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("the file of a sent email, {}: {e}", path.display()));
        assert!(
            is_whole_email_of(&text, key),
            "{} is not whole",
            path.display()
        );
    }
    server.lock().unwrap().stop();

    // Written again only where a cut left its row in flight. A second write of an email
    // replaces its file (same name, same bytes), so which email was written twice cannot be
    // seen on the disk, and no per-email bound (as over SMTP) can be checked. What can: each
    // write of an `.eml` file ends in one rename of its temporary file into place (nothing else
    // on the mount renames), and the filesystem counts the renames. So the writes beyond one
    // per email are counted exactly, though not attributed to emails; they cannot outnumber
    // the leases the cuts cut short (an upper bound: rows claimed but not yet written when
    // their relay was killed are among those).
    let renames = mount.counters().ops.get("rename").copied().unwrap_or(0) as usize;
    let cut_short: usize = cuts.cut_short.values().map(|l| l.len()).sum();
    assert!(
        renames >= emails.len(),
        "{renames} files renamed into place for {} emails",
        emails.len()
    );
    let written_again = renames - emails.len();
    assert!(
        written_again <= cut_short,
        "{written_again} emails were written again, but the cuts cut only {cut_short} leases short"
    );

    let dropped: u64 = cuts.reports.iter().map(|r| r.bytes_dropped).sum();
    eprintln!(
        "power cuts: {} cuts dropped {dropped} unsynced bytes in all; acknowledgements checked after each cut: {:?}, 0 lost; \
         {} deliveries and {} orders acknowledged, 0 lost, {} acknowledged sent again and answered as before; \
         {} emails sent, each whole; {written_again} written again, of rows in flight at the cuts {:?} ({cut_short} leases cut short)",
        cuts.reports.len(),
        cuts.checked,
        acked_events.len(),
        orders.len(),
        cuts.resent_acknowledged,
        emails.len(),
        cuts.in_flight
    );
}

/// The relay sending over SMTP: a row is `sent` only after the server's 250, so after power cuts
/// every `sent` row's message is one the server accepted; a row whose message was accepted just
/// before a cut may be sent again (the documented at-least-once resend, with the same
/// Message-ID), but only those: a message is accepted at most once, plus once for each cut
/// after which its row was found pending under the killed relay's lease. No acknowledged
/// delivery is lost, as in the test above.
fn power_cuts_while_relaying_over_smtp_mark_sent_only_what_the_server_accepted() {
    use serve::*;
    use std::io::BufRead;
    use std::sync::{Arc, Mutex};

    let mount = LossyMount::new().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let received = outside.path().join("received");
    let smtp_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut sink = std::process::Command::new("python3")
        .arg(format!("{}/tests/smtp_sink.py", env!("CARGO_MANIFEST_DIR")))
        .arg(smtp_port.to_string())
        .arg(&received)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the SMTP sink (aiosmtpd)");
    let mut ready = String::new();
    std::io::BufReader::new(sink.stdout.as_mut().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    let db = mount.path().join("sekali.db");
    let smtp_url = format!("smtp://127.0.0.1:{smtp_port}");
    let server = Arc::new(Mutex::new(Server::start(
        mount.path(),
        &outside.path().join("server.log"),
        &[],
        &[("SEKALI_SMTP_URL", &smtp_url)],
    )));
    let requests: Vec<Request> = workload("smtp", 80)
        .into_iter()
        .filter(|r| matches!(r, Request::Event { .. }))
        .collect();
    let acked = Arc::new(Acknowledged::default());
    let cuts = load_with_cuts(&mount, &server, &requests, 4, &acked, 0x5317);
    wait_for_the_relay(&db);
    server.lock().unwrap().stop();
    let _ = sink.kill();
    let _ = sink.wait();

    // How many times the server accepted each Message-ID.
    let mut accepted: std::collections::HashMap<String, usize> = Default::default();
    for entry in std::fs::read_dir(&received).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "eml") {
            continue; // a file the sink, killed, did not finish (it renames each into place)
        }
        let text = std::fs::read_to_string(path).unwrap();
        let id = text
            .lines()
            .find_map(|l| l.strip_prefix("Message-ID: <"))
            .and_then(|rest| rest.split('@').next())
            .expect("every message has a Message-ID")
            .to_owned();
        *accepted.entry(id).or_default() += 1;
    }
    let emails = emails(&db);
    assert_eq!(
        emails.len(),
        check_emails_follow_the_money(&db),
        "the emails the money calls for"
    );
    assert!(emails.len() >= 80, "a refund notice at least per order");
    for (key, status) in &emails {
        assert_eq!(status, "sent", "{key}");
        assert!(
            accepted.contains_key(key),
            "{key} is sent but the server never accepted it"
        );
    }
    // Sent again only where a cut left the row in flight: pending under the killed relay's
    // lease in what the cut left (its result not committed), found before the restart. Once
    // more for each such lease at most.
    let cut_short = |key: &str| cuts.cut_short.get(key).map_or(0, |leases| leases.len());
    let beyond: Vec<_> = accepted
        .iter()
        .filter(|(key, n)| **n > 1 + cut_short(key))
        .map(|(key, n)| (key, n, cut_short(key)))
        .collect();
    assert!(
        beyond.is_empty(),
        "accepted more often than once plus once per lease on its row a cut cut short (key, accepted, leases cut short): {beyond:?}"
    );
    let resent: usize = accepted.values().map(|n| n - 1).sum();
    let leases: usize = cuts.cut_short.values().map(|l| l.len()).sum();
    let acknowledged = acked.events.lock().unwrap().len();
    eprintln!(
        "SMTP under {} power cuts: acknowledgements checked after each cut: {:?}, 0 lost; {acknowledged} deliveries acknowledged, {} sent again and answered duplicate; \
         {} emails sent, each accepted by the server; {resent} accepted again, each in flight at a cut (rows in flight at the cuts {:?}, {leases} leases cut short)",
        cuts.reports.len(),
        cuts.checked,
        cuts.resent_acknowledged,
        emails.len(),
        cuts.in_flight
    );
}

/// Fails on a `sekali backup` that reports a copy before its name is durable: issue "Power
/// loss" asks that the backup sync its copy before it reports success.
///
/// A database with content (`sekali serve` on a normal temporary directory, 20 orders' worth of
/// signed Stripe deliveries and orders of the API, then stopped), `sekali backup` of it onto the
/// lossy mount, and the power cut the moment the command has exited 0 with its report. After the
/// cut the mount must hold the copy under its final name and nothing else: no `copy.partial`
/// (the name the copy is written under; it is renamed into place only once checked, so after a
/// cut a user finding it beside no `copy.db` would not know whether to trust it), no journal, WAL
/// or `-shm` file of it. The copy must be byte for byte what the command left, pass `PRAGMA
/// integrity_check`, and hold exactly the processed events and orders the report counted, which
/// are those of the source.
///
/// What the harness can tell: without the directory sync after the rename, the cut undoes the
/// rename and leaves `copy.partial` and `copy.partial-journal` (SQLite synced the directory
/// once, after creating the journal), and no `copy.db`; this test fails on it. Without the sync
/// of the copy's file, it passes: SQLite's commit of the backup into `copy.partial` (rollback
/// journal, `synchronous=FULL`, its default) has already `fsync`ed that file, and nothing
/// writes to it afterwards (the integrity check only reads), so that later sync finds nothing
/// unsynced. It is there so as not to depend on how SQLite commits; under this model it is
/// redundant.
fn a_backup_reported_done_survives_a_power_cut_whole() {
    use serve::*;
    use std::process::Command;

    let mount = LossyMount::new().unwrap();
    let source = tempfile::tempdir().unwrap();
    let db = source.path().join("sekali.db");
    let mut server = Server::start(source.path(), &source.path().join("server.log"), &[], &[]);
    let acked = Acknowledged::default();
    let agent = ureq::AgentBuilder::new().build();
    for request in &workload("backup", 20) {
        assert!(send(&agent, server.port, request, &acked));
    }
    server.stop();
    drop(server);
    // What the source holds, stopped: what the copy must hold.
    let (events, orders) = {
        let conn = Connection::open(&db).unwrap();
        let ids = |sql: &str| -> Vec<String> {
            let mut stmt = conn.prepare(sql).unwrap();
            let rows = stmt.query_map([], |r| r.get(0)).unwrap();
            rows.map(Result::unwrap).collect()
        };
        (
            ids("SELECT event_id FROM processed_events ORDER BY event_id"),
            ids("SELECT order_id || ' ' || status FROM orders ORDER BY order_id"),
        )
    };
    assert_eq!(
        (events.len(), orders.len()),
        (80, 40),
        "the source's content"
    );

    let out = mount.path().join("copy.db");
    let backup = Command::new(binary())
        .args(["backup", "--db"])
        .arg(&db)
        .arg(&out)
        .output()
        .unwrap();
    assert!(backup.status.success(), "{backup:?}");
    let stdout = String::from_utf8(backup.stdout).unwrap();
    // "backed up DB to OUT: P pages, E processed events, O orders, integrity ok"
    let counted = |what: &str| -> i64 {
        let before = stdout.split(what).next().unwrap();
        let number = before.trim_end().rsplit(' ').next().unwrap();
        number
            .parse()
            .unwrap_or_else(|_| panic!("no count of {what} in the report: {stdout}"))
    };
    let (pages, reported_events, reported_orders) = (
        counted(" pages,"),
        counted(" processed events,"),
        counted(" orders, integrity ok"),
    );
    assert_eq!(
        (reported_events, reported_orders),
        (events.len() as i64, orders.len() as i64),
        "the report counts the source's rows: {stdout}"
    );
    let written = fs::read(&out).unwrap();
    let requests = mount.counters();

    // Reported: the power goes now. (The kernel's last requests for the exited process may
    // still be in flight; they make nothing durable.)
    std::thread::sleep(Duration::from_millis(50));
    let cut = mount.cut();
    let mut left: Vec<String> = fs::read_dir(mount.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert!(
        out.exists(),
        "the backup reported done ({}) is gone after the power cut: the mount holds {left:?}; {cut:?}",
        stdout.trim_end()
    );
    assert_eq!(
        left,
        ["copy.db"],
        "after the cut, only the copy under its final name: no .partial, journal, WAL or -shm file"
    );
    let survived = fs::read(&out).unwrap();
    assert!(
        survived == written,
        "the copy's bytes changed at the cut: {} bytes before, {} after; {cut:?}",
        written.len(),
        survived.len()
    );

    let copy = Connection::open(&out).unwrap();
    let check: String = copy
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok", "the copy after the cut");
    let count = |sql: &str| -> i64 { copy.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(count("PRAGMA page_count"), pages, "pages reported");
    assert_eq!(
        count("SELECT count(*) FROM processed_events"),
        reported_events,
        "processed events reported"
    );
    assert_eq!(
        count("SELECT count(*) FROM orders"),
        reported_orders,
        "orders reported"
    );
    let ids = |sql: &str| -> Vec<String> {
        let mut stmt = copy.prepare(sql).unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    };
    assert_eq!(
        ids("SELECT event_id FROM processed_events ORDER BY event_id"),
        events
    );
    assert_eq!(
        ids("SELECT order_id || ' ' || status FROM orders ORDER BY order_id"),
        orders
    );
    eprintln!(
        "backup of {} pages ({} bytes), {reported_events} processed events and {reported_orders} orders: \
         whole after the cut ({cut:?}); requests to the mount: {} writes, {} fsyncs, {} fsyncdirs, {} renames",
        pages,
        written.len(),
        requests.writes,
        requests.fsyncs,
        requests.fsyncdirs,
        requests.ops.get("rename").copied().unwrap_or(0)
    );
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL with its data directory on the lossy mount.

/// A PostgreSQL cluster whose data directory is on a [`LossyMount`]; its socket, log and pid
/// file are off the mount, in a directory of their own. The rule for finding the server
/// binaries, and for skipping, is that of tests/support/postgres.rs (whose `Cluster` keeps its
/// data directory in a temporary directory of its own); as root, `initdb` and the server run as
/// the `postgres` user. The power cut here is [`pg::Cluster::kill`] (SIGKILL to the postmaster
/// and every process it started), then [`LossyMount::cut`].
mod pg {
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    use std::path::PathBuf;
    use std::process::{Command, Output, Stdio};
    use std::time::{Duration, Instant};

    use super::lossyfs::LossyMount;

    /// The server binaries, or `None` after printing the skip note when PostgreSQL is not
    /// installed (a panic with `SEKALI_REQUIRE_POSTGRES=1`).
    pub fn bindir_or_skip() -> Option<PathBuf> {
        let bin = super::helpers::pg_cluster::bindir_or_skip();
        if bin.is_none() {
            eprintln!("{}", super::helpers::pg_cluster::skip_note());
        }
        bin
    }

    /// `s` quoted for `sh`.
    fn sh_quote(s: impl AsRef<std::ffi::OsStr>) -> String {
        format!("'{}'", s.as_ref().to_string_lossy().replace('\'', r"'\''"))
    }

    /// Whether process `pid` has ended (gone, or a zombie nobody has reaped yet).
    fn has_ended(pid: i32) -> bool {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return true;
        };
        stat.rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X")
    }

    /// The processes whose parent is `pid`.
    fn children_of(pid: i32) -> Vec<i32> {
        let parent = |p: i32| -> Option<i32> {
            let stat = fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            stat.rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        };
        fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&p| parent(p) == Some(pid))
            .collect()
    }

    fn signal(pid: i32, signal: rustix::process::Signal) {
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }

    pub struct Cluster {
        bin: PathBuf,
        /// The data directory, on the mount.
        data: PathBuf,
        /// Off the mount: the socket, the log (`log`) and the postmaster's pid
        /// (`postmaster.pid`, PostgreSQL's `external_pid_file`).
        outside: tempfile::TempDir,
        port: u16,
        /// `-c name=value` settings for the server, beyond fsync and synchronous commit on.
        settings: Vec<String>,
        /// Whether we are root, so that the server programs run as the `postgres` user.
        as_postgres: bool,
        /// The postmaster [`kill`](Self::kill) killed last, until the next start.
        killed: std::cell::Cell<Option<i32>>,
    }

    impl Cluster {
        /// Creates a cluster with its data directory `data` in the mount (made and synced
        /// there first, as one provisions a disk: `initdb` syncs what it writes inside the
        /// directory, not the directory's own name), with `settings` (`name=value`) for its
        /// server. It is not started.
        pub fn init_on(mount: &LossyMount, bin: PathBuf, settings: &[&str]) -> Cluster {
            // A short path: the path of a Unix socket is limited to about 107 bytes.
            let outside = tempfile::TempDir::with_prefix_in("skpc", "/tmp").unwrap();
            let as_postgres = outside.path().metadata().unwrap().uid() == 0;
            let cluster = Cluster {
                bin,
                data: mount.path().join("data"),
                outside,
                port: 0,
                settings: settings.iter().map(|s| s.to_string()).collect(),
                as_postgres,
                killed: Default::default(),
            };
            fs::create_dir(&cluster.data).unwrap();
            fs::set_permissions(&cluster.data, fs::Permissions::from_mode(0o700)).unwrap();
            if as_postgres {
                let user = Command::new("id").args(["-u", "postgres"]).output();
                assert!(
                    user.is_ok_and(|o| o.status.success()),
                    "the tests run as root, and PostgreSQL refuses root, but there is no \
                     `postgres` user to run it as: `apt-get install postgresql` creates one"
                );
                for path in [mount.path(), &cluster.data, cluster.outside.path()] {
                    cluster.run(Command::new("chown").arg("postgres:").arg(path));
                }
            }
            super::sync_dir(mount.path());
            // With its sync of the data directory (no --no-sync): what it wrote is durable.
            let mut initdb = cluster.server_cmd("initdb");
            let options = "-A trust -U postgres -E UTF8 --locale=C -D";
            cluster.run(initdb.args(options.split(' ')).arg(&cluster.data));
            cluster.spawn_watchdog();
            cluster
        }

        /// Starts the server (after a kill and a cut: crash recovery), on the same port each
        /// time, and waits until it accepts connections.
        pub fn start(&mut self) {
            if self.port == 0 {
                self.port = super::helpers::free_port();
            }
            self.forget_the_killed();
            let mut options = format!(
                "-k {} -p {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on \
                 -c full_page_writes=on -c external_pid_file={}",
                sh_quote(self.outside.path()),
                self.port,
                sh_quote(self.outside.path().join("postmaster.pid")),
            );
            for setting in &self.settings {
                options.push_str(&format!(" -c {}", sh_quote(setting)));
            }
            let mut pg_ctl = self.server_cmd("pg_ctl");
            pg_ctl
                .args(["start", "-w", "-t", "120", "-D"])
                .arg(&self.data);
            pg_ctl.arg("-l").arg(self.outside.path().join("log"));
            self.run(pg_ctl.arg("-o").arg(options));
        }

        /// The power goes, for the server: SIGKILL to the postmaster and every process it
        /// started (stopped first, so that it starts no more), and waits until they have all
        /// ended. Then the kernel's last requests for them may still be in flight to the
        /// filesystem; they make nothing durable. Returns how many processes were killed.
        pub fn kill(&self) -> usize {
            let Some(postmaster) = self.postmaster() else {
                return 0;
            };
            // Line 7 of the lock file: the key and id of the postmaster's System V segment.
            let lockfile = fs::read_to_string(self.data.join("postmaster.pid")).unwrap_or_default();
            let shmid = lockfile
                .lines()
                .nth(6)
                .and_then(|l| l.split_whitespace().nth(1));
            let shmid = shmid.map(str::to_owned);
            signal(postmaster, rustix::process::Signal::STOP);
            let mut killed = children_of(postmaster);
            killed.push(postmaster);
            for &pid in &killed {
                signal(pid, rustix::process::Signal::KILL);
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while !killed.iter().all(|&pid| has_ended(pid)) {
                assert!(
                    Instant::now() < deadline,
                    "a killed server process lives on"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(50));
            // The next server removes it only if it finds the lock file, which the cut may take.
            if let Some(shmid) = shmid {
                let _ = Command::new("ipcrm").args(["-m", &shmid]).output();
            }
            self.killed.set(Some(postmaster));
            let _ = fs::remove_file(self.outside.path().join("postmaster.pid"));
            killed.len()
        }

        /// Before a start after [`kill`](Self::kill) and the cut: a killed postmaster not yet
        /// reaped (a zombie, until the container's init gets to it) still "exists" for the next
        /// server, which would take its lock files for those of a running server and refuse to
        /// start. Removed after the cut, as the cut would have brought them back.
        fn forget_the_killed(&self) {
            if let Some(pid) = self.killed.take() {
                if fs::metadata(format!("/proc/{pid}")).is_ok() {
                    let socket_lock = format!(".s.PGSQL.{}.lock", self.port);
                    let _ = fs::remove_file(self.data.join("postmaster.pid"));
                    let _ = fs::remove_file(self.outside.path().join(socket_lock));
                }
            }
        }

        /// The running postmaster's pid, from the pid file off the mount, if that process is
        /// still a postmaster of this data directory.
        fn postmaster(&self) -> Option<i32> {
            let pidfile = fs::read_to_string(self.outside.path().join("postmaster.pid")).ok()?;
            let pid = pidfile.lines().next()?.trim().parse().ok()?;
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let data = self.data.as_os_str().as_encoded_bytes();
            let ours = cmdline.split(|&b| b == 0).any(|arg| arg == data);
            (ours && !has_ended(pid)).then_some(pid)
        }

        /// A new connection to `database`, over TCP.
        pub fn connect(&self, database: &str) -> postgres::Client {
            let params = format!(
                "host=127.0.0.1 port={} user=postgres dbname={database} connect_timeout=10",
                self.port
            );
            postgres::Client::connect(&params, postgres::NoTls)
                .unwrap_or_else(|e| panic!("connect to {database}: {e}\n{}", self.log_tail()))
        }

        /// `postgres://postgres@127.0.0.1:PORT/DATABASE`.
        pub fn url(&self, database: &str) -> String {
            format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
        }

        /// The last 40 lines of the server's log.
        pub fn log_tail(&self) -> String {
            let log = fs::read_to_string(self.outside.path().join("log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        }

        /// The server's log lines of warnings and worse, but for the `FATAL`s of connections
        /// refused while it starts (and their details), at most 20.
        pub fn complaints(&self) -> Vec<String> {
            let log = fs::read_to_string(self.outside.path().join("log")).unwrap_or_default();
            let starting = ["is starting up", "not yet accepting connections"];
            let mut lines = log.lines().peekable();
            let mut found = Vec::new();
            while let Some(line) = lines.next() {
                if line.contains("FATAL:") && starting.iter().any(|s| line.contains(s)) {
                    lines.next_if(|l| l.contains("DETAIL:"));
                    continue;
                }
                let worse = ["WARNING:", "ERROR:", "FATAL:", "PANIC:"];
                if worse.iter().any(|w| line.contains(w)) && found.len() < 20 {
                    found.push(line.to_owned());
                }
            }
            found
        }

        /// The server's log lines that contain `what`.
        pub fn log_lines(&self, what: &str) -> Vec<String> {
            let log = fs::read_to_string(self.outside.path().join("log")).unwrap_or_default();
            log.lines()
                .filter(|l| l.contains(what))
                .map(str::to_owned)
                .collect()
        }

        /// A server program, as the postgres user when we are root, without the caller's
        /// `PG*` variables, from a directory that user can enter.
        fn server_cmd(&self, program: &str) -> Command {
            let program = self.bin.join(program);
            let mut cmd = if self.as_postgres {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", "postgres", "--"]).arg(program);
                cmd
            } else {
                Command::new(program)
            };
            for (key, _) in
                std::env::vars_os().filter(|(k, _)| k.to_string_lossy().starts_with("PG"))
            {
                cmd.env_remove(key);
            }
            cmd.current_dir(self.outside.path()).stdin(Stdio::null());
            cmd
        }

        fn run(&self, cmd: &mut Command) -> Output {
            let what = format!("{cmd:?}");
            let out = cmd
                .output()
                .unwrap_or_else(|e| panic!("could not run {what}: {e}"));
            assert!(
                out.status.success(),
                "{what} failed ({})\n--- stdout\n{}--- stderr\n{}--- the server's log\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log_tail()
            );
            out
        }

        /// A shell that, once this process has exited without dropping the cluster (its
        /// directory off the mount still there), kills the postmaster and deletes that
        /// directory; its backends end on their postmaster's death. In a process group of its
        /// own, so that a Ctrl-C aimed at the tests does not kill it.
        fn spawn_watchdog(&self) {
            let dir = sh_quote(self.outside.path());
            let pidfile = sh_quote(self.outside.path().join("postmaster.pid"));
            let script = format!(
                "(while kill -0 {pid} 2>/dev/null && [ -d {dir} ]; do sleep 1; done; \
                 if [ -d {dir} ]; then kill -KILL $(head -n 1 {pidfile}) 2>/dev/null; \
                 rm -rf {dir}; fi) &",
                pid = std::process::id()
            );
            let mut cmd = Command::new("sh");
            cmd.args(["-c", &script]).process_group(0);
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
            self.run(&mut cmd);
        }
    }

    impl Drop for Cluster {
        /// Kills the server (the data is thrown away with the mount, dropped next).
        fn drop(&mut self) {
            self.kill();
        }
    }
}

/// Transactions (of `ROWS_PER_COMMIT` rows each) of the PostgreSQL tests.
const PG_COMMITS: i64 = 300;

/// Commits `PG_COMMITS` transactions one by one, each acknowledged when its COMMIT returns, on a
/// PostgreSQL server (fsync on) whose data directory is on a lossy mount, with `SET
/// synchronous_commit = {synchronous_commit}` in the session (the table is created before, with
/// the default, on); then at once the power cut: SIGKILL to every server process, then the
/// cut. Then the server starts again on what the cut left (crash recovery). Returns the rows
/// acknowledged and the rows found, which must be a prefix of the commits; `None` without
/// PostgreSQL (after the skip note).
fn pg_commit_then_cut(synchronous_commit: &str, settings: &[&str]) -> Option<(i64, i64)> {
    use std::time::Instant;

    let bin = pg::bindir_or_skip()?;
    let mount = LossyMount::new_for_all().unwrap();
    let mut cluster = pg::Cluster::init_on(&mount, bin, settings);
    cluster.start();
    let mut client = cluster.connect("postgres");
    client
        .batch_execute("CREATE TABLE t (id bigint PRIMARY KEY, body text NOT NULL)")
        .unwrap();
    client
        .batch_execute(&format!("SET synchronous_commit = {synchronous_commit}"))
        .unwrap();
    let insert = client
        .prepare("INSERT INTO t (id, body) VALUES ($1, $2)")
        .unwrap();
    let before = mount.counters();
    let started = Instant::now();
    let mut acknowledged = 0;
    for n in 1..=PG_COMMITS {
        let mut tx = client.transaction().unwrap();
        for id in (n - 1) * ROWS_PER_COMMIT + 1..=n * ROWS_PER_COMMIT {
            let body = format!("{id:08}").repeat(64);
            tx.execute(&insert, &[&id, &body]).unwrap();
        }
        tx.commit().unwrap();
        acknowledged = n * ROWS_PER_COMMIT; // COMMIT returned: the rows are acknowledged
    }
    let committing = started.elapsed();
    let killed = cluster.kill();
    drop(client);
    let during = mount.counters();
    let report = mount.cut();
    let recovering = Instant::now();
    cluster.start();
    let recovery = recovering.elapsed();
    let row = cluster
        .connect("postgres")
        .query_one("SELECT count(*), coalesce(max(id), 0) FROM t", &[])
        .unwrap();
    let (found, max): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(found, max, "the rows are not a prefix of the commits");
    eprintln!(
        "PostgreSQL, synchronous_commit={synchronous_commit} {settings:?}: {acknowledged} rows \
         acknowledged in {} commits ({committing:.2?}, {} fsyncs), {killed} processes killed; \
         {found} found after crash recovery ({recovery:.2?}); {report:?}; {:?}; the server's \
         warnings and errors: {:?}",
        PG_COMMITS,
        during.fsyncs - before.fsyncs,
        cluster.log_lines("redo done"),
        cluster.complaints()
    );
    Some((acknowledged, found))
}

/// PostgreSQL with fsync on and `synchronous_commit = on` (its defaults, as sekali runs it):
/// every acknowledged commit survives the cut.
fn postgres_with_synchronous_commit_on_keeps_every_acknowledged_commit_at_a_cut() {
    let Some((acknowledged, found)) = pg_commit_then_cut("on", &[]) else {
        return;
    };
    assert_eq!(acknowledged, PG_COMMITS * ROWS_PER_COMMIT);
    assert_eq!(found, acknowledged, "acknowledged commits lost at the cut");
}

/// The control: with `synchronous_commit = off` a COMMIT returns before its WAL is flushed (the
/// WAL writer flushes it later), so commits acknowledged just before the cut are lost. The
/// harness must see that, or the test above proves nothing.
///
/// The WAL writer flushes every `wal_writer_delay` (200 ms) and whenever `wal_writer_flush_after`
/// (1 MB) is waiting: the 300 commits take some 150 ms here, and the cut comes within a
/// millisecond or two of the last, so with the defaults nearly all are lost too, unless a flush
/// happens to fall in that millisecond. So that it cannot, the WAL writer here waits 10 s and
/// 1 GB: only what its first flush (early in the run: it starts out hibernating, and the first
/// commits wake it) covers is durable.
fn postgres_with_synchronous_commit_off_loses_acknowledged_commits_at_a_cut() {
    let settings = ["wal_writer_delay=10s", "wal_writer_flush_after=1GB"];
    let Some((acknowledged, found)) = pg_commit_then_cut("off", &settings) else {
        return;
    };
    assert!(
        found < acknowledged,
        "{acknowledged} acknowledged rows all survived the cut"
    );
}

/// `sekali serve --db postgres://...` (off the mount) on a PostgreSQL server whose data
/// directory is on the lossy mount, under a load of signed Stripe deliveries from 4 senders,
/// while the power goes 3 times for the database server: SIGKILL to its processes, the cut,
/// and a restart on what the cut left (crash recovery). sekali is not restarted: it answers
/// 503 while the database is gone and serves again once it is back. After each restart, every
/// delivery acknowledged so far (200, `processed` or `duplicate`) is in `processed_events`;
/// at the end, each delivery not acknowledged, sent again, is applied once: one processed
/// event, one paid order, one order change and one receipt per event sent.
///
/// The mount keeps the names of what is `fsync`ed (`lossyfs::Options::fsync_keeps_names`), as
/// ext4, XFS and btrfs do and PostgreSQL counts on: it never syncs the directory that names a
/// new relation file, nor the `base/` directory that names a new database's directory
/// (`CREATE DATABASE` syncs the new directory and its `PG_VERSION`, not `base/`). Under the
/// strict model such names are lost at the first cut, and crash recovery creates them again
/// from the WAL, but still without a sync of their directories; its end-of-recovery
/// checkpoint then moves the redo point past their creation, so the second cut loses them for
/// good: PostgreSQL 15 then refuses every connection to the database, `"base/16384" is not a
/// valid data directory`, `File "base/16384/PG_VERSION" is missing`. That is the filesystem
/// model, stricter than the filesystems PostgreSQL supports, not sekali.
fn power_cuts_under_load_on_postgres_lose_no_acknowledged_delivery() {
    use std::collections::{BTreeMap, HashSet};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Instant;

    const EVENTS: usize = 20_000; // more than are sent
    const CUTS: usize = 3;
    /// Acknowledgements between two cuts, and after the last.
    const ACKS_PER_PHASE: usize = 200;

    /// Sets the flag when dropped, also on a panic: the senders stop.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    let event_id = |i: usize| format!("evt_cut_{i:02}");
    let stored_events = |cluster: &pg::Cluster| -> HashSet<String> {
        let rows = cluster
            .connect("sekali")
            .query("SELECT event_id FROM processed_events", &[])
            .unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    };

    let Some(bin) = pg::bindir_or_skip() else {
        return;
    };
    let mount = LossyMount::with(lossyfs::Options {
        all_users: true,
        fsync_keeps_names: true,
    })
    .unwrap();
    let mut cluster = pg::Cluster::init_on(&mount, bin, &[]);
    cluster.start();
    cluster
        .connect("postgres")
        .batch_execute("CREATE DATABASE sekali")
        .unwrap();
    let url = cluster.url("sekali");
    let server = helpers::ServeProcess::start_on(
        Some(Path::new(&url)),
        helpers::PROVIDER_ENV,
        "warn",
        &["--no-relay"],
    );
    let agent = || {
        ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .build()
    };
    let bodies = helpers::distinct_succeeded_bodies("cut", EVENTS);
    // Each event acknowledged, with its answer's status; each sent but not acknowledged.
    let acked = Mutex::new(BTreeMap::<usize, String>::new());
    let refused = Mutex::new(Vec::<usize>::new());
    let answers = Mutex::new(BTreeMap::<u16, usize>::new());
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let mut cuts = Vec::new(); // per cut: (acknowledged before, report, restart, back to service)
    let mut failures = Vec::new();
    let started = Instant::now();
    std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        for _ in 0..4 {
            scope.spawn(|| {
                let agent = agent();
                while !stop.load(Ordering::SeqCst) {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(body) = bodies.get(i) else { return };
                    let (status, outcome) = helpers::deliver_stripe(&agent, server.port, body);
                    *answers.lock().unwrap().entry(status).or_default() += 1;
                    if status == 200 {
                        assert!(
                            outcome == "processed" || outcome == "duplicate",
                            "{}: 200 {outcome}",
                            event_id(i)
                        );
                        acked.lock().unwrap().insert(i, outcome);
                    } else {
                        refused.lock().unwrap().push(i);
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            });
        }
        let wait_for_acks = |from: usize| {
            let deadline = Instant::now() + Duration::from_secs(120);
            while acked.lock().unwrap().len() < from + ACKS_PER_PHASE {
                assert!(
                    Instant::now() < deadline,
                    "fewer than {ACKS_PER_PHASE} acknowledgements in 120 s after {from}; \
                     answers {:?}\n{}",
                    answers.lock().unwrap(),
                    server.logs_so_far()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let mut phase_start = 0;
        for k in 1..=CUTS {
            wait_for_acks(phase_start);
            let acked_before = acked.lock().unwrap().len();
            cluster.kill();
            let report = mount.cut();
            let restarting = Instant::now();
            cluster.start();
            let restart = restarting.elapsed();
            // Every acknowledgement so far: from before the kill, or from the restarted server.
            let snapshot: Vec<usize> = acked.lock().unwrap().keys().copied().collect();
            let stored = stored_events(&cluster);
            let missing: Vec<String> = snapshot
                .iter()
                .map(|&i| event_id(i))
                .filter(|id| !stored.contains(id))
                .collect();
            if !missing.is_empty() {
                failures.push(format!(
                    "cut {k}: {} of {} acknowledged events are not in processed_events: {:?}",
                    missing.len(),
                    snapshot.len(),
                    &missing[..missing.len().min(10)]
                ));
                return;
            }
            phase_start = acked.lock().unwrap().len();
            let back = Instant::now();
            let deadline = back + Duration::from_secs(60);
            while acked.lock().unwrap().len() == phase_start {
                assert!(
                    Instant::now() < deadline,
                    "cut {k}: sekali did not serve again within 60 s of the database's restart\n{}",
                    server.logs_so_far()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            cuts.push((acked_before, report, restart, back.elapsed()));
        }
        wait_for_acks(phase_start);
    });
    assert!(failures.is_empty(), "{failures:?}");
    let load = started.elapsed();

    // Every acknowledged event is stored.
    let acked = acked.into_inner().unwrap();
    let stored = stored_events(&cluster);
    let lost: Vec<String> = acked
        .keys()
        .map(|&i| event_id(i))
        .filter(|id| !stored.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged, then lost to a cut: {lost:?}"
    );
    // The rest, sent again until acknowledged: `duplicate` for those committed before their
    // answer was lost.
    let refused = refused.into_inner().unwrap();
    let agent = agent();
    let mut committed_unanswered = 0;
    for &i in &refused {
        let mut tries = 0;
        let (status, outcome) = loop {
            let (status, outcome) = helpers::deliver_stripe(&agent, server.port, &bodies[i]);
            if status == 200 || tries == 100 {
                break (status, outcome);
            }
            tries += 1;
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(status, 200, "{}: {outcome}", event_id(i));
        match outcome.as_str() {
            "processed" => {}
            "duplicate" => committed_unanswered += 1,
            other => panic!("{}: {other}", event_id(i)),
        }
    }
    let sent = acked.len() + refused.len();
    let mut client = cluster.connect("sekali");
    let mut count = |sql: &str| -> usize {
        let n: i64 = client.query_one(sql, &[]).unwrap().get(0);
        n as usize
    };
    let counts = [
        count("SELECT count(*) FROM processed_events WHERE event_id LIKE 'evt\\_cut\\_%'"),
        count(
            "SELECT count(*) FROM orders WHERE order_id LIKE 'ord\\_cut\\_%' AND status = 'paid'",
        ),
        count("SELECT count(*) FROM order_transitions WHERE order_id LIKE 'ord\\_cut\\_%'"),
        count("SELECT count(*) FROM email_outbox WHERE order_id LIKE 'ord\\_cut\\_%'"),
    ];
    assert_eq!(
        counts, [sent; 4],
        "processed events, paid orders, order changes and receipts for {sent} events sent"
    );
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");
    let summary: Vec<String> = cuts
        .iter()
        .enumerate()
        .map(|(k, (before, report, restart, back))| {
            format!(
                "cut {}: after {before} acknowledged, {} bytes dropped, {} entries reverted, \
                 {} inodes forgotten; database back in {restart:.2?}, sekali serving {back:.2?} later",
                k + 1,
                report.bytes_dropped,
                report.entries_reverted,
                report.inodes_forgotten
            )
        })
        .collect();
    eprintln!(
        "sekali on PostgreSQL under {CUTS} power cuts ({load:.2?}): {} deliveries acknowledged, 0 lost; \
         {} refused (answers {:?}), sent again and applied once ({committed_unanswered} had \
         committed: duplicate); {sent} events, each applied once\n  {}\n  the database \
         server's warnings and errors: {:?}",
        acked.len(),
        refused.len(),
        answers.into_inner().unwrap(),
        summary.join("\n  "),
        cluster.complaints()
    );
}
