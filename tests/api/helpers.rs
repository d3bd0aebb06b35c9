use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::dev::ServerHandle;
use rusqlite::{Connection, OpenFlags};
pub use sekali::clock::Clock;
use sekali::clock::{ManualClock, SystemClock};
use sekali::config::Settings;
use sekali::providers::{midtrans, stripe, ProviderSettings, Providers};
use sekali::startup::Application;
use sekali::store::Location;
use serde_json::Value;
use tempfile::TempDir;

// Here rather than in each test binary's root: every binary that includes this file gets the
// cluster it needs for SEKALI_TEST_ENGINE=postgres.
#[path = "../support/postgres.rs"]
pub mod pg_cluster;

/// The engine the tests' servers run on: `SEKALI_TEST_ENGINE`, `sqlite` (the default) or
/// `postgres`. The same tests run on either (.ci/test runs both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// The engine `SEKALI_TEST_ENGINE` names; panics on any other value, so that a typo does not
/// quietly run the SQLite half again.
pub fn engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    *ENGINE.get_or_init(|| match std::env::var("SEKALI_TEST_ENGINE").as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("" | "sqlite") => Engine::Sqlite,
        Ok("postgres") => Engine::Postgres,
        other => panic!("SEKALI_TEST_ENGINE={other:?}: expected sqlite (the default) or postgres"),
    })
}

/// Whether a test about the SQLite file itself (its locks, its pages, its older versions) is
/// to be skipped: true, after printing `skipped on postgres: WHY`, when the tests run on
/// PostgreSQL. Such a test returns at once.
pub fn sqlite_only(why: &str) -> bool {
    let skip = engine() == Engine::Postgres;
    if skip {
        println!("skipped on postgres: {why}");
    }
    skip
}

/// The PostgreSQL cluster of this test process, asked for by `SEKALI_TEST_ENGINE=postgres`:
/// without PostgreSQL installed that is an error, not a skip.
fn cluster() -> &'static pg_cluster::Cluster {
    pg_cluster::shared().unwrap_or_else(|| {
        panic!(
            "SEKALI_TEST_ENGINE=postgres, but PostgreSQL is not installed: {}",
            pg_cluster::skip_note()
        )
    })
}

/// A test server's database, on the engine the tests run on: a SQLite file, or a database of
/// the private PostgreSQL cluster (by its URL). What the tests read of it goes through
/// [`Database::query`], in SQL both engines accept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Database {
    File(PathBuf),
    Server(String),
}

/// The rows of a query: every value as text (an integer in decimal), NULL as `None`.
pub type Rows = Vec<Vec<Option<String>>>;

impl Database {
    /// A new database of the engine the tests run on: the SQLite file `file` (which the server
    /// creates), or a fresh, empty database of the PostgreSQL cluster.
    pub fn fresh(file: PathBuf) -> Database {
        match engine() {
            Engine::Sqlite => Database::File(file),
            Engine::Postgres => {
                let cluster = cluster();
                Database::Server(cluster.url(&cluster.fresh_database()))
            }
        }
    }

    /// A database that does not exist, of the engine the tests run on: the file `file` (not
    /// created), or a database of the PostgreSQL cluster that nothing creates.
    pub fn missing(file: PathBuf) -> Database {
        match engine() {
            Engine::Sqlite => Database::File(file),
            Engine::Postgres => {
                let cluster = cluster();
                Database::Server(cluster.url(&format!("never_{}", cluster.fresh_database())))
            }
        }
    }

    /// What `--db path` names: a PostgreSQL URL is a server, anything else a file.
    pub fn from_path(path: &Path) -> Database {
        Database::from(&Location::from(path.to_path_buf()))
    }

    pub fn location(&self) -> Location {
        match self {
            Database::File(path) => Location::File(path.clone()),
            Database::Server(url) => Location::Server(url.clone()),
        }
    }

    /// The value of `--db`: the file's path or the URL.
    pub fn arg(&self) -> String {
        match self {
            Database::File(path) => path.to_str().expect("a UTF-8 temp path").to_owned(),
            Database::Server(url) => url.clone(),
        }
    }

    /// The file, or the URL as a path: what `--db` and [`ServeProcess::start_on`] take.
    pub fn path(&self) -> &Path {
        match self {
            Database::File(path) => path,
            Database::Server(url) => Path::new(url),
        }
    }

    /// The SQLite file; panics on PostgreSQL (the test should have been [`sqlite_only`]).
    pub fn file(&self) -> &Path {
        match self {
            Database::File(path) => path,
            Database::Server(url) => {
                panic!("{url} is no SQLite file: a test of the file itself is sqlite_only()")
            }
        }
    }

    /// Runs `sql`, one read-only statement (no parameters: literals, quoted with [`sql_text`]).
    pub fn query(&self, sql: &str) -> Rows {
        match self {
            Database::File(path) => {
                let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
                    .and_then(|conn| conn.busy_timeout(Duration::from_secs(5)).map(|()| conn))
                    .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
                let mut statement = conn.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
                let columns = statement.column_count();
                let rows = statement.query_map([], |row| {
                    (0..columns)
                        .map(|i| {
                            use rusqlite::types::ValueRef;
                            Ok(match row.get_ref(i)? {
                                ValueRef::Null => None,
                                ValueRef::Integer(n) => Some(n.to_string()),
                                ValueRef::Real(x) => Some(x.to_string()),
                                ValueRef::Text(t) | ValueRef::Blob(t) => {
                                    Some(String::from_utf8_lossy(t).into_owned())
                                }
                            })
                        })
                        .collect()
                });
                let rows = rows.and_then(Iterator::collect);
                rows.unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
            Database::Server(url) => {
                let owned = sql.to_owned();
                let messages = on_server(url, move |client| client.simple_query(&owned));
                let messages = messages.unwrap_or_else(|e| panic!("{sql}: {e}"));
                messages
                    .into_iter()
                    .filter_map(|message| match message {
                        postgres::SimpleQueryMessage::Row(row) => Some(
                            (0..row.len())
                                .map(|i| row.get(i).map(str::to_owned))
                                .collect(),
                        ),
                        _ => None,
                    })
                    .collect()
            }
        }
    }

    /// Runs `sql`, statements separated by `;`, writing: for a test that puts a row in place
    /// itself, as an operator with sqlite3 or psql would.
    pub fn execute(&self, sql: &str) {
        match self {
            Database::File(path) => Connection::open(path)
                .and_then(|conn| {
                    conn.busy_timeout(Duration::from_secs(5))?;
                    conn.execute_batch(sql)
                })
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
            Database::Server(url) => {
                let owned = sql.to_owned();
                on_server(url, move |client| client.batch_execute(&owned))
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
        }
    }

    /// Whether nothing was created here: no SQLite file, or no table in the PostgreSQL database.
    pub fn is_untouched(&self) -> bool {
        match self {
            Database::File(path) => !path.exists(),
            Database::Server(_) => {
                self.count("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
            }
        }
    }

    /// The first column of the one row `sql` returns, a number (`count(*)`, `max(id)`).
    pub fn count(&self, sql: &str) -> i64 {
        let rows = self.query(sql);
        assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
        let value = rows[0][0].as_deref();
        let value = value.unwrap_or_else(|| panic!("{sql}: NULL"));
        value
            .parse()
            .unwrap_or_else(|e| panic!("{sql}: {value:?}: {e}"))
    }

    /// The first column of every row `sql` returns, as text (none NULL).
    pub fn texts(&self, sql: &str) -> Vec<String> {
        let rows = self.query(sql).into_iter();
        rows.map(|row| {
            row.into_iter()
                .next()
                .flatten()
                .unwrap_or_else(|| panic!("{sql}: NULL"))
        })
        .collect()
    }
}

impl From<&Location> for Database {
    fn from(location: &Location) -> Self {
        match location {
            Location::File(path) => Database::File(path.clone()),
            Location::Server(url) => Database::Server(url.clone()),
        }
    }
}

/// A job for the connection thread of a database: runs on the thread, given its client.
type PgJob = Box<dyn FnOnce(&mut PgConnection) + Send>;

/// One database's client, on the thread that owns it, connected on first use.
struct PgConnection {
    url: String,
    client: Option<postgres::Client>,
}

/// The connection thread of each database in use, by URL. Senders are taken and used only under
/// this lock, so a thread that finds its queue empty under it can leave with no job lost.
static PG_THREADS: std::sync::Mutex<Vec<(String, std::sync::mpsc::Sender<PgJob>)>> =
    std::sync::Mutex::new(Vec::new());

/// How long a connection thread waits for a job before it closes its connection and exits: a
/// test's queries come close together, and a finished test's connection is soon closed.
const PG_IDLE: Duration = Duration::from_secs(2);

/// Runs `work` on a client connected to `url`, on a thread that keeps the connection between
/// queries: the `postgres` crate's blocking client panics when it is used, or dropped, on a
/// thread inside a tokio runtime, and the tests run inside actix's, so the client lives on a
/// plain thread of its own, one per database in use, and is dropped there. (A connection per
/// query costs about 4 ms, which the ledger model's thousands of queries would pay.)
fn on_server<T: Send + 'static>(
    url: &str,
    work: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error> + Send + 'static,
) -> Result<T, String> {
    let (answer, answered) = std::sync::mpsc::channel();
    let job: PgJob = Box::new(move |connection: &mut PgConnection| {
        let result = match connection.client.as_mut() {
            Some(client) => Ok(client),
            None => postgres::Client::connect(&connection.url, postgres::NoTls)
                .map(|client| connection.client.insert(client)),
        };
        let result = result.and_then(work);
        if connection
            .client
            .as_ref()
            .is_some_and(postgres::Client::is_closed)
        {
            connection.client = None; // connect again for the next job
        }
        let _ = answer.send(result.map_err(|e| e.to_string()));
    });
    {
        let mut threads = PG_THREADS.lock().unwrap();
        let known = threads.iter().find(|(u, _)| u == url);
        let sender = match known {
            Some((_, sender)) => sender.clone(),
            None => {
                let sender = pg_connection_thread(url.to_owned());
                threads.push((url.to_owned(), sender.clone()));
                sender
            }
        };
        sender.send(job).expect("the connection thread takes jobs");
    }
    answered.recv().expect("the connection thread answers")
}

/// Starts the connection thread of `url`; its sender (which the caller registers).
fn pg_connection_thread(url: String) -> std::sync::mpsc::Sender<PgJob> {
    let (sender, jobs) = std::sync::mpsc::channel::<PgJob>();
    let mut connection = PgConnection { url, client: None };
    std::thread::spawn(move || loop {
        match jobs.recv_timeout(PG_IDLE) {
            Ok(job) => job(&mut connection),
            Err(_) => {
                let mut threads = PG_THREADS.lock().unwrap();
                if let Ok(job) = jobs.try_recv() {
                    drop(threads);
                    job(&mut connection);
                    continue;
                }
                threads.retain(|(u, _)| *u != connection.url);
                return; // the client is dropped here, on this thread
            }
        }
    });
    sender
}

/// `text` as an SQL string literal, the same on both engines.
pub fn sql_text(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

pub const STRIPE_SECRET: &str = "whsec_test_c2VrYWxpLXRlc3Qtc2VjcmV0LW9uZQ";
pub const STRIPE_SECRET_NEXT: &str = "whsec_test_c2VrYWxpLXRlc3Qtc2VjcmV0LXR3bw";
pub const MIDTRANS_KEY: &str = "SB-Mid-server-sekali-test-key";

/// What a delivery whose signature matches no secret is told (a 401).
pub const NO_MATCH: &str = "no signature matches any configured secret. The signature covers the \
    exact bytes received: check that STRIPE_WEBHOOK_SECRET is this endpoint's signing secret, \
    and that nothing re-encoded the body on the way (send a file with curl \
    --data-binary @file, not -d)";

pub struct TestApp {
    pub address: String,
    pub port: u16,
    /// The server's database, on the engine the tests run on (see [`engine`]).
    pub database: Database,
    pub clock: Arc<ManualClock>,
    pub client: awc::Client,
    /// The server's store, for a relay that writes through it as the one inside `serve` does.
    pub store: std::sync::Arc<dyn sekali::store::Store>,
    handle: ServerHandle,
    _dir: TempDir,
}

/// The environment of the providers of [`spawn_app`]: Stripe and Midtrans, whose notifications
/// are applied as sent, as with `--midtrans-status-check off` (the tests of the check itself,
/// midtrans_status.rs, run it against a stand-in of the API).
pub const PROVIDER_ENV: &[(&str, &str)] = &[
    ("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET),
    ("MIDTRANS_SERVER_KEY", MIDTRANS_KEY),
    ("SEKALI_MIDTRANS_STATUS_CHECK", "off"),
];

/// The providers configured as `serve` configures them, from `env` and the command line's
/// `(provider, option, value)`.
pub fn providers_from(env: &[(&str, &str)], options: &[(&str, &str, &str)]) -> Providers {
    let env_var = |name: &str| {
        env.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_string())
    };
    let options = options
        .iter()
        .map(|(p, o, v)| ((p.to_string(), o.to_string()), v.to_string()))
        .collect();
    Providers::configure(&ProviderSettings {
        env: &env_var,
        options: &options,
    })
    .expect("the providers configure")
}

/// The providers of [`spawn_app`], with these options.
pub fn providers_with(options: &[(&str, &str, &str)]) -> Providers {
    providers_from(PROVIDER_ENV, options)
}

/// A server with every provider configured, its clock at the real current time.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Like [`spawn_app`], with settings adjusted by `adjust` before the server is built.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut Settings)) -> TestApp {
    let dir = tempfile::tempdir().expect("temp dir");
    let database = Database::fresh(dir.path().join("sekali.db"));
    let mut settings = Settings::new("127.0.0.1:0", database.location(), providers_with(&[]));
    settings.workers = 2;
    settings.handle_signals = false;
    settings.shutdown_timeout = Duration::from_secs(5);
    adjust(&mut settings);
    // `adjust` may have named a database of its own (an older SQLite file).
    let database = Database::from(&settings.db);
    let clock = ManualClock::new(SystemClock.now_unix());
    let app = Application::build(settings, clock.clone()).expect("the app builds");
    let port = app.port();
    let handle = app.handle();
    let store = app.store();
    actix_web::rt::spawn(app.run_until_stopped());
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        port,
        database,
        clock,
        client: awc::Client::builder()
            .timeout(Duration::from_secs(30))
            .finish(),
        store,
        handle,
        _dir: dir,
    }
}

pub fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `count` distinct Stripe `payment_intent.succeeded` deliveries, each for its own order:
/// event, order and PaymentIntent ids carry `tag` and the index.
pub fn distinct_succeeded_bodies(tag: &str, count: usize) -> Vec<Vec<u8>> {
    let template = String::from_utf8(fixture("stripe/payment_intent.succeeded.json")).unwrap();
    (0..count)
        .map(|i| {
            template
                .replace("evt_1QA0002succeeded000001", &format!("evt_{tag}_{i:02}"))
                .replace("ord_1001", &format!("ord_{tag}_{i:02}"))
                .replace("pi_3QA0001Order1001", &format!("pi_{tag}_{i:02}"))
                .into_bytes()
        })
        .collect()
}

pub fn stripe_header(body: &[u8], timestamp: i64) -> String {
    stripe::signature_header(&[STRIPE_SECRET], timestamp, body)
}

pub fn sign_midtrans(body: &[u8]) -> Vec<u8> {
    midtrans::with_signature_key(body, MIDTRANS_KEY).expect("a Midtrans notification")
}

/// A response's status and JSON body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    pub fn outcome(&self) -> &str {
        self.body["status"].as_str().unwrap_or("<none>")
    }

    pub fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("<none>")
    }
}

impl TestApp {
    /// `GET /healthz`: its status code and its JSON body.
    pub async fn healthz(&self) -> (u16, serde_json::Value) {
        let mut response = self
            .client
            .get(format!("{}/healthz", self.address))
            .send()
            .await
            .unwrap();
        let body = response.body().await.unwrap();
        (
            response.status().as_u16(),
            serde_json::from_slice(&body).unwrap(),
        )
    }

    pub async fn post(&self, path: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> Answer {
        let mut request = self
            .client
            .post(format!("{}{path}", self.address))
            .insert_header(("Content-Type", "application/json"));
        for (name, value) in headers {
            request = request.insert_header((*name, *value));
        }
        let mut response = request
            .send_body(body)
            .await
            .expect("the request is answered");
        let status = response.status().as_u16();
        let bytes = response.body().limit(1 << 20).await.expect("a body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer { status, body }
    }

    /// POSTs `body` to the Stripe route with `header` as Stripe-Signature (if any).
    pub async fn post_stripe(&self, body: &[u8], header: Option<&str>) -> Answer {
        match header {
            Some(h) => {
                self.post(
                    "/webhooks/stripe",
                    body.to_vec(),
                    &[("Stripe-Signature", h)],
                )
                .await
            }
            None => self.post("/webhooks/stripe", body.to_vec(), &[]).await,
        }
    }

    /// Signs `body` at the server's current time, as Stripe would, and delivers it.
    pub async fn deliver_stripe_body(&self, body: &[u8]) -> Answer {
        let header = stripe_header(body, self.clock.now_unix());
        self.post_stripe(body, Some(&header)).await
    }

    pub async fn deliver_stripe(&self, fixture_name: &str) -> Answer {
        self.deliver_stripe_body(&fixture(&format!("stripe/{fixture_name}.json")))
            .await
    }

    pub async fn deliver_midtrans(&self, fixture_name: &str) -> Answer {
        let body = sign_midtrans(&fixture(&format!("midtrans/{fixture_name}.json")));
        self.post("/webhooks/midtrans", body, &[]).await
    }

    /// The test's temporary directory (the SQLite file's, on SQLite), for files of its own.
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// The server's database as `--db` takes it: the file's path or the PostgreSQL URL.
    pub fn db_arg(&self) -> String {
        self.database.arg()
    }

    /// Runs the read-only `sql` on the server's database, whichever the engine (see
    /// [`Database::query`]).
    pub fn query(&self, sql: &str) -> Rows {
        self.database.query(sql)
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.database.count(sql)
    }

    /// The first column of every row `sql` returns, as text.
    pub fn texts(&self, sql: &str) -> Vec<String> {
        self.database.texts(sql)
    }

    /// The values of the one row `sql` returns, as text (none NULL).
    pub fn one_row(&self, sql: &str) -> Vec<String> {
        let mut rows = self.query(sql);
        assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
        let row = rows.pop().unwrap().into_iter();
        row.map(|v| v.unwrap_or_else(|| panic!("{sql}: NULL")))
            .collect()
    }

    /// (processed_events, orders, email_outbox) row counts.
    pub fn row_counts(&self) -> (i64, i64, i64) {
        (
            self.count("SELECT count(*) FROM processed_events"),
            self.count("SELECT count(*) FROM orders"),
            self.count("SELECT count(*) FROM email_outbox"),
        )
    }

    pub fn order_status(&self, order_id: &str) -> Option<String> {
        let sql = format!(
            "SELECT status FROM orders WHERE order_id = {}",
            sql_text(order_id)
        );
        self.texts(&sql).pop()
    }

    pub fn order(&self, order_id: &str) -> (String, i64, i64) {
        let sql = format!(
            "SELECT status, amount, refunded_amount FROM orders WHERE order_id = {}",
            sql_text(order_id)
        );
        let rows = self.query(&sql);
        let row = rows
            .first()
            .unwrap_or_else(|| panic!("order {order_id}: no such order"));
        let value = |i: usize| {
            let value = row[i].clone();
            value.unwrap_or_else(|| panic!("order {order_id}: column {i} is NULL"))
        };
        (
            value(0),
            value(1).parse().unwrap(),
            value(2).parse().unwrap(),
        )
    }

    pub fn outbox_templates(&self, order_id: &str) -> Vec<String> {
        self.texts(&format!(
            "SELECT template FROM email_outbox WHERE order_id = {} ORDER BY id",
            sql_text(order_id)
        ))
    }

    pub async fn stop(&self) {
        self.handle.stop(true).await;
    }
}

/// The Stripe fixtures in the order their lifecycles happen.
pub const STRIPE_IN_ORDER: [(&str, &str); 11] = [
    ("payment_intent.processing", "processed"),
    ("payment_intent.succeeded", "processed"),
    ("charge.refunded.partial", "processed"),
    ("charge.refunded.full", "processed"),
    ("payment_intent.payment_failed", "processed"),
    ("checkout.session.completed", "processed"),
    ("charge.dispute.created", "processed"),
    ("checkout.session.completed.unpaid", "processed"),
    ("checkout.session.async_payment_succeeded", "processed"),
    ("checkout.session.async_payment_failed", "processed"),
    ("customer.created", "ignored"),
];

/// The Midtrans fixtures in the order their lifecycles happen.
pub const MIDTRANS_IN_ORDER: [&str; 11] = [
    "pending",
    "settlement",
    "partial_refund.1",
    "partial_refund.2",
    "capture.challenge",
    "capture.accept",
    "refund",
    "deny",
    "cancel",
    "expire",
    "failure",
];

/// The first column of every row `sql` returns on `conn`, as text.
pub fn texts(conn: &Connection, sql: &str) -> Vec<String> {
    conn.prepare(sql)
        .expect(sql)
        .query_map([], |row| row.get(0))
        .expect(sql)
        .map(Result::unwrap)
        .collect()
}

/// Path of the built `sekali` binary.
pub fn sekali_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sekali")
}

/// The database file of a [`ServeProcess`] on SQLite, inside its temporary directory.
const SERVE_DB: &str = "s.db";

/// `sekali serve` as a child process on a port of the system's choosing (`--listen 127.0.0.1:0`,
/// the port read from its listening line), with its own new database (of the engine the tests
/// run on) and temporary mail directory, its logs collected while it runs (a full pipe would
/// stall it).
pub struct ServeProcess {
    child: std::process::Child,
    pub port: u16,
    logs: Option<std::thread::JoinHandle<String>>,
    /// What the server has logged so far, while it runs.
    logged: std::sync::Arc<std::sync::Mutex<String>>,
    db: Database,
    mail_dir: std::path::PathBuf,
    _dir: TempDir,
}

impl ServeProcess {
    /// Starts the binary with `env` and `RUST_LOG=rust_log` (a level), and waits until it
    /// reports that it listens.
    pub fn start(env: &[(&str, &str)], rust_log: &str) -> Self {
        Self::start_with(env, rust_log, &[])
    }

    /// [`ServeProcess::start`] with more `serve` arguments.
    pub fn start_with(env: &[(&str, &str)], rust_log: &str, args: &[&str]) -> Self {
        Self::start_on(None, env, rust_log, args)
    }

    /// [`ServeProcess::start_with`] on the database `db` (a file, or a PostgreSQL URL as a path:
    /// [`Database::path`]) instead of one of its own.
    pub fn start_on(
        db: Option<&std::path::Path>,
        env: &[(&str, &str)],
        rust_log: &str,
        args: &[&str],
    ) -> Self {
        Self::start_unsetting(db, env, &[], rust_log, args)
    }

    /// [`ServeProcess::start_on`] with the variables named in `unset` removed from the
    /// environment after `env` is applied (so `SEKALI_MIDTRANS_STATUS_CHECK` can be left to the
    /// binary's own default).
    pub fn start_unsetting(
        db: Option<&std::path::Path>,
        env: &[(&str, &str)],
        unset: &[&str],
        rust_log: &str,
        args: &[&str],
    ) -> Self {
        Self::launch(db, env, unset, rust_log, args, None)
    }

    /// [`ServeProcess::start_with`] under an open-file limit (soft and hard) of `open_files`,
    /// set by the shell that starts it (`ulimit -n`).
    #[allow(dead_code)] // by the tests of the connection limit
    pub fn start_with_open_files(
        open_files: u64,
        env: &[(&str, &str)],
        rust_log: &str,
        args: &[&str],
    ) -> Self {
        Self::launch(None, env, &[], rust_log, args, Some(open_files))
    }

    fn launch(
        db: Option<&std::path::Path>,
        env: &[(&str, &str)],
        unset: &[&str],
        rust_log: &str,
        args: &[&str],
        open_files: Option<u64>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = db.map_or_else(
            || Database::fresh(dir.path().join(SERVE_DB)),
            Database::from_path,
        );
        let mail_dir = dir.path().join("mail");
        let mut command = match open_files {
            None => std::process::Command::new(sekali_bin()),
            Some(limit) => {
                let mut shell = std::process::Command::new("sh");
                shell
                    .arg("-c")
                    .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                    .arg(sekali_bin());
                shell
            }
        };
        command
            .args([
                "serve",
                // Any free port: the server says which in its listening line.
                "--listen",
                "127.0.0.1:0",
                "--relay-poll-interval",
                "50ms",
            ])
            .arg("--mail-dir")
            .arg(&mail_dir)
            .arg("--db")
            .arg(db.arg())
            .args(args)
            .env_remove("STRIPE_WEBHOOK_SECRET")
            .env_remove("MIDTRANS_SERVER_KEY")
            .env_remove("XENDIT_CALLBACK_TOKEN")
            // As in spawn_app: the check has tests of its own, against a stand-in of the API
            // (a test can pass SEKALI_MIDTRANS_STATUS_CHECK=on in `env`).
            .env("SEKALI_MIDTRANS_STATUS_CHECK", "off")
            .env("RUST_LOG", rust_log_with_listening_line(rust_log))
            .stderr(std::process::Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        for name in unset {
            command.env_remove(name);
        }
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (ports, port) = std::sync::mpsc::channel();
        let logged = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        // Collects the logs while the server runs, and passes on the port of its listening line.
        let logs = {
            let logged = logged.clone();
            std::thread::spawn(move || {
                let mut logs = String::new();
                let mut stderr = std::io::BufReader::new(stderr);
                loop {
                    let start = logs.len();
                    if std::io::BufRead::read_line(&mut stderr, &mut logs).unwrap() == 0 {
                        return logs;
                    }
                    logged.lock().unwrap().push_str(&logs[start..]);
                    if let Some(port) = listening_port(&logs[start..]) {
                        let _ = ports.send(port);
                    }
                }
            })
        };
        let port = match port.recv_timeout(Duration::from_secs(20)) {
            Ok(port) => port,
            // The logs ended without the line: the server exited.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().unwrap();
                let logs = logs.join().unwrap();
                panic!("sekali serve exited ({status}) before listening: {logs}");
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                let logs = logs.join().unwrap();
                panic!("sekali serve did not report listening within 20 s: {logs}");
            }
        };
        ServeProcess {
            child,
            port,
            logs: Some(logs),
            logged,
            db,
            mail_dir,
            _dir: dir,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What the server has logged so far.
    #[allow(dead_code)] // by the tests of the connection limit
    pub fn logs_so_far(&self) -> String {
        self.logged.lock().unwrap().clone()
    }

    /// Its database (see [`Database::query`], [`Database::arg`]).
    pub fn db(&self) -> &Database {
        &self.db
    }

    /// Where its relay writes `.eml` files (`--mail-dir`); the arguments given to start it
    /// come after, so a test's own `--mail-dir` wins and this path stays empty.
    pub fn mail_dir(&self) -> std::path::PathBuf {
        self.mail_dir.clone()
    }

    /// Sends SIGTERM and waits; the exit status and everything the server logged.
    pub fn stop(self) -> (std::process::ExitStatus, String) {
        let kill = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        self.wait()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the server to exit (after a signal the test sent); the exit status and
    /// everything it logged.
    pub fn wait(mut self) -> (std::process::ExitStatus, String) {
        let status = self.child.wait().unwrap();
        (status, self.logs.take().unwrap().join().unwrap())
    }
}

impl Drop for ServeProcess {
    /// A test that fails before [`ServeProcess::stop`] leaves no server running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The port in `sekali serve`'s listening line, if `line` is that line. The server writes it
/// once its socket listens (at INFO, target `sekali::startup`; see `Application::build`):
/// `… INFO sekali::startup: sekali is listening; register … address=127.0.0.1:PORT db=… …`.
/// With `--listen 127.0.0.1:0` it is the port the system gave it.
pub fn listening_port(line: &str) -> Option<u16> {
    if !line.contains("sekali is listening") {
        return None;
    }
    let address = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("address="))?;
    Some(address.parse::<std::net::SocketAddr>().ok()?.port())
}

/// Polls `GET /healthz` on the loopback `port` with `agent` until it answers 200; false if
/// `within` passes first.
#[allow(dead_code)] // by chaos.rs and powercut.rs, whose servers restart after kills and cuts
pub fn wait_until_healthy(agent: &ureq::Agent, port: u16, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        let answer = agent
            .get(&format!("http://127.0.0.1:{port}/healthz"))
            .call();
        if answer.is_ok_and(|r| r.status() == 200) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The port of the listening line that `child`, a `sekali serve` whose stderr is appended to
/// `log`, writes there past byte `from` (the file's length when it was started). Panics,
/// naming the log, if the child exits or `within` passes first.
#[allow(dead_code)] // by chaos.rs and powercut.rs, whose servers log to a file
pub fn port_from_log(
    log: &Path,
    from: u64,
    child: &mut std::process::Child,
    within: Duration,
) -> u16 {
    let deadline = std::time::Instant::now() + within;
    loop {
        // Read before checking whether it exited, so that a line written just before an exit
        // is not missed.
        let written = std::fs::read(log).unwrap_or_default();
        let new = String::from_utf8_lossy(written.get(from as usize..).unwrap_or_default());
        // Whole lines only: a line still being written could show half its address.
        let whole = &new[..new.rfind('\n').map_or(0, |end| end + 1)];
        if let Some(port) = whole.lines().find_map(listening_port) {
            return port;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "sekali serve exited ({status}) before listening; see {}",
                log.display()
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sekali serve did not report listening within {within:?}; see {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `RUST_LOG` for a `sekali serve` child that logs at `rust_log` (a level) and must still write
/// its listening line (see [`listening_port`]): below INFO, the line's target is let through at
/// INFO. Levels that show INFO anyway are left as they are (a `sekali::startup=info` after
/// `trace` would hide that module's debug lines).
pub fn rust_log_with_listening_line(rust_log: &str) -> String {
    match rust_log {
        "info" | "debug" | "trace" => rust_log.to_owned(),
        quieter => format!("{quieter},sekali::startup=info"),
    }
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Reads from `stream` until the server closes it, the read times out, or `done` says the
/// answer so far is complete.
#[allow(dead_code)] // by hostile.rs and stalls.rs
pub fn read_answer(stream: &mut std::net::TcpStream, done: impl Fn(&[u8]) -> bool) -> String {
    use std::io::Read;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
        if done(&answer) {
            break;
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Posts a signed Stripe delivery to the instance on `port`: its status and `status` field
/// (or what went wrong), as a provider sees it.
#[allow(dead_code)] // by postgres.rs and powercut.rs
pub fn deliver_stripe(agent: &ureq::Agent, port: u16, body: &[u8]) -> (u16, String) {
    let header = stripe_header(
        body,
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64,
    );
    let answer = agent
        .post(&format!("http://127.0.0.1:{port}/webhooks/stripe"))
        .set("Stripe-Signature", &header)
        .set("Content-Type", "application/json")
        .send_bytes(body);
    let (status, text) = match answer {
        Ok(response) => (
            response.status(),
            response.into_string().unwrap_or_default(),
        ),
        Err(ureq::Error::Status(code, response)) => {
            (code, response.into_string().unwrap_or_default())
        }
        Err(e) => return (0, e.to_string()),
    };
    let outcome = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["status"].as_str().map(str::to_owned))
        .unwrap_or(text);
    (status, outcome)
}
