//! A private PostgreSQL server for the tests: its own data directory, port and socket, thrown away
//! at the end. Include it with `#[path = "../support/postgres.rs"] mod postgres;`.
//!
//! The server binaries are `$SEKALI_PG_BIN` if set, else `pg_config --bindir`, else the newest
//! `/usr/lib/postgresql/*/bin`. Without them [`Cluster::start`] and [`shared`] return `None` and
//! the caller prints [`skip_note`]; with `SEKALI_REQUIRE_POSTGRES=1` (CI) they panic instead.
//! As root, `initdb` and the server run as the `postgres` user (through `runuser`), since
//! PostgreSQL refuses to run as root. The server runs with fsync and synchronous commit on, as in
//! production; only `initdb` skips its fsync. A failed command panics with its exit status, its
//! output and the tail of the server's log.
//!
//! For failover tests: [`Cluster::start_primary`], its synchronous streaming replica
//! [`Cluster::start_standby`], [`Cluster::promote`] and [`Cluster::multi_host_url`].
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// One running PostgreSQL server. Dropping it stops the server and deletes its directory.
pub struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    data: PathBuf,
    socket_dir: PathBuf,
    log: PathBuf,
    port: u16,
    /// Whether server commands run through `runuser -u postgres --` (we are root).
    as_postgres: bool,
}

/// The line to print when PostgreSQL is not installed and its half of the tests is skipped.
pub fn skip_note() -> &'static str {
    "note: the PostgreSQL tests were skipped: no PostgreSQL server found ($SEKALI_PG_BIN, \
     `pg_config --bindir`, /usr/lib/postgresql/*/bin). To run them: `apt-get install postgresql`, \
     or run .ci/test"
}

/// The cluster shared by all the tests of this test binary, started on first use; each test takes
/// a database of its own with [`Cluster::fresh_database`]. Statics are never dropped, so its
/// watchdog stops it and deletes its directory once the test process has exited.
pub fn shared() -> Option<&'static Cluster> {
    static SHARED: OnceLock<Option<Cluster>> = OnceLock::new();
    SHARED.get_or_init(Cluster::start).as_ref()
}

/// The directory holding `initdb`, `pg_ctl`, `postgres` and `psql`, if there is one.
pub fn find_bindir() -> Option<PathBuf> {
    const PROGRAMS: [&str; 4] = ["initdb", "pg_ctl", "postgres", "psql"];
    let complete = |dir: &Path| PROGRAMS.iter().all(|p| dir.join(p).is_file());
    if let Some(dir) = std::env::var_os("SEKALI_PG_BIN").map(PathBuf::from) {
        let shown = dir.display();
        assert!(
            complete(&dir),
            "SEKALI_PG_BIN={shown} lacks initdb, pg_ctl, postgres or psql"
        );
        return Some(dir);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && complete(&dir) {
            return Some(dir);
        }
    }
    // Debian's layout: /usr/lib/postgresql/<major>/bin, the highest major first.
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, dir)| complete(dir))
        .collect();
    found.sort();
    found.pop().map(|(_, dir)| dir)
}

/// [`find_bindir`], or `None` when PostgreSQL is not installed (a panic if it is required).
pub fn bindir_or_skip() -> Option<PathBuf> {
    let bin = find_bindir();
    let required = std::env::var("SEKALI_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
    assert!(
        bin.is_some() || !required,
        "SEKALI_REQUIRE_POSTGRES=1, but no PostgreSQL server was found ($SEKALI_PG_BIN, \
         `pg_config --bindir`, /usr/lib/postgresql/*/bin): `apt-get install postgresql`"
    );
    bin
}

/// `s` quoted for `sh`.
fn sh_quote(s: impl AsRef<std::ffi::OsStr>) -> String {
    format!("'{}'", s.as_ref().to_string_lossy().replace('\'', r"'\''"))
}

impl Cluster {
    /// Creates and starts a new cluster; `None` (printing nothing) if PostgreSQL is not installed.
    pub fn start() -> Option<Cluster> {
        let mut pg = Cluster::create(bindir_or_skip()?);
        pg.initdb();
        pg.start_server();
        pg.spawn_watchdog();
        Some(pg)
    }

    /// Like [`start`](Self::start), but ready to be the primary of a streaming replica
    /// ([`start_standby`](Self::start_standby)): `wal_level = replica`, WAL senders, hot standby
    /// (the standby copies these settings). `initdb -A trust` already lets user postgres connect
    /// for replication over the socket and from 127.0.0.1 (`local|host replication all trust`).
    pub fn start_primary() -> Option<Cluster> {
        let mut pg = Cluster::create(bindir_or_skip()?);
        pg.initdb();
        pg.append_conf(
            "postgresql.conf",
            "\n# Streaming replication (tests/support/postgres.rs, Cluster::start_primary)\n\
             wal_level = replica\nmax_wal_senders = 10\nmax_replication_slots = 10\n\
             hot_standby = on\n",
        );
        pg.start_server();
        pg.spawn_watchdog();
        Some(pg)
    }

    /// Like [`start`](Self::start), with TLS: `ssl = on` with the server certificate
    /// `cert_pem` and its key `key_pem` (the key readable by the server's user only, as
    /// PostgreSQL demands). Connections over TCP may then use TLS; the socket stays plain.
    pub fn start_with_tls(cert_pem: &str, key_pem: &str) -> Option<Cluster> {
        use std::os::unix::fs::PermissionsExt;
        let mut pg = Cluster::create(bindir_or_skip()?);
        pg.initdb();
        let (cert, key) = (pg.data.join("server.crt"), pg.data.join("server.key"));
        fs::write(&cert, cert_pem).expect("write the server certificate");
        fs::write(&key, key_pem).expect("write the server key");
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).expect("chmod the key");
        if pg.as_postgres {
            pg.run(Command::new("chown").arg("postgres:").arg(&cert).arg(&key));
        }
        pg.append_conf(
            "postgresql.conf",
            "\n# TLS (tests/support/postgres.rs, Cluster::start_with_tls)\n\
             ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
        );
        pg.start_server();
        pg.spawn_watchdog();
        Some(pg)
    }

    /// A streaming replica of this primary (from [`start_primary`](Self::start_primary)), made
    /// synchronous: it returns once the primary's `pg_stat_replication` shows `standby1` as
    /// `sync`, so from then on every commit on the primary (synchronous_commit = on) waits until
    /// the standby has flushed it. The standby has its own directory, port, socket and watchdog.
    /// One standby per primary (its `application_name` is `standby1`). While it is the
    /// synchronous standby, commits on the primary hang if the standby is gone: kill or drop the
    /// primary first (or [`promote`](Self::promote) the standby).
    pub fn start_standby(&self) -> Cluster {
        let mut sb = Cluster::create(self.bin.clone());
        // Over TCP, as a standby on another machine would; -R writes primary_conninfo and
        // standby.signal, -X stream copies the WAL written during the backup.
        let mut backup = sb.server_cmd("pg_basebackup");
        backup.arg("-D").arg(&sb.data);
        let port = self.port.to_string();
        backup.args([
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "-h",
            "127.0.0.1",
            "-p",
            &port,
        ]);
        self.run(backup.args(["-U", "postgres"]));
        let auto_conf = sb.data.join("postgresql.auto.conf");
        let conf = fs::read_to_string(&auto_conf).expect("read the standby's postgresql.auto.conf");
        let mut named = false;
        let lines: Vec<String> = conf
            .lines()
            // A copy of the primary's own setting would make the standby, once promoted, wait
            // for a synchronous standby of its own.
            .filter(|l| !l.trim_start().starts_with("synchronous_standby_names"))
            .map(|l| match l.strip_prefix("primary_conninfo = '") {
                Some(rest) if rest.ends_with('\'') => {
                    named = true;
                    let rest = &rest[..rest.len() - 1];
                    format!("primary_conninfo = '{rest} application_name=standby1'")
                }
                _ => l.to_string(),
            })
            .collect();
        assert!(named, "pg_basebackup -R wrote no primary_conninfo:\n{conf}");
        fs::write(&auto_conf, lines.join("\n") + "\n").expect("write postgresql.auto.conf");
        sb.start_server();
        sb.spawn_watchdog();
        let streaming = "SELECT status FROM pg_stat_wal_receiver";
        sb.wait_until(
            streaming,
            "streaming",
            "the standby to stream from the primary",
        );
        self.psql(
            "postgres",
            "ALTER SYSTEM SET synchronous_standby_names = 'standby1'",
        );
        self.psql("postgres", "SELECT pg_reload_conf()");
        let sync = "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'";
        self.wait_until(
            sync,
            "sync",
            "the primary to take standby1 as its synchronous standby",
        );
        sb
    }

    /// Promotes this standby to a primary (`pg_ctl promote`) and waits until it accepts writes.
    pub fn promote(&self) {
        let mut promote = self.server_cmd("pg_ctl");
        self.run(promote.args(["promote", "-w", "-D"]).arg(&self.data));
        let recovery = "SELECT pg_is_in_recovery()";
        self.wait_until(recovery, "f", "the promoted standby to leave recovery");
    }

    /// `postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/DATABASE?target_session_attrs=read-write&
    /// connect_timeout=2`: libpq and tokio-postgres try the hosts in turn (each connection
    /// attempt limited to 2 seconds) and keep the first that accepts writes.
    pub fn multi_host_url(primary: &Cluster, standby: &Cluster, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{database}\
             ?target_session_attrs=read-write&connect_timeout=2",
            primary.port, standby.port
        )
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`, over TCP.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The same database over the Unix socket: the host is the socket directory, percent-encoded.
    pub fn socket_url(&self, database: &str) -> String {
        let path = self.socket_dir.to_str().expect("a UTF-8 socket path");
        let plain = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
        let encode = |b: u8| {
            if plain(b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        };
        let host: String = path.bytes().map(encode).collect();
        format!("postgres://postgres@{host}:{}/{database}", self.port)
    }

    /// Creates an empty database `name`.
    pub fn create_database(&self, name: &str) {
        let quoted = name.replace('"', "\"\"");
        self.psql("postgres", &format!("CREATE DATABASE \"{quoted}\""));
    }

    /// Creates a database that no other test of this process uses, and returns its name.
    pub fn fresh_database(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("t_{}_{n}", std::process::id());
        self.create_database(&name);
        name
    }

    /// Runs `sql` in `database` with psql, over the socket, and returns its output: one row a
    /// line, columns separated by `|`, no headers. Panics if a statement fails.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let mut cmd = self.command(self.bin.join("psql"));
        let port = self.port.to_string();
        cmd.args(["-XAtq", "-v", "ON_ERROR_STOP=1", "-U", "postgres"]);
        cmd.args(["-p", &port, "-h"]).arg(&self.socket_dir);
        cmd.args(["-d", database, "-c", sql]);
        let out = self.run(&mut cmd).stdout;
        String::from_utf8_lossy(&out).trim_end().to_string()
    }

    /// Stops the server with a fast shutdown (clients disconnected, a checkpoint written).
    pub fn stop(&self) {
        self.run(self.pg_ctl("stop").args(["-m", "fast"]));
    }

    /// Starts the server again, on the same port, after [`stop`](Self::stop) or a kill.
    pub fn start_again(&self) {
        self.run(&mut self.pg_ctl("start"));
    }

    /// Stops the server with a fast shutdown and starts it again.
    pub fn restart_fast(&self) {
        self.run(self.pg_ctl("restart").args(["-m", "fast"]));
    }

    /// Kills the postmaster with SIGKILL, as a crash would (no shutdown checkpoint), and waits
    /// for its backends to exit; [`start_again`](Self::start_again) then runs crash recovery.
    pub fn kill_postmaster(&self) {
        let pidfile = fs::read_to_string(self.data.join("postmaster.pid")).expect("postmaster.pid");
        let lines: Vec<&str> = pidfile.lines().collect();
        let pid = lines[0].trim();
        // Line 7 is the key and id of the System V segment every backend stays attached to.
        let shmid = lines.get(6).and_then(|l| l.split_whitespace().nth(1));
        let shmid = shmid.unwrap_or("-");
        self.run(Command::new("sh").args(["-c", &format!("kill -KILL {pid}")]));
        let state = || {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after_name = stat.rsplit(')').next()?;
            after_name.split_whitespace().next().map(str::to_string)
        };
        let attached = || -> Option<u64> {
            let table = fs::read_to_string("/proc/sysvipc/shm").ok()?;
            let mut rows = table.lines();
            let row = rows.find(|r| r.split_whitespace().nth(1) == Some(shmid))?;
            row.split_whitespace().nth(6)?.parse().ok()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while state().is_some_and(|s| s != "Z") || attached().is_some_and(|n| n > 0) {
            assert!(Instant::now() < deadline, "the killed server lives on");
            std::thread::sleep(Duration::from_millis(20));
        }
        if attached().is_some() {
            self.run(Command::new("ipcrm").args(["-m", shmid])); // as the next server would
        }
        // A zombie that nobody reaps (a container whose init does not) still "exists": its
        // lock files would make the next server believe it is running.
        if state().is_some() {
            let _ = fs::remove_file(self.data.join("postmaster.pid"));
            let _ = fs::remove_file(self.socket_dir.join(format!(".s.PGSQL.{}.lock", self.port)));
        }
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The server's TCP port, also the number of its socket (`.s.PGSQL.PORT`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// A new cluster's directory (owned by postgres when we are root); nothing in it runs yet.
    fn create(bin: PathBuf) -> Cluster {
        // A short path: the path of a Unix socket is limited to about 107 bytes.
        let dir = tempfile::TempDir::with_prefix_in("skpg", "/tmp").expect("a temp dir");
        // The directory is ours: its owner tells whether we are root.
        let as_postgres = dir.path().metadata().expect("stat the temp dir").uid() == 0;
        let root = dir.path().to_path_buf();
        let (data, socket_dir, log) = (root.join("data"), root.join("s"), root.join("log"));
        let pg = Cluster {
            bin,
            dir,
            data,
            socket_dir,
            log,
            port: 0,
            as_postgres,
        };
        fs::create_dir(&pg.socket_dir).expect("create the socket directory");
        if as_postgres {
            let user = Command::new("id").args(["-u", "postgres"]).output();
            assert!(
                user.is_ok_and(|o| o.status.success()),
                "the tests run as root, and PostgreSQL refuses root, but there is no `postgres` \
                 user to run it as: `apt-get install postgresql` creates one"
            );
            pg.run(Command::new("chown").args(["-R", "postgres:"]).arg(&root));
        }
        pg
    }

    fn initdb(&self) {
        let initdb = "-A trust -U postgres -E UTF8 --locale=C --no-sync -D";
        let mut initdb_cmd = self.server_cmd("initdb");
        self.run(initdb_cmd.args(initdb.split(' ')).arg(&self.data));
    }

    /// Appends `text` to the configuration file `name` of the data directory.
    fn append_conf(&self, name: &str, text: &str) {
        use std::io::Write;
        let path = self.data.join(name);
        let mut file = fs::OpenOptions::new().append(true).open(&path);
        let file = file
            .as_mut()
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        file.write_all(text.as_bytes())
            .expect("append to the configuration");
    }

    /// Starts the server on a free port.
    fn start_server(&mut self) {
        // The port is free when we look, but another process may bind it before the server does.
        for attempt in 1..=3 {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
            self.port = probe.local_addr().expect("local address").port();
            drop(probe);
            let log_before = self.log().len();
            let out = self.pg_ctl("start").output().expect("run pg_ctl start");
            if out.status.success() {
                return;
            }
            let log = self.log();
            let new_lines = log.get(log_before..).unwrap_or_default();
            if attempt == 3 || !new_lines.contains("could not bind") {
                self.fail("pg_ctl start", &out);
            }
        }
    }

    /// Runs `sql` (in database postgres) until it returns `want`; panics after 30 seconds.
    fn wait_until(&self, sql: &str, want: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = self.psql("postgres", sql);
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "PostgreSQL test cluster: waited 30 s for {what}: `{sql}` gives {got:?}, not \
                 {want:?}\n--- last lines of {}\n{}",
                self.log.display(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A command without the caller's `PG*` variables (PGHOST, PGOPTIONS, ...), run from a
    /// directory the postgres user can enter.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        for (key, _) in std::env::vars_os().filter(|(k, _)| k.to_string_lossy().starts_with("PG")) {
            cmd.env_remove(key);
        }
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        cmd
    }

    /// A server program (`initdb`, `pg_ctl`): run as the postgres user when we are root.
    fn server_cmd(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if !self.as_postgres {
            return self.command(program);
        }
        let mut cmd = self.command("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    }

    /// `pg_ctl ACTION -w` on this cluster, with the server's options.
    fn pg_ctl(&self, action: &str) -> Command {
        let options = format!(
            "-k {} -p {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on \
             -c max_connections=200 -c shared_buffers=128MB",
            sh_quote(&self.socket_dir),
            self.port
        );
        let mut cmd = self.server_cmd("pg_ctl");
        cmd.args([action, "-w", "-D"]).arg(&self.data);
        cmd.arg("-l").arg(&self.log);
        if action != "stop" {
            cmd.arg("-o").arg(options);
        }
        cmd
    }

    /// Runs `cmd` to completion; panics unless it succeeds.
    fn run(&self, cmd: &mut Command) -> Output {
        let what = format!("{cmd:?}");
        let out = cmd.output();
        let out = out.unwrap_or_else(|e| panic!("could not run {what}: {e}"));
        if !out.status.success() {
            self.fail(&what, &out);
        }
        out
    }

    fn fail(&self, what: &str, out: &Output) -> ! {
        panic!(
            "PostgreSQL test cluster: {what} failed ({})\n--- stdout\n{}--- stderr\n{}\
             --- last lines of {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log.display(),
            self.log_tail()
        );
    }

    /// The last 30 lines of the server's log.
    fn log_tail(&self) -> String {
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        tail.join("\n")
    }

    /// Starts a shell that waits for this process to exit, then stops the server and deletes its
    /// directory; it gives up once the directory is gone (the cluster was dropped). It runs in
    /// the background of a shell that exits at once, so nothing waits for it, in a process
    /// group of its own, ignoring SIGINT: a Ctrl-C aimed at the tests does not kill it.
    fn spawn_watchdog(&self) {
        let pg_ctl = self.server_cmd("pg_ctl");
        let stop: Vec<String> = std::iter::once(pg_ctl.get_program())
            .chain(pg_ctl.get_args())
            .chain(["stop", "-m", "immediate", "-D"].map(std::ffi::OsStr::new))
            .chain([self.data.as_os_str()])
            .map(sh_quote)
            .collect();
        let (dir, stop) = (sh_quote(self.dir.path()), stop.join(" "));
        let script = format!(
            "(while kill -0 {pid} 2>/dev/null && [ -d {dir} ]; do sleep 1; done; \
             if [ -d {dir} ]; then {stop} >/dev/null 2>&1; rm -rf {dir}; fi) &",
            pid = std::process::id()
        );
        let mut cmd = self.command("sh");
        cmd.args(["-c", &script]).process_group(0);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        self.run(&mut cmd);
    }
}

impl Drop for Cluster {
    /// Stops the server at once (no checkpoint: the data is thrown away); the directory goes next.
    fn drop(&mut self) {
        let mut stop = self.server_cmd("pg_ctl");
        stop.args(["stop", "-m", "immediate", "-w", "-D"]);
        stop.arg(&self.data);
        let _ = stop.output();
    }
}
