//! The PostgreSQL engine, black-box: the real `sekali` binary on a private PostgreSQL server
//! (tests/support/postgres.rs), where several instances share one database.
//!
//! - the same events sent to two instances at the same moment are applied once each: one
//!   answer `processed`, the other `duplicate`, one row, one order change and one email each,
//!   and each email sent by one instance only;
//! - the database restarted under load: 503s while it is down, then service again, with no
//!   restart of sekali and nothing acknowledged lost;
//! - a database a mistake names (a wrong password, an unreachable host, an unknown option, a
//!   schema from a newer sekali) refused at startup with a message that names it and no secret;
//! - a command on a database `serve` never used, or refused by the server, saying so;
//! - `sekali copy` from the embedded SQLite file to PostgreSQL and back, every row kept;
//! - a unix-socket URL (the host a percent-encoded directory) for `serve` and the commands.
//!
//! Without PostgreSQL installed, every test here passes after one line saying so (CI installs
//! it, and sets SEKALI_REQUIRE_POSTGRES=1, which makes its absence a failure).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[allow(dead_code)]
#[path = "api/helpers.rs"]
mod helpers;

use helpers::pg_cluster;
use helpers::ServeProcess;
use pg_cluster::Cluster;

/// The shared server, or `None` after printing (once) that these tests were skipped.
fn shared_cluster() -> Option<&'static Cluster> {
    let cluster = pg_cluster::shared();
    if cluster.is_none() {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("{}", pg_cluster::skip_note()));
    }
    cluster
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

/// Posts a signed Stripe delivery to the instance on `port` (see [`helpers::deliver_stripe`]).
fn deliver(agent: &ureq::Agent, port: u16, body: &[u8]) -> (u16, String) {
    helpers::deliver_stripe(agent, port, body)
}

/// `GET /healthz` of the instance on `port`: its status code and body.
fn healthz(agent: &ureq::Agent, port: u16) -> (u16, serde_json::Value) {
    let response = match agent
        .get(&format!("http://127.0.0.1:{port}/healthz"))
        .call()
    {
        Ok(response) | Err(ureq::Error::Status(_, response)) => response,
        Err(e) => panic!("GET /healthz: {e}"),
    };
    let status = response.status();
    let body = response.into_string().unwrap();
    (status, serde_json::from_str(&body).unwrap())
}

/// `GET /metrics` of the instance on `port`.
fn metrics(port: u16) -> String {
    agent()
        .get(&format!("http://127.0.0.1:{port}/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

/// The value of `series` (written exactly as in the scrape) in `scrape`; panics when missing,
/// as every series is there from startup.
fn metric(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} is not in the scrape"))
        .parse()
        .unwrap()
}

/// `sekali serve --db URL` with the tests' providers.
fn serve(url: &str, args: &[&str]) -> ServeProcess {
    ServeProcess::start_on(Some(Path::new(url)), helpers::PROVIDER_ENV, "warn", args)
}

fn count(cluster: &Cluster, database: &str, sql: &str) -> i64 {
    cluster
        .psql(database, sql)
        .trim()
        .parse()
        .unwrap_or_else(|e| {
            panic!("{sql}: {e}");
        })
}

/// Every `.eml` file under `dir`, by name.
fn emails_in(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".eml"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn the_same_events_sent_to_two_instances_at_once_are_applied_once_each() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let a = serve(&url, &[]);
    let b = serve(&url, &[]);
    const EVENTS: usize = 1000;
    let bodies = helpers::distinct_succeeded_bodies("race", EVENTS);
    // Per event: the answers `processed` it got (exactly one, at the end), and every answer.
    let processed = Mutex::new(vec![0_usize; EVENTS]);
    let pairs = Mutex::new(HashMap::<(String, String), usize>::new());
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                let (agent_a, agent_b) = (agent(), agent());
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= EVENTS {
                        return;
                    }
                    let body = &bodies[i];
                    // Both instances at the same moment.
                    let (first, second) = std::thread::scope(|both| {
                        let to_a = both.spawn(|| deliver(&agent_a, a.port, body));
                        let to_b = both.spawn(|| deliver(&agent_b, b.port, body));
                        (to_a.join().unwrap(), to_b.join().unwrap())
                    });
                    let mut answers = [first, second];
                    // A 503 is retried, as the provider would, until it is answered.
                    for (answer, port) in answers.iter_mut().zip([a.port, b.port]) {
                        let mut tries = 0;
                        while answer.0 == 503 && tries < 20 {
                            std::thread::sleep(Duration::from_millis(50));
                            *answer = deliver(&agent_a, port, body);
                            tries += 1;
                        }
                        assert_eq!(answer.0, 200, "event {i}: {answer:?}");
                    }
                    let mut outcomes = [answers[0].1.clone(), answers[1].1.clone()];
                    outcomes.sort();
                    processed.lock().unwrap()[i] +=
                        outcomes.iter().filter(|o| *o == "processed").count();
                    *pairs
                        .lock()
                        .unwrap()
                        .entry((outcomes[0].clone(), outcomes[1].clone()))
                        .or_default() += 1;
                }
            });
        }
    });
    let pairs = pairs.into_inner().unwrap();
    assert_eq!(
        pairs.get(&("duplicate".into(), "processed".into())),
        Some(&EVENTS),
        "each event: one `processed` and one `duplicate`: {pairs:?}"
    );
    assert!(processed.into_inner().unwrap().iter().all(|n| *n == 1));

    let rows = |sql: &str| count(cluster, &database, sql);
    assert_eq!(
        rows("SELECT count(*) FROM processed_events WHERE event_id LIKE 'evt\\_race\\_%'"),
        EVENTS as i64
    );
    assert_eq!(
        rows(
            "SELECT count(*) FROM orders WHERE order_id LIKE 'ord\\_race\\_%' AND status = 'paid'"
        ),
        EVENTS as i64
    );
    assert_eq!(
        rows("SELECT count(*) FROM order_transitions WHERE order_id LIKE 'ord\\_race\\_%'"),
        EVENTS as i64,
        "one change per order"
    );
    assert_eq!(
        rows("SELECT count(*) FROM email_outbox WHERE order_id LIKE 'ord\\_race\\_%'"),
        EVENTS as i64,
        "one receipt per order"
    );

    // Both instances' relays send: every receipt is sent, by one of them, once.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while rows("SELECT count(*) FROM email_outbox WHERE status <> 'sent'") > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "receipts still unsent after 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (from_a, from_b) = (emails_in(&a.mail_dir()), emails_in(&b.mail_dir()));
    let mut all: Vec<&String> = from_a.iter().chain(&from_b).collect();
    assert_eq!(all.len(), EVENTS, "{} + {}", from_a.len(), from_b.len());
    all.sort();
    all.dedup();
    assert_eq!(all.len(), EVENTS, "an email was written by both instances");

    // Each instance's /metrics counts what it did itself; together they account for the race.
    let (metrics_a, metrics_b) = (metrics(a.port), metrics(b.port));
    let both = |series: &str| {
        let (from_a, from_b) = (metric(&metrics_a, series), metric(&metrics_b, series));
        (from_a, from_b, from_a + from_b)
    };
    let processed = both(r#"sekali_deliveries_total{provider="stripe",outcome="processed"}"#);
    let duplicate = both(r#"sekali_deliveries_total{provider="stripe",outcome="duplicate"}"#);
    assert_eq!(processed.2, EVENTS as f64, "processed: {processed:?}");
    assert_eq!(duplicate.2, EVENTS as f64, "duplicate: {duplicate:?}");
    assert!(
        processed.0 > 0.0 && processed.1 > 0.0,
        "each instance won some races: {processed:?}"
    );
    let answered_200 = both(r#"sekali_webhook_responses_total{provider="stripe",code="200"}"#);
    assert_eq!(answered_200.2, 2.0 * EVENTS as f64, "{answered_200:?}");
    let sent = both(r#"sekali_relay_attempts_total{transport="file",result="sent"}"#);
    assert_eq!(
        sent.2, EVENTS as f64,
        "each receipt sent once, by one relay: {sent:?}"
    );
    // The backlog is the shared database's: both instances report the same.
    for instance in [&metrics_a, &metrics_b] {
        assert_eq!(
            metric(instance, r#"sekali_outbox_pending{outbox="email"}"#),
            0.0
        );
        assert!(metric(instance, "sekali_writer_commit_duration_seconds_count") > 0.0);
    }
    let (status_a, logs_a) = a.stop();
    let (status_b, logs_b) = b.stop();
    assert!(
        status_a.success() && status_b.success(),
        "{logs_a}\n{logs_b}"
    );
}

#[test]
fn the_database_restarted_under_load_answers_503_then_serves_again_without_a_restart() {
    // A server of its own: restarting the shared one would fail the other tests' deliveries.
    let Some(cluster) = shared_cluster().and_then(|_| Cluster::start()) else {
        return;
    };
    cluster.create_database("shop");
    let url = cluster.url("shop");
    let server = serve(&url, &["--no-relay"]);
    let bodies = helpers::distinct_succeeded_bodies("restart", 100_000);
    let stop = AtomicBool::new(false);
    let acknowledged = Mutex::new(Vec::new());
    let refused = Mutex::new(Vec::new());
    let after_restart = AtomicUsize::new(0);
    let restarted = AtomicBool::new(false);
    let sent = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let agent = agent();
                while !stop.load(Ordering::Relaxed) {
                    let i = sent.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { return };
                    let (status, outcome) = deliver(&agent, server.port, body);
                    match status {
                        200 => {
                            assert_eq!(outcome, "processed");
                            acknowledged.lock().unwrap().push(i);
                            if restarted.load(Ordering::Relaxed) {
                                after_restart.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        503 => refused.lock().unwrap().push(i),
                        other => panic!("event {i}: {other} {outcome}"),
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_millis(500));
        cluster.restart_fast();
        restarted.store(true, Ordering::Relaxed);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while after_restart.load(Ordering::Relaxed) < 200 {
            assert!(
                std::time::Instant::now() < deadline,
                "no service within 30 s of the restart: {}",
                server.logs_so_far()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let acknowledged = acknowledged.into_inner().unwrap();
    let refused = refused.into_inner().unwrap();
    assert!(
        !refused.is_empty(),
        "no delivery met the restart: {} acknowledged",
        acknowledged.len()
    );
    // Every acknowledged event is stored; each refused one, sent again, is applied once.
    let stored = count(&cluster, "shop", "SELECT count(*) FROM processed_events");
    let agent = agent();
    let mut recovered = 0;
    for &i in &refused {
        let (status, outcome) = deliver(&agent, server.port, &bodies[i]);
        assert_eq!(status, 200, "event {i}: {outcome}");
        // A 503 whose COMMIT had happened (its answer lost with the connection) is a duplicate.
        if outcome == "duplicate" {
            recovered += 1;
        }
    }
    assert!(stored >= acknowledged.len() as i64);
    let total = count(&cluster, "shop", "SELECT count(*) FROM processed_events");
    assert_eq!(total as usize, acknowledged.len() + refused.len());
    assert_eq!(
        count(
            &cluster,
            "shop",
            "SELECT count(*) FROM orders WHERE status = 'paid'"
        ) as usize,
        acknowledged.len() + refused.len()
    );
    eprintln!(
        "restart under load: {} acknowledged, {} answered 503 ({recovered} of them had committed)",
        acknowledged.len(),
        refused.len()
    );
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");
}

/// `sekali serve --db URL` that must refuse to start: its exit status and what it printed.
fn refused(url: &str, env: &[(&str, &str)]) -> String {
    let mut command = std::process::Command::new(helpers::sekali_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--db", url])
        .env("SEKALI_MIDTRANS_STATUS_CHECK", "off")
        .env_remove("PGPASSWORD");
    for (name, value) in helpers::PROVIDER_ENV.iter().chain(env) {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "it started: {printed}");
    printed
}

#[test]
fn a_database_url_with_a_mistake_is_refused_at_startup_naming_it_and_no_secret() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    // A role that must give its password (the server's other connections are trusted).
    cluster.psql(
        &database,
        "CREATE ROLE shop LOGIN PASSWORD 'right-horse-battery'",
    );
    let hba = cluster.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host all shop 127.0.0.1/32 scram-sha-256\n{rules}"),
    )
    .unwrap();
    cluster.psql(&database, "SELECT pg_reload_conf()");
    let port = cluster.port();

    let wrong = refused(
        &format!("postgres://shop:wrong-secret-pw@127.0.0.1:{port}/{database}"),
        &[],
    );
    assert!(wrong.contains("password authentication failed"), "{wrong}");
    assert!(
        wrong.contains(&format!("127.0.0.1:{port}/{database}")),
        "{wrong}"
    );
    assert!(!wrong.contains("wrong-secret-pw"), "{wrong}");

    // The same through PGPASSWORD, as libpq takes it.
    let from_env = refused(
        &format!("postgres://shop@127.0.0.1:{port}/{database}"),
        &[("PGPASSWORD", "wrong-secret-pw")],
    );
    assert!(
        from_env.contains("password authentication failed"),
        "{from_env}"
    );
    assert!(!from_env.contains("wrong-secret-pw"), "{from_env}");

    // Nothing listens on port 1.
    let unreachable = refused("postgres://shop:s3cret-pw@127.0.0.1:1/sekali", &[]);
    assert!(
        unreachable.contains("cannot connect to the database 127.0.0.1:1/sekali"),
        "{unreachable}"
    );
    assert!(!unreachable.contains("s3cret-pw"), "{unreachable}");

    let unknown = refused(
        &format!("postgres://shop:s3cret-pw@127.0.0.1:{port}/{database}?sslmod=disable"),
        &[],
    );
    assert!(unknown.contains("unknown option `sslmod`"), "{unknown}");
    assert!(!unknown.contains("s3cret-pw"), "{unknown}");

    // A database a newer sekali wrote.
    let newer = cluster.fresh_database();
    let url = cluster.url(&newer);
    let (status, logs) = serve(&url, &["--no-relay"]).stop();
    assert!(status.success(), "{logs}");
    cluster.psql(&newer, "UPDATE sekali_schema SET version = 99");
    let too_new = refused(&url, &[]);
    let known = sekali::store::sqlite::schema::SCHEMA_VERSION;
    assert!(
        too_new.contains(&format!(
            "the database has schema version 99; this sekali knows up to {known}"
        )),
        "{too_new}"
    );
}

/// `sekali ARGS…`, which must fail: what it printed to stderr.
fn command_fails(args: &[&str]) -> String {
    let output = std::process::Command::new(helpers::sekali_bin())
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{args:?} succeeded: {stderr}");
    stderr
}

/// A first user's two traps with a command: pointing it at a database `serve` never used (a
/// typo in the name, another database on the same server), and a server that refuses what the
/// command asks (a role without the rights). Each says what is wrong, not "db error".
#[test]
fn a_command_says_when_its_database_has_no_sekali_tables_and_what_the_server_refused() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let empty = command_fails(&["events", "list", "--db", &url]);
    assert!(
        empty.contains(&format!(
            "the database 127.0.0.1:{}/{database} (user postgres) holds no sekali tables (choose the database with --db or SEKALI_DB; sekali serve creates them)",
            cluster.port()
        )),
        "{empty}"
    );
    // Nothing was created by looking.
    assert_eq!(
        count(
            cluster,
            &database,
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ),
        0
    );

    let (status, logs) = serve(&url, &["--no-relay"]).stop();
    assert!(status.success(), "{logs}");
    let reader = format!("reader_{database}");
    cluster.psql(&database, &format!("CREATE ROLE {reader} LOGIN"));
    let as_reader = url.replace("postgres://postgres@", &format!("postgres://{reader}@"));
    let refused = command_fails(&["outbox", "list", "--db", &as_reader]);
    assert!(
        refused.contains("permission denied for table email_outbox"),
        "{refused}"
    );
}

/// `sekali --db D events list --json`-like listing of everything a copy must keep.
fn listing(db: &str) -> String {
    let run = |args: &[&str]| {
        let output = std::process::Command::new(helpers::sekali_bin())
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let events = run(&["events", "list", "--db", db, "--limit", "1000", "--json"]);
    let outbox = run(&["outbox", "list", "--db", db, "--limit", "1000", "--json"]);
    format!("{events}\n{outbox}")
}

#[test]
fn copy_moves_a_shop_from_sqlite_to_postgres_and_back_with_every_row() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shop.db");
    let file = file.to_str().unwrap();
    let server = ServeProcess::start_on(
        Some(Path::new(file)),
        helpers::PROVIDER_ENV,
        "warn",
        &["--no-relay"],
    );
    let agent = agent();
    for body in helpers::distinct_succeeded_bodies("copy", 25) {
        assert_eq!(deliver(&agent, server.port, &body).0, 200);
    }
    let refund = helpers::fixture("stripe/charge.refunded.full.json");
    assert_eq!(deliver(&agent, server.port, &refund).0, 200);
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");

    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let copy = |from: &str, to: &str| {
        std::process::Command::new(helpers::sekali_bin())
            .args(["copy", "--from", from, "--to", to])
            .output()
            .unwrap()
    };
    let copied = copy(file, &url);
    let said = String::from_utf8_lossy(&copied.stdout);
    assert!(
        copied.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    assert!(said.contains("processed_events: 26"), "{said}");
    assert_eq!(listing(&url), listing(file));

    // A target that holds a shop already is never merged into.
    let again = copy(file, &url);
    assert!(!again.status.success());
    let refusal = String::from_utf8_lossy(&again.stderr);
    assert!(
        refusal.contains("holds sekali's data already (processed_events has rows)"),
        "{refusal}"
    );

    // The new database works: a delivery sent to the old file's shop is a duplicate there.
    let server = serve(&url, &["--no-relay"]);
    let body = &helpers::distinct_succeeded_bodies("copy", 1)[0];
    assert_eq!(
        deliver(&agent, server.port, body),
        (200, "duplicate".to_owned())
    );
    let fresh = &helpers::distinct_succeeded_bodies("after", 1)[0];
    assert_eq!(
        deliver(&agent, server.port, fresh),
        (200, "processed".to_owned())
    );
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");

    // And back into a new file, which holds what PostgreSQL holds.
    let back = dir.path().join("back.db");
    let back = back.to_str().unwrap();
    let copied = copy(&url, back);
    assert!(
        copied.status.success(),
        "{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    assert_eq!(listing(back), listing(&url));
}

#[test]
fn a_failover_to_the_synchronous_standby_loses_no_acknowledged_delivery() {
    // A primary and its synchronous standby of their own: the primary is killed.
    let Some(primary) = shared_cluster().and_then(|_| Cluster::start_primary()) else {
        return;
    };
    // Before the standby exists, so that its base backup holds the database.
    primary.create_database("shop");
    let standby = primary.start_standby();
    let url = Cluster::multi_host_url(&primary, &standby, "shop");
    let server = serve(&url, &["--no-relay"]);
    let bodies = helpers::distinct_succeeded_bodies("failover", 100_000);
    let stop = AtomicBool::new(false);
    let acknowledged = Mutex::new(Vec::new());
    let refused = Mutex::new(Vec::new());
    // Answers other than 200 `processed` and 503: each fails the test.
    let wrong = Mutex::new(Vec::new());
    let after_promotion = AtomicUsize::new(0);
    let promoted = AtomicBool::new(false);
    let sent = AtomicUsize::new(0);
    let started = std::time::Instant::now();
    let mut switch = Duration::ZERO;
    let mut back = None;
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let agent = agent();
                while !stop.load(Ordering::Relaxed) {
                    let i = sent.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { return };
                    // sekali stays up through the switch: a provider only ever sees it answer.
                    match deliver(&agent, server.port, body) {
                        (200, outcome) if outcome == "processed" => {
                            acknowledged.lock().unwrap().push(i);
                            if promoted.load(Ordering::Relaxed) {
                                after_promotion.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        (503, _) => refused.lock().unwrap().push(i),
                        (status, outcome) => {
                            let answer = format!("event {i}: {status} {outcome}");
                            wrong.lock().unwrap().push(answer);
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_millis(500));
        let killed = std::time::Instant::now();
        primary.kill_postmaster();
        standby.promote();
        switch = killed.elapsed();
        promoted.store(true, Ordering::Relaxed);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
            if after_promotion.load(Ordering::Relaxed) >= 200 {
                back = Some(killed.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let wrong = wrong.into_inner().unwrap();
    assert!(
        wrong.is_empty(),
        "answers other than 200 and 503: {wrong:?}\n{}",
        server.logs_so_far()
    );
    let Some(back) = back else {
        panic!(
            "fewer than 200 deliveries acknowledged within 30 s of the promotion ({}): sekali \
             did not reconnect to the promoted standby\n{}",
            after_promotion.load(Ordering::Relaxed),
            server.logs_so_far()
        );
    };
    let acknowledged = acknowledged.into_inner().unwrap();
    let refused = refused.into_inner().unwrap();
    assert!(
        !refused.is_empty(),
        "no delivery met the failover: {} acknowledged",
        acknowledged.len()
    );

    // Every acknowledged event is on the promoted standby: the synchronous standby had flushed
    // each commit before the primary answered it.
    let event_id = |i: usize| format!("evt_failover_{i:02}");
    let stored: std::collections::HashSet<String> = standby
        .psql("shop", "SELECT event_id FROM processed_events")
        .lines()
        .map(str::to_owned)
        .collect();
    let lost: Vec<String> = acknowledged
        .iter()
        .map(|&i| event_id(i))
        .filter(|id| !stored.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged deliveries lost in the failover: {:?}",
        lost.len(),
        acknowledged.len(),
        &lost[..lost.len().min(20)]
    );

    // Each refused one, sent again, is answered: processed now, or a duplicate of a COMMIT
    // that reached the standby before the primary died (its answer lost with the connection).
    let agent = agent();
    let mut recovered = 0;
    for &i in &refused {
        let (status, outcome) = deliver(&agent, server.port, &bodies[i]);
        assert_eq!(status, 200, "event {i}: {outcome}");
        match outcome.as_str() {
            "duplicate" => recovered += 1,
            "processed" => {}
            other => panic!("event {i}: 200 {other}"),
        }
    }
    // Nothing applied twice, nothing else applied: each event is a distinct order's payment.
    let events = (acknowledged.len() + refused.len()) as i64;
    let rows = |sql: &str| count(&standby, "shop", sql);
    assert_eq!(rows("SELECT count(*) FROM processed_events"), events);
    assert_eq!(
        rows("SELECT count(*) FROM orders WHERE status = 'paid'"),
        events
    );
    assert_eq!(
        rows("SELECT count(*) FROM order_transitions"),
        events,
        "one change per order"
    );
    assert_eq!(
        rows("SELECT count(DISTINCT order_id) FROM order_transitions"),
        events
    );
    eprintln!(
        "failover under load: {} acknowledged, {} answered 503 ({recovered} of them had \
         committed); primary killed and standby promoted in {} ms, 200 acknowledged after the \
         promotion {} ms after the kill; {} ms in all",
        acknowledged.len(),
        refused.len(),
        switch.as_millis(),
        back.as_millis(),
        started.elapsed().as_millis()
    );
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");
}

#[test]
fn a_lock_held_elsewhere_past_the_lock_timeout_answers_503_and_then_the_delivery_goes_through() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let server = serve(&url, &["--no-relay"]);
    let agent = agent();
    let bodies = helpers::distinct_succeeded_bodies("locked", 2);
    assert_eq!(deliver(&agent, server.port, &bodies[0]).0, 200);
    // Another session (an operator's psql, a migration) holds the claims' table for 12 s: longer
    // than sekali's lock timeout (SQLite's busy timeout, 5 s), twice over, as /healthz's write
    // probe may wait in its writer's queue behind the delivery (up to one lock timeout) before
    // it waits on the lock itself (one more). With 8 s a CI run saw the probe start at 5 s and
    // get the table when the lock ended.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            cluster.psql(
                &database,
                "BEGIN; LOCK TABLE processed_events IN ACCESS EXCLUSIVE MODE; \
                 SELECT pg_sleep(12); COMMIT;",
            )
        });
        // Until the lock is held.
        let held = "SELECT count(*) FROM pg_locks WHERE relation = 'processed_events'::regclass \
                    AND mode = 'AccessExclusiveLock' AND granted";
        while count(cluster, &database, held) == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let started = std::time::Instant::now();
        // A load balancer asks at the same time: this instance takes no deliveries now.
        let health = scope.spawn(|| healthz(&agent, server.port));
        let (status, answer) = deliver(&agent, server.port, &bodies[1]);
        let waited = started.elapsed();
        assert_eq!(status, 503, "{answer}");
        assert!(
            waited < Duration::from_secs(7),
            "answered after {waited:?}: it waited for the lock, not the lock timeout"
        );
        let (status, health) = health.join().unwrap();
        assert_eq!(status, 503, "{health}");
        assert_eq!(health["components"]["database"]["status"], "unavailable");
    });
    std::thread::sleep(Duration::from_millis(1100)); // past the reuse of the last probe
    let (status, health) = healthz(&agent, server.port);
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["components"]["database"]["status"], "ok");
    // Released: the provider's retry goes through, once.
    assert_eq!(
        deliver(&agent, server.port, &bodies[1]),
        (200, "processed".to_owned())
    );
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");
    assert!(logs.contains("lock timeout"), "{logs}");
}

/// `POST /orders` to the instance on `port` under `key`: its status, whether it was a replay,
/// and its body.
fn create_order(agent: &ureq::Agent, port: u16, key: &str, body: &str) -> (u16, bool, String) {
    let answer = agent
        .post(&format!("http://127.0.0.1:{port}/orders"))
        .set("Authorization", "Bearer shop-token-1")
        .set("Idempotency-Key", key)
        .set("Content-Type", "application/json")
        .send_string(body);
    let response = match answer {
        Ok(response) | Err(ureq::Error::Status(_, response)) => response,
        Err(e) => return (0, false, e.to_string()),
    };
    let replayed = response.header("Idempotent-Replayed") == Some("true");
    (
        response.status(),
        replayed,
        response.into_string().unwrap_or_default(),
    )
}

/// `create_order` until it is not answered 409 (in flight elsewhere), as a client honouring
/// Retry-After does; returns the answer and how many 409s came first.
fn create_order_until_done(
    agent: &ureq::Agent,
    port: u16,
    key: &str,
    body: &str,
) -> ((u16, bool, String), usize) {
    let mut conflicts = 0;
    loop {
        let answer = create_order(agent, port, key, body);
        if answer.0 != 409 {
            return (answer, conflicts);
        }
        assert!(
            answer.2.contains("request-in-flight"),
            "409 says why: {}",
            answer.2
        );
        conflicts += 1;
        assert!(conflicts < 100, "still in flight after {conflicts} tries");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn api_env() -> Vec<(&'static str, &'static str)> {
    helpers::PROVIDER_ENV
        .iter()
        .copied()
        .chain([("SEKALI_API_TOKENS", "shop:shop-token-1")])
        .collect()
}

#[test]
fn the_same_order_request_sent_to_two_instances_at_once_runs_once_and_the_other_replays_it() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let env = api_env();
    let start = || ServeProcess::start_on(Some(Path::new(&url)), &env, "warn", &["--no-relay"]);
    let (a, b) = (start(), start());
    const REQUESTS: usize = 200;
    let next = AtomicUsize::new(0);
    let conflicts = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let (agent_a, agent_b) = (agent(), agent());
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= REQUESTS {
                        return;
                    }
                    let key = format!("key-{i}");
                    let body = format!(
                        r#"{{"order_id": "ord_twice_{i}", "amount": 150000, "currency": "IDR", "provider": "midtrans"}}"#
                    );
                    // Each side retries a 409 (the other instance had the key in flight) until
                    // it gets the answer.
                    let ((first, c1), (second, c2)) = std::thread::scope(|both| {
                        let to_a =
                            both.spawn(|| create_order_until_done(&agent_a, a.port, &key, &body));
                        let to_b =
                            both.spawn(|| create_order_until_done(&agent_b, b.port, &key, &body));
                        (to_a.join().unwrap(), to_b.join().unwrap())
                    });
                    conflicts.fetch_add(c1 + c2, Ordering::Relaxed);
                    let mut pair = [(first.0, first.1), (second.0, second.1)];
                    pair.sort();
                    assert_eq!(
                        pair,
                        [(201, false), (201, true)],
                        "request {i}: one runs, the other replays its answer: {first:?} {second:?}"
                    );
                    assert_eq!(first.2, second.2, "request {i}: the replay is byte for byte");
                }
            });
        }
    });
    eprintln!(
        "{REQUESTS} keys sent to two instances at once: {} answers of 409 (in flight on the other) before the replay",
        conflicts.load(Ordering::Relaxed)
    );
    let rows = |sql: &str| count(cluster, &database, sql);
    assert_eq!(rows("SELECT count(*) FROM orders"), REQUESTS as i64);
    assert_eq!(
        rows("SELECT count(*) FROM idempotency_keys"),
        REQUESTS as i64
    );
    assert_eq!(
        rows("SELECT count(*) FROM order_transitions"),
        REQUESTS as i64,
        "each order created once"
    );
    for server in [a, b] {
        let (status, logs) = server.stop();
        assert!(status.success(), "{logs}");
    }
}

#[test]
fn an_order_request_in_flight_on_one_instance_gets_409_on_another_then_its_replay() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let env = api_env();
    let start = || ServeProcess::start_on(Some(Path::new(&url)), &env, "warn", &["--no-relay"]);
    let (a, b) = (start(), start());
    let body =
        r#"{"order_id": "ord_slow", "amount": 150000, "currency": "IDR", "provider": "midtrans"}"#;
    // Another session holds the orders table against writes for 3 s (shorter than the lock
    // timeout): instance A's request under the key waits in its transaction, in flight.
    let (on_a, on_b, retried) = std::thread::scope(|scope| {
        scope.spawn(|| {
            cluster.psql(
                &database,
                "BEGIN; LOCK TABLE orders IN SHARE MODE; SELECT pg_sleep(3); COMMIT;",
            )
        });
        let held = "SELECT count(*) FROM pg_locks WHERE relation = 'orders'::regclass \
                    AND mode = 'ShareLock' AND granted";
        while count(cluster, &database, held) == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let to_a = scope.spawn(|| create_order(&agent(), a.port, "slow-key", body));
        let waiting = "SELECT count(*) FROM pg_locks WHERE relation = 'orders'::regclass \
                       AND NOT granted";
        while count(cluster, &database, waiting) == 0 {
            assert!(!to_a.is_finished(), "A did not wait for the lock");
            std::thread::sleep(Duration::from_millis(20));
        }
        let on_b = create_order(&agent(), b.port, "slow-key", body);
        let on_a = to_a.join().unwrap();
        let retried = create_order(&agent(), b.port, "slow-key", body);
        (on_a, on_b, retried)
    });
    assert_eq!(on_b.0, 409, "in flight on A: {on_b:?}");
    assert!(on_b.2.contains("request-in-flight"), "{on_b:?}");
    assert_eq!((on_a.0, on_a.1), (201, false), "{on_a:?}");
    assert_eq!(
        (retried.0, retried.1),
        (201, true),
        "B's retry replays A's answer: {retried:?}"
    );
    assert_eq!(retried.2, on_a.2, "byte for byte");
    assert_eq!(count(cluster, &database, "SELECT count(*) FROM orders"), 1);
    for server in [a, b] {
        let (status, logs) = server.stop();
        assert!(status.success(), "{logs}");
    }
}

/// Both schemas give each table the same columns in the same order (PostgreSQL's
/// `processed_events` its `rowid` after version 8's columns, SQLite's implicit, as a migration
/// adds later columns after it): what a copy between them relies on.
#[test]
fn the_postgresql_schema_has_every_table_and_column_of_the_sqlite_one() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let (status, logs) = serve(&cluster.url(&database), &["--no-relay"]).stop();
    assert!(status.success(), "{logs}");
    for (table, columns) in sekali::store::copy::TABLES {
        let listed = cluster.psql(
            &database,
            &format!(
                "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) \
                 FROM information_schema.columns WHERE table_name = '{table}'"
            ),
        );
        let mut expected: Vec<&str> = columns.to_vec();
        if *table == "processed_events" {
            expected.remove(0);
            let after_version_8 = expected.iter().position(|c| *c == "parked_event").unwrap() + 1;
            expected.insert(after_version_8, "rowid");
        }
        // The change feed's place, which PostgreSQL alone needs (SQLite's is the id).
        if *table == "order_transitions" {
            expected.push("position");
        }
        assert_eq!(listed.trim(), expected.join(","), "{table}");
    }
}

/// `GET /changes` read while two instances on one database take deliveries: a reader that
/// pages 50 at a time from the cursor it stored, on one instance then the other, sees every
/// change exactly once, and each order's changes in its own order (numbered 1, 2, 3, ... and
/// each starting where the one before ended), however the instances' transactions interleave.
/// Each order's four events (pending, paid, partly refunded, refunded) go to both instances,
/// alternately, from four threads that take four orders' events at a time, so that batches mix
/// orders and one order's changes are written by both instances.
#[test]
fn the_change_feed_read_from_both_instances_under_load_shows_each_change_once_in_order() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let env = api_env();
    let start = || ServeProcess::start_on(Some(Path::new(&url)), &env, "warn", &["--no-relay"]);
    let (a, b) = (start(), start());
    let ports = [a.port, b.port];
    // 608 events: each order's four, blocks of four orders' events mixed (the four threads take
    // a block's first events together, then its second, ...).
    const ORDERS: usize = 152;
    let lifecycle = [
        "payment_intent.processing",
        "payment_intent.succeeded",
        "charge.refunded.partial",
        "charge.refunded.full",
    ]
    .map(|name| String::from_utf8(helpers::fixture(&format!("stripe/{name}.json"))).unwrap());
    let bodies: Vec<Vec<u8>> = (0..ORDERS / 4)
        .flat_map(|block| (0..4).flat_map(move |step| (0..4).map(move |k| (block * 4 + k, step))))
        .map(|(i, step)| {
            lifecycle[step]
                .replace("Order1001", &format!("OrderFeed{i}"))
                .replace("ord_1001", &format!("ord_feed_{i}"))
                .replace("\"evt_", &format!("\"evt_feed{i}_"))
                .into_bytes()
        })
        .collect();
    assert_eq!(bodies.len(), ORDERS * 4);
    let next = AtomicUsize::new(0);
    let delivered = AtomicBool::new(false);
    let changes_in_db = || count(cluster, &database, "SELECT count(*) FROM order_transitions");
    let (seen, pages) = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let agent = agent();
            let mut seen: Vec<serde_json::Value> = Vec::new();
            let mut after: Option<String> = None;
            let mut pages = 0_usize;
            let mut deadline = std::time::Instant::now() + Duration::from_secs(120);
            loop {
                let port = ports[pages % 2];
                pages += 1;
                let query = match &after {
                    Some(cursor) => format!("after={cursor}&limit=50"),
                    None => "limit=50".to_owned(),
                };
                let answer = agent
                    .get(&format!("http://127.0.0.1:{port}/changes?{query}"))
                    .set("Authorization", "Bearer shop-token-1")
                    .call();
                let text = match answer {
                    Ok(response) => response.into_string().unwrap(),
                    Err(e) => panic!("GET /changes?{query} on {port}: {e}"),
                };
                let page: serde_json::Value = serde_json::from_str(&text).unwrap();
                let changes = page["changes"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{text}"));
                assert!(changes.len() <= 50, "{} changes", changes.len());
                if changes.is_empty() {
                    assert_eq!(
                        page["next_after"].as_str(),
                        after.as_deref(),
                        "an empty page gives the cursor back"
                    );
                    if delivered.load(Ordering::SeqCst) {
                        if seen.len() as i64 >= changes_in_db() {
                            return (seen, pages);
                        }
                    } else {
                        deadline = std::time::Instant::now() + Duration::from_secs(60);
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "60 s after the last delivery the feed has shown {} of {} changes",
                        seen.len(),
                        changes_in_db()
                    );
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                seen.extend(changes.iter().cloned());
                let cursor = page["next_after"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{text}"));
                after = Some(cursor.to_owned());
            }
        });
        let senders: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let agent = agent();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(body) = bodies.get(i) else { return };
                        // An order's events alternate between the instances.
                        let port = ports[(i + i / 4) % 2];
                        let mut answer = deliver(&agent, port, body);
                        let mut tries = 0;
                        while answer.0 == 503 && tries < 50 {
                            std::thread::sleep(Duration::from_millis(50));
                            answer = deliver(&agent, port, body);
                            tries += 1;
                        }
                        assert_eq!(answer.0, 200, "event {i}: {answer:?}");
                    }
                })
            })
            .collect();
        let sent: Vec<_> = senders.into_iter().map(|s| s.join()).collect();
        delivered.store(true, Ordering::SeqCst);
        let seen = reader.join();
        for result in sent {
            if let Err(panic) = result {
                std::panic::resume_unwind(panic);
            }
        }
        seen.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });

    // Each change once, and every change there is.
    let ids: Vec<&str> = seen.iter().map(|c| c["id"].as_str().unwrap()).collect();
    let distinct: std::collections::HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len(), "a change was seen twice");
    assert_eq!(seen.len() as i64, changes_in_db());
    let rows: std::collections::HashSet<String> = cluster
        .psql(&database, "SELECT 'chg_' || id FROM order_transitions")
        .lines()
        .map(|line| line.trim().to_owned())
        .filter(|line| !line.is_empty())
        .collect();
    assert_eq!(
        distinct,
        rows.iter().map(String::as_str).collect(),
        "the feed's ids are the rows' ids"
    );
    // Each order's changes in its own order, ending where the order is.
    let mut by_order: HashMap<&str, Vec<&serde_json::Value>> = HashMap::new();
    for change in &seen {
        by_order
            .entry(change["order_id"].as_str().unwrap())
            .or_default()
            .push(change);
    }
    assert_eq!(by_order.len(), ORDERS, "every order has changes");
    let mut out_of_order = Vec::new();
    for (order_id, changes) in &by_order {
        let sequences: Vec<i64> = changes
            .iter()
            .map(|c| c["sequence"].as_i64().unwrap())
            .collect();
        let chained = changes.iter().enumerate().all(|(k, c)| {
            let before = k.checked_sub(1).map(|k| &changes[k]["status"]);
            c["previous_status"] == *before.unwrap_or(&serde_json::Value::Null)
        });
        if sequences != (1..=changes.len() as i64).collect::<Vec<_>>() || !chained {
            let story: Vec<String> = changes
                .iter()
                .map(|c| {
                    format!(
                        "{} #{} {}->{}",
                        c["id"], c["sequence"], c["previous_status"], c["status"]
                    )
                })
                .collect();
            out_of_order.push(format!("{order_id}: {}", story.join(", ")));
        }
        let status = cluster.psql(
            &database,
            &format!("SELECT status FROM orders WHERE order_id = '{order_id}'"),
        );
        assert_eq!(
            changes.last().unwrap()["status"].as_str(),
            Some(status.trim()),
            "{order_id}: the last change is where the order is"
        );
    }
    assert!(
        out_of_order.is_empty(),
        "{} of {ORDERS} orders' changes came in another order than their sequence: {:#?}",
        out_of_order.len(),
        &out_of_order[..out_of_order.len().min(10)]
    );
    eprintln!(
        "change feed under load: {} changes of {ORDERS} orders seen once each in {pages} pages",
        seen.len()
    );
    for server in [a, b] {
        let (status, logs) = server.stop();
        assert!(status.success(), "{logs}");
    }
}

/// One page of `GET /changes` from the instance on `port`, after `after`: its changes' order
/// ids and statuses, and its `next_after`.
fn feed_page(port: u16, after: Option<&str>) -> (Vec<(String, String)>, Option<String>) {
    let query = after.map_or(String::new(), |a| format!("?after={a}"));
    let text = agent()
        .get(&format!("http://127.0.0.1:{port}/changes{query}"))
        .set("Authorization", "Bearer shop-token-1")
        .call()
        .unwrap_or_else(|e| panic!("GET /changes{query}: {e}"))
        .into_string()
        .unwrap();
    let page: serde_json::Value = serde_json::from_str(&text).unwrap();
    let changes = page["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["order_id"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (changes, page["next_after"].as_str().map(str::to_owned))
}

/// The case a feed by row id gets wrong: instance A takes the lower id for its change, then
/// waits (another session holds the emails' table), while instance B writes a change with the
/// higher id and commits. A reader sees B's change, and stores its cursor; once A commits, A's
/// change comes after that cursor: not skipped, as a feed by id would skip it (its id is below
/// the cursor).
#[test]
fn a_change_that_commits_after_a_later_one_is_not_skipped_by_a_stored_cursor() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let env = api_env();
    let start = || ServeProcess::start_on(Some(Path::new(&url)), &env, "warn", &["--no-relay"]);
    let (a, b) = (start(), start());
    let paid = helpers::distinct_succeeded_bodies("feedorder", 1).remove(0);
    // A's change, once it has taken its id, waits for the test's advisory lock 4242: a trigger
    // holds the transaction that records a change of A's order.
    cluster.psql(
        &database,
        "CREATE FUNCTION wait_for_the_test() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_advisory_xact_lock_shared(4242); RETURN NEW; END $$; \
         CREATE TRIGGER wait_for_the_test AFTER INSERT ON order_transitions FOR EACH ROW \
         WHEN (NEW.order_id = 'ord_feedorder_00') EXECUTE FUNCTION wait_for_the_test();",
    );
    let lock_4242 = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 0 \
                     AND objid = 4242 AND objsubid = 1";
    let first_page = std::thread::scope(|scope| {
        scope.spawn(|| {
            cluster.psql(
                &database,
                "SELECT pg_advisory_lock(4242); SELECT pg_sleep(3); SELECT pg_advisory_unlock(4242);",
            )
        });
        let held = format!("{lock_4242} AND granted");
        while count(cluster, &database, &held) == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        // A's payment creates its order, records the change (the lower id), and then waits.
        let on_a = scope.spawn(|| deliver(&agent(), a.port, &paid));
        let waiting = format!("{lock_4242} AND NOT granted");
        while count(cluster, &database, &waiting) == 0 {
            assert!(!on_a.is_finished(), "A did not wait for the lock");
            std::thread::sleep(Duration::from_millis(20));
        }
        // B creates an order (no email): the higher id, committed first.
        let body = r#"{"order_id": "ord_later", "amount": 150000, "currency": "IDR", "provider": "midtrans"}"#;
        assert_eq!(create_order(&agent(), b.port, "later", body).0, 201);
        let first_page = feed_page(b.port, None);
        assert_eq!(on_a.join().unwrap(), (200, "processed".to_owned()));
        first_page
    });
    let (first, cursor) = first_page;
    assert_eq!(
        first,
        [("ord_later".to_owned(), "pending".to_owned())],
        "while A's change is not committed, the feed shows B's alone"
    );
    let ids: Vec<i64> = cluster
        .psql(
            &database,
            "SELECT string_agg(id::text, ',' ORDER BY id) FROM order_transitions",
        )
        .trim()
        .split(',')
        .map(|id| id.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
    let (rest, _) = feed_page(a.port, cursor.as_deref());
    assert_eq!(
        rest.len(),
        1,
        "A's change comes after the stored cursor: {rest:?}"
    );
    assert_eq!(rest[0].1, "paid");
    assert_ne!(rest[0].0, "ord_later");
    // It is the case a feed by id gets wrong: A's change has the lower id.
    let a_id = count(
        cluster,
        &database,
        "SELECT id FROM order_transitions WHERE order_id <> 'ord_later'",
    );
    assert!(a_id < ids[1], "A's change took the lower id ({ids:?})");
    for server in [a, b] {
        let (status, logs) = server.stop();
        assert!(status.success(), "{logs}");
    }
}

/// The shop's endpoint for the forwarding tests: tests/support/forward_receiver.py, which
/// verifies each message with the official Standard Webhooks package (`python3` on PATH must
/// have it), answers 500 to `fail_ratio` of them, and logs each answer as a JSON line.
struct ForwardReceiver {
    child: std::process::Child,
    port: u16,
}

impl ForwardReceiver {
    fn start(secret: &str, fail_ratio: f64, log: &Path) -> ForwardReceiver {
        use std::io::BufRead;
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/forward_receiver.py");
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .arg(secret)
            .arg(fail_ratio.to_string())
            .arg(log)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 (with the standardwebhooks package) runs the receiver");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Ok(port) = line.trim().parse() else {
            let _ = child.kill();
            panic!(
                "the receiver printed no port ({line:?}): {:?}",
                child.wait()
            );
        };
        ForwardReceiver { child, port }
    }
}

impl Drop for ForwardReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the two instances forwarded, as the receiver logged it.
struct Forwarded {
    /// Every answer, in the order they were given.
    answers: Vec<serde_json::Value>,
    /// Each order's number of changes, in the database.
    changes: HashMap<String, usize>,
    /// The `chg_<id>` of every change in the database.
    change_ids: std::collections::HashSet<String>,
    /// Each order's status, in the database.
    statuses: HashMap<String, String>,
    /// Log lines of changes forwarded, per instance.
    per_instance: [usize; 2],
    /// `forward_outbox` rows that are not `sent` (status, attempts), and the attempts of those
    /// that are.
    unsent: String,
    attempts: Vec<i64>,
}

impl Forwarded {
    fn of(&self, answer: &str) -> Vec<&serde_json::Value> {
        self.answers
            .iter()
            .filter(|a| a["answer"] == answer)
            .collect()
    }

    /// Each order's accepted changes, first arrival only, in the order they were accepted:
    /// their sequences. Also checks each message's body against its `webhook-id`.
    fn first_accepted_sequences(&self) -> HashMap<String, Vec<i64>> {
        let mut seen = std::collections::HashSet::new();
        let mut by_order: HashMap<String, Vec<i64>> = HashMap::new();
        for accepted in self.of("accepted") {
            let id = accepted["id"].as_str().unwrap();
            let body = &accepted["body"];
            assert_eq!(
                body["id"].as_str(),
                Some(id),
                "the body is the change it names"
            );
            if seen.insert(id.to_owned()) {
                by_order
                    .entry(body["order_id"].as_str().unwrap().to_owned())
                    .or_default()
                    .push(body["sequence"].as_i64().unwrap());
            }
        }
        by_order
    }
}

/// Two instances on one database, both forwarding to the receiver (answering 500 to
/// `fail_ratio` of the messages), take ~100 orders' lifecycles (4 Stripe events each) split
/// between them; returns once every change is `sent` (or panics after 120 s).
fn forward_lifecycles_from_two_instances(tag: &str, fail_ratio: f64) -> Option<Forwarded> {
    let cluster = shared_cluster()?;
    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let made = std::process::Command::new(helpers::sekali_bin())
        .args(["forward", "new-secret"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let secret = String::from_utf8(made.stdout).unwrap().trim().to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let receiver = ForwardReceiver::start(&secret, fail_ratio, &log);
    let endpoint = format!("http://127.0.0.1:{}/hooks/sekali", receiver.port);
    let mut env = api_env();
    env.push(("SEKALI_FORWARD_URL", &endpoint));
    env.push(("SEKALI_FORWARD_SECRET", &secret));
    let start = || {
        ServeProcess::start_on(
            Some(Path::new(&url)),
            &env,
            "warn,sekali::jobs::forward=debug",
            &["--relay-base-delay", "100ms", "--relay-max-delay", "1s"],
        )
    };
    let (a, b) = (start(), start());
    let ports = [a.port, b.port];

    const ORDERS: usize = 100;
    let lifecycle = [
        "payment_intent.processing",
        "payment_intent.succeeded",
        "charge.refunded.partial",
        "charge.refunded.full",
    ]
    .map(|name| String::from_utf8(helpers::fixture(&format!("stripe/{name}.json"))).unwrap());
    // Blocks of four orders' events, mixed: the four senders take a block's first events
    // together, then its second, ...
    let bodies: Vec<Vec<u8>> = (0..ORDERS / 4)
        .flat_map(|block| (0..4).flat_map(move |step| (0..4).map(move |k| (block * 4 + k, step))))
        .map(|(i, step)| {
            lifecycle[step]
                .replace("Order1001", &format!("Order{tag}{i}"))
                .replace("ord_1001", &format!("ord_{tag}_{i}"))
                .replace("\"evt_", &format!("\"evt_{tag}{i}_"))
                .into_bytes()
        })
        .collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let agent = agent();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { return };
                    // An order's events alternate between the instances.
                    let port = ports[(i + i / 4) % 2];
                    let mut answer = deliver(&agent, port, body);
                    let mut tries = 0;
                    while answer.0 == 503 && tries < 50 {
                        std::thread::sleep(Duration::from_millis(50));
                        answer = deliver(&agent, port, body);
                        tries += 1;
                    }
                    assert_eq!(answer.0, 200, "event {i}: {answer:?}");
                }
            });
        }
    });

    let rows = |sql: &str| count(cluster, &database, sql);
    let changes_in_db = rows("SELECT count(*) FROM order_transitions");
    assert!(
        changes_in_db >= ORDERS as i64,
        "{changes_in_db} changes of {ORDERS} orders"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while rows("SELECT count(*) FROM forward_outbox WHERE status = 'sent'") < changes_in_db {
        assert!(
            std::time::Instant::now() < deadline,
            "120 s after the last delivery, {} of {changes_in_db} changes are forwarded: {}",
            rows("SELECT count(*) FROM forward_outbox WHERE status = 'sent'"),
            cluster.psql(
                &database,
                "SELECT status, count(*), max(attempts), max(last_error) FROM forward_outbox \
                 GROUP BY status"
            )
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let lines = |sql: &str| -> Vec<String> {
        cluster
            .psql(&database, sql)
            .lines()
            .map(|line| line.trim().to_owned())
            .filter(|line| !line.is_empty())
            .collect()
    };
    let pairs = |sql: &str| -> HashMap<String, String> {
        lines(sql)
            .iter()
            .map(|line| {
                let (key, value) = line.split_once(' ').unwrap();
                (key.to_owned(), value.to_owned())
            })
            .collect()
    };
    let changes =
        pairs("SELECT order_id || ' ' || count(*) FROM order_transitions GROUP BY order_id")
            .into_iter()
            .map(|(order, n)| (order, n.parse().unwrap()))
            .collect();
    let statuses = pairs("SELECT order_id || ' ' || status FROM orders");
    let change_ids = lines("SELECT 'chg_' || id FROM order_transitions")
        .into_iter()
        .collect();
    let unsent = cluster.psql(
        &database,
        "SELECT string_agg(status || ':' || attempts, ',') FROM forward_outbox \
         WHERE status <> 'sent'",
    );
    let attempts = lines("SELECT attempts FROM forward_outbox")
        .iter()
        .map(|n| n.parse().unwrap())
        .collect();
    let mut per_instance = [0; 2];
    for (k, server) in [a, b].into_iter().enumerate() {
        let (status, logs) = server.stop();
        assert!(status.success(), "{logs}");
        per_instance[k] = logs.matches("change forwarded").count();
    }
    drop(receiver);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let answers = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    Some(Forwarded {
        answers,
        changes,
        change_ids,
        statuses,
        per_instance,
        unsent,
        attempts,
    })
}

/// What both forwarding tests assert: every change arrived, signed as Standard Webhooks say;
/// each order's changes arrived first in their order (1, 2, 3, ...), ending where the order
/// is, though two instances forwarded them; every row is `sent`; both instances forwarded.
fn assert_every_change_arrived_in_order(forwarded: &Forwarded) {
    assert!(
        forwarded.of("rejected").is_empty(),
        "messages that did not verify: {:?}",
        forwarded.of("rejected")
    );
    let accepted: std::collections::HashSet<String> = forwarded
        .of("accepted")
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        accepted, forwarded.change_ids,
        "every change, and only changes"
    );
    let sequences = forwarded.first_accepted_sequences();
    assert_eq!(sequences.len(), forwarded.changes.len());
    let mut out_of_order = Vec::new();
    for (order_id, got) in &sequences {
        let n = forwarded.changes[order_id] as i64;
        if *got != (1..=n).collect::<Vec<_>>() {
            out_of_order.push(format!("{order_id}: {got:?}"));
        }
    }
    assert!(
        out_of_order.is_empty(),
        "{} of {} orders' changes arrived out of order: {:#?}",
        out_of_order.len(),
        sequences.len(),
        &out_of_order[..out_of_order.len().min(10)]
    );
    // The last change of each order to arrive is where the order is.
    let mut last: HashMap<&str, (i64, &str)> = HashMap::new();
    for accepted in forwarded.of("accepted") {
        let body = &accepted["body"];
        let (order, sequence) = (
            body["order_id"].as_str().unwrap(),
            body["sequence"].as_i64().unwrap(),
        );
        let entry = last.entry(order).or_insert((0, ""));
        if sequence >= entry.0 {
            *entry = (sequence, body["status"].as_str().unwrap());
        }
    }
    for (order, (_, status)) in &last {
        assert_eq!(
            Some(*status),
            forwarded.statuses.get(*order).map(String::as_str),
            "{order}"
        );
    }
    assert_eq!(forwarded.unsent.trim(), "", "rows not sent");
    assert!(
        forwarded.per_instance.iter().all(|n| *n > 0),
        "both instances forward: {:?}",
        forwarded.per_instance
    );
}

/// Forwarding from two instances on one database, to a shop that answers every message 200:
/// every change arrives exactly once (no two instances ever send one change, nor one instance
/// twice), each order's in its order, each row `sent` after one attempt.
#[test]
fn two_instances_forward_each_change_exactly_once_and_each_orders_changes_in_order() {
    let Some(forwarded) = forward_lifecycles_from_two_instances("fwdonce", 0.0) else {
        return;
    };
    assert_every_change_arrived_in_order(&forwarded);
    let ids: Vec<&str> = forwarded
        .answers
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    let distinct: std::collections::HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(
        ids.len(),
        distinct.len(),
        "a webhook-id arrived twice ({} messages, {} changes)",
        ids.len(),
        distinct.len()
    );
    assert!(forwarded.of("failed").is_empty());
    assert!(
        forwarded.attempts.iter().all(|n| *n == 1),
        "attempts: {:?}",
        forwarded.attempts
    );
    eprintln!(
        "forwarding, two instances: {} changes once each ({:?} per instance)",
        ids.len(),
        forwarded.per_instance
    );
}

/// The same, to a shop that answers 500 to a fifth of the messages: every change still
/// arrives, and each order's first arrivals are in its order (a change that failed holds its
/// order's later ones back until it is accepted); every row ends `sent`.
#[test]
fn two_instances_forward_every_change_in_order_through_a_shop_that_fails_a_fifth() {
    let Some(forwarded) = forward_lifecycles_from_two_instances("fwdfail", 0.2) else {
        return;
    };
    assert_every_change_arrived_in_order(&forwarded);
    let failed = forwarded.of("failed").len();
    assert!(failed > 0, "the shop failed none: nothing was retried");
    assert!(forwarded.attempts.iter().any(|n| *n > 1));
    eprintln!(
        "forwarding through failures: {} answers, {failed} of them 500, {:?} per instance",
        forwarded.answers.len(),
        forwarded.per_instance
    );
}

/// The purge runs in every instance at once without getting in each other's way or in the
/// deliveries': two instances with a 2 s retention each purge every second while both take a
/// stream of new deliveries. Every delivery is answered 200 `processed` (no 5xx from a purge
/// holding a lock), every id past its retention is deleted exactly once (the passes' counts add
/// up to the deliveries), the orders stay, and neither instance's purge pass stops on an error
/// (a conflict between them would be a warning in its log). Expiry times are whole seconds, so
/// which instance finds a second's expired ids depends on whose pass comes first after it.
#[test]
fn two_instances_purge_the_same_database_while_both_take_deliveries() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let args = [
        "--no-relay",
        "--stripe-retention",
        "2s",
        "--purge-interval",
        "1s",
    ];
    // At info, each purge pass logs what it deleted.
    let start =
        || ServeProcess::start_on(Some(Path::new(&url)), helpers::PROVIDER_ENV, "info", &args);
    let (a, b) = (start(), start());
    const EVENTS: usize = 600;
    let bodies = helpers::distinct_succeeded_bodies("purge2", EVENTS);
    let next = AtomicUsize::new(0);
    let answers = Mutex::new(HashMap::<(u16, String), usize>::new());
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let (next, answers, bodies) = (&next, &answers, &bodies);
            let port = if thread % 2 == 0 { a.port } else { b.port };
            scope.spawn(move || {
                let agent = agent();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { return };
                    let answer = deliver(&agent, port, body);
                    *answers.lock().unwrap().entry(answer).or_default() += 1;
                    // Spread over about six seconds: the purges of both instances run between
                    // and among the deliveries, on rows that expire as they go.
                    std::thread::sleep(Duration::from_millis(40));
                }
            });
        }
    });
    let answers = answers.into_inner().unwrap();
    assert_eq!(
        answers,
        HashMap::from([((200, "processed".to_owned()), EVENTS)]),
        "every delivery applied, none refused while both purged"
    );
    assert!(
        started.elapsed() > Duration::from_secs(4),
        "the deliveries spanned several purge passes"
    );
    // Past the last delivery's retention, both purge passes have run again.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while count(cluster, &database, "SELECT count(*) FROM processed_events") > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "expired ids were not purged: {} left",
            count(cluster, &database, "SELECT count(*) FROM processed_events")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        count(cluster, &database, "SELECT count(*) FROM orders"),
        EVENTS as i64,
        "the purge deletes event ids, never orders"
    );
    let mut purged_by = Vec::new();
    for server in [a, b] {
        let (status, logs) = server.stop();
        assert!(status.success(), "{logs}");
        assert!(!logs.contains("purge pass stopped early"), "{logs}");
        // "purged N expired event ids and M expired idempotency keys", one line a pass.
        let passes: Vec<usize> = logs
            .lines()
            .filter_map(|line| line.split("purged ").nth(1))
            .filter_map(|rest| rest.split(' ').next()?.parse().ok())
            .collect();
        assert!(!passes.is_empty(), "this instance ran purge passes: {logs}");
        purged_by.push(passes.iter().sum::<usize>());
    }
    assert_eq!(
        purged_by.iter().sum::<usize>(),
        EVENTS,
        "each expired id deleted once, by one instance or the other: {purged_by:?}"
    );
    eprintln!("{EVENTS} expired ids purged by two instances at once: {purged_by:?}");
}

/// The console on two instances of one database: a login on one is a session on the other
/// (nothing kept per instance), an action through the other is applied once, and a logout on
/// either ends the session on both, even for a copy of its cookie.
#[test]
fn a_console_session_from_one_instance_works_on_the_other_until_it_logs_out() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let url = cluster.url(&database);
    let env: Vec<(&str, &str)> = helpers::PROVIDER_ENV
        .iter()
        .copied()
        .chain([("SEKALI_CONSOLE_TOKENS", "ops-ana:console-token-1")])
        .collect();
    let start = || ServeProcess::start_on(Some(Path::new(&url)), &env, "warn", &["--no-relay"]);
    let (a, b) = (start(), start());
    let bodies = helpers::distinct_succeeded_bodies("console", 1);
    assert_eq!(deliver(&agent(), a.port, &bodies[0]).0, 200);

    // A browser-like client: no redirects followed, the cookie sent by hand.
    let client = ureq::AgentBuilder::new().redirects(0).build();
    let answer = |request: ureq::Request, form: Option<&[(&str, &str)]>| match match form {
        Some(form) => request.send_form(form),
        None => request.call(),
    } {
        Ok(response) | Err(ureq::Error::Status(_, response)) => response,
        Err(e) => panic!("{e}"),
    };
    let at = |port: u16, path: &str| format!("http://127.0.0.1:{port}{path}");
    let login = answer(
        client.post(&at(a.port, "/console/login")),
        Some(&[("token", "console-token-1")]),
    );
    assert_eq!(login.status(), 303);
    let cookie = login
        .header("set-cookie")
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_owned();
    let page = |port: u16, path: &str| {
        let response = answer(client.get(&at(port, path)).set("Cookie", &cookie), None);
        (response.status(), response.into_string().unwrap())
    };
    let (status, order_page) = page(b.port, "/console/orders/ord_console_00");
    assert_eq!(status, 200, "the session from A, on B: {order_page}");
    let csrf = order_page
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let set = answer(
        client
            .post(&at(b.port, "/console/orders/ord_console_00/status"))
            .set("Cookie", &cookie),
        Some(&[
            ("csrf", csrf.as_str()),
            ("status", "needs_review"),
            ("reason", "the customer called"),
        ]),
    );
    assert_eq!(set.status(), 303, "a set-status through B");
    assert_eq!(
        count(
            cluster,
            &database,
            "SELECT count(*) FROM order_transitions WHERE actor = 'ops-ana' \
             AND reason = 'the customer called'"
        ),
        1
    );

    let logout = answer(
        client
            .post(&at(b.port, "/console/logout"))
            .set("Cookie", &cookie),
        Some(&[("csrf", csrf.as_str())]),
    );
    assert_eq!(logout.status(), 303);
    for port in [a.port, b.port] {
        let (status, _) = page(port, "/console/orders/ord_console_00");
        assert_eq!(
            status, 303,
            "the copy of the cookie after the logout, on {port}"
        );
    }
    for server in [a, b] {
        let (status, logs) = server.stop();
        assert!(status.success(), "{logs}");
    }
}

/// A private CA and a server certificate it signed for 127.0.0.1 and localhost: (CA PEM,
/// server certificate PEM, server key PEM).
fn test_certificates() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "sekali test CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&server_key, &ca, &ca_key)
        .unwrap();
    (ca.pem(), server.pem(), server_key.serialize_pem())
}

/// `sslmode=require`: sekali's connections to the server are encrypted, and it takes deliveries;
/// the server's certificate is verified against `PGSSLROOTCERT` (without it, a private CA's
/// certificate is refused at startup, naming the problem and no password); libpq's
/// `verify-full` is read as the same; and without TLS asked for, the connections are plain.
#[test]
fn with_sslmode_require_every_connection_is_tls_to_a_verified_server() {
    if shared_cluster().is_none() {
        return;
    }
    let (ca_pem, cert_pem, key_pem) = test_certificates();
    let cluster = Cluster::start_with_tls(&cert_pem, &key_pem).expect("PostgreSQL is installed");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let ca_path = ca_file.to_str().unwrap();
    let database = cluster.fresh_database();
    let url = |mode: &str| {
        format!(
            "postgres://postgres:s3cret-pw@127.0.0.1:{}/{database}?sslmode={mode}",
            cluster.port()
        )
    };
    let env_with = |extra: &[(&'static str, &str)]| -> Vec<(&str, String)> {
        helpers::PROVIDER_ENV
            .iter()
            .map(|(k, v)| (*k, (*v).to_owned()))
            .chain(extra.iter().map(|(k, v)| (*k, (*v).to_owned())))
            .collect()
    };
    let encrypted = "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
                     FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                     WHERE a.application_name LIKE 'sekali%'";

    for mode in ["require", "verify-full"] {
        let env = env_with(&[("PGSSLROOTCERT", ca_path)]);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let server =
            ServeProcess::start_on(Some(Path::new(&url(mode))), &env, "warn", &["--no-relay"]);
        let bodies = helpers::distinct_succeeded_bodies(&format!("tls_{}", mode.len()), 3);
        for body in &bodies {
            assert_eq!(
                deliver(&agent(), server.port, body).0,
                200,
                "sslmode={mode}"
            );
        }
        let counts = cluster.psql(&database, encrypted);
        let (tls, plain) = counts.trim().split_once('|').unwrap();
        assert!(tls.parse::<u32>().unwrap() > 0, "sslmode={mode}: {counts}");
        assert_eq!(plain, "0", "sslmode={mode}: a plain connection: {counts}");
        let (status, logs) = server.stop();
        assert!(status.success(), "{logs}");
    }

    // A certificate of a CA sekali was not told of: refused before anything is served.
    let env = env_with(&[]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let message = refused(&url("require"), &env);
    assert!(
        message.contains("cannot connect to the database"),
        "{message}"
    );
    assert!(message.to_lowercase().contains("certificate"), "{message}");
    assert!(!message.contains("s3cret-pw"), "{message}");
    // A PGSSLROOTCERT that is not there, or not certificates: refused, naming it.
    let missing = dir.path().join("no-such-ca.pem");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    for (file, says) in [
        (&missing, "cannot be read"),
        (&not_pem, "holds no certificate"),
    ] {
        let message = refused(
            &url("require"),
            &[("PGSSLROOTCERT", file.to_str().unwrap())],
        );
        assert!(
            message.contains(&format!("PGSSLROOTCERT={}: {says}", file.display())),
            "{message}"
        );
    }

    // Without TLS asked for, the same server is used in the clear, as before.
    let server = ServeProcess::start_on(
        Some(Path::new(&url("prefer"))),
        helpers::PROVIDER_ENV,
        "warn",
        &["--no-relay"],
    );
    assert_eq!(
        deliver(
            &agent(),
            server.port,
            &helpers::distinct_succeeded_bodies("tls_plain", 1)[0]
        )
        .0,
        200
    );
    let counts = cluster.psql(&database, encrypted);
    assert!(counts.trim().starts_with("0|"), "prefer: {counts}");
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");
    cluster.stop();
}

#[test]
fn a_unix_socket_url_serves_deliveries_and_the_commands_over_the_socket() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let database = cluster.fresh_database();
    let url = cluster.socket_url(&database);
    let server = serve(&url, &["--no-relay"]);
    let bodies = helpers::distinct_succeeded_bodies("socket", 3);
    for body in &bodies {
        assert_eq!(deliver(&agent(), server.port, body).0, 200);
    }
    assert_eq!(deliver(&agent(), server.port, &bodies[0]).1, "duplicate");
    // Every connection of sekali's is local: no client address, as a socket has none.
    let connections = cluster.psql(
        &database,
        "SELECT count(*) FILTER (WHERE client_addr IS NULL), \
                count(*) FILTER (WHERE client_addr IS NOT NULL) \
         FROM pg_stat_activity \
         WHERE application_name LIKE 'sekali%' AND datname = current_database()",
    );
    let (socket, tcp) = connections.trim().split_once('|').unwrap();
    assert!(socket.parse::<u32>().unwrap() > 0, "{connections}");
    assert_eq!(tcp, "0", "a TCP connection: {connections}");
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");

    // The commands that take --db reach the same rows the same way.
    let events = listing(&url);
    for body in &bodies {
        let event: serde_json::Value = serde_json::from_slice(body).unwrap();
        let id = event["id"].as_str().unwrap();
        assert!(events.contains(id), "{id} is not listed: {events}");
    }

    // TLS cannot be checked against a socket: refused, naming the setting.
    let message = refused(&format!("{url}?sslmode=require"), &[]);
    assert!(
        message.contains("sslmode=require needs a TCP host"),
        "{message}"
    );
}

/// `--pg-writers` (or `SEKALI_PG_WRITERS`) sets how many writers an instance runs, each a
/// connection of its own that shows as `sekali writer` in `pg_stat_activity`, and deliveries go
/// through with one as with several. A SQLite database, which has one writer, refuses it at
/// startup rather than ignore it.
#[test]
fn pg_writers_sets_the_writer_connections_of_an_instance_and_sqlite_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shop.db");
    let message = refused(file.to_str().unwrap(), &[("SEKALI_PG_WRITERS", "3")]);
    assert!(
        message.contains("--pg-writers (SEKALI_PG_WRITERS) is 3")
            && message.contains("is SQLite, which has one writer"),
        "{message}"
    );
    assert!(!file.exists(), "the refused database was created");

    let Some(cluster) = shared_cluster() else {
        return;
    };
    for writers in [1_i64, 3] {
        let database = cluster.fresh_database();
        let server = ServeProcess::start_on(
            Some(Path::new(&cluster.url(&database))),
            helpers::PROVIDER_ENV,
            "info",
            &["--no-relay", "--pg-writers", &writers.to_string()],
        );
        let bodies = helpers::distinct_succeeded_bodies(&format!("writers{writers}"), 12);
        std::thread::scope(|scope| {
            for body in &bodies {
                scope.spawn(|| assert_eq!(deliver(&agent(), server.port, body).0, 200));
            }
        });
        assert_eq!(deliver(&agent(), server.port, &bodies[0]).1, "duplicate");
        assert_eq!(
            count(
                cluster,
                &database,
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'sekali writer' AND datname = current_database()"
            ),
            writers,
            "writer connections with --pg-writers {writers}"
        );
        assert!(
            server
                .logs_so_far()
                .contains(&format!("pg_writers={writers}")),
            "the startup line says how many: {}",
            server.logs_so_far()
        );
        assert_eq!(
            count(cluster, &database, "SELECT count(*) FROM processed_events"),
            12
        );
        let (status, logs) = server.stop();
        assert!(status.success(), "{logs}");
    }
}
