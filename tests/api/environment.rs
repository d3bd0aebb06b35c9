//! Faults of the environment (disk full, a lock held by another process) and operations that
//! must be safe under load (backup), against the real server and its database. The faults are
//! those of a SQLite file, and skipped on PostgreSQL; the backup runs on both engines.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::future::join_all;

use crate::helpers::*;

/// A Stripe `payment_intent.succeeded` body for order `n`, about 2 KB.
fn succeeded_body(n: usize) -> Vec<u8> {
    String::from_utf8(fixture("stripe/payment_intent.succeeded.json"))
        .unwrap()
        .replace("evt_1QA0002succeeded000001", &format!("evt_env_{n:05}"))
        .replace("ord_1001", &format!("ord_env_{n:05}"))
        .replace("pi_3QA0001Order1001", &format!("pi_env_{n:05}"))
        .into_bytes()
}

#[actix_web::test]
async fn a_full_disk_answers_503_writes_nothing_half_and_recovers_when_space_returns() {
    // The disk fills through SQLite's max_page_count, a cap on the file's pages.
    if sqlite_only("a full SQLite file (max_page_count)") {
        return;
    }
    let app = spawn_app_with(|s| {
        s.max_page_count = Some(120); // 480 KB with 4 KB pages: full after a few dozen events
        s.purge_interval = Duration::from_millis(100);
    })
    .await;
    let start = app.clock.now_unix();
    let mut acked = Vec::new();
    let mut refused = Vec::new();
    for n in 0..400 {
        let answer = app.deliver_stripe_body(&succeeded_body(n)).await;
        match answer.status {
            200 => acked.push(n),
            503 => refused.push(n),
            other => panic!("delivery {n}: unexpected {other} {:?}", answer.body),
        }
        if refused.len() >= 5 {
            break;
        }
    }
    assert!(
        acked.len() >= 10 && refused.len() == 5,
        "acked {} refused {}",
        acked.len(),
        refused.len()
    );

    let conn = rusqlite::Connection::open_with_flags(
        app.database.file(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let stored: i64 = conn
        .query_row("SELECT count(*) FROM processed_events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        stored as usize,
        acked.len(),
        "every 2xx is stored, no 503 is"
    );
    for n in &refused {
        let id = format!("evt_env_{n:05}");
        let (events, orders, outbox): (i64, i64, i64) = conn
            .query_row(
                "SELECT (SELECT count(*) FROM processed_events WHERE event_id = ?1),
                        (SELECT count(*) FROM orders WHERE last_event_id = ?1),
                        (SELECT count(*) FROM email_outbox WHERE event_id = ?1)",
                [&id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(
            (events, orders, outbox),
            (0, 0, 0),
            "{id} left nothing half-written"
        );
    }
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(conn);

    // Space returns: the retention runs out and the purge job frees the pages of the old ids.
    app.clock.set(start + 31 * 24 * 3600);
    let mut recovered = false;
    for _ in 0..100 {
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        if app.count("SELECT count(*) FROM processed_events") == 0 {
            recovered = true;
            break;
        }
    }
    assert!(recovered, "the purge ran on the full database");
    for n in &refused {
        let answer = app.deliver_stripe_body(&succeeded_body(*n)).await;
        assert_eq!(
            (answer.status, answer.outcome()),
            (200, "processed"),
            "redelivery of {n} after space returned"
        );
    }
}

/// A `sqlite3` shell holding a write transaction on `db` until dropped.
struct Sqlite3Shell {
    child: std::process::Child,
}

impl Sqlite3Shell {
    fn begin_immediate(db: &std::path::Path) -> Self {
        let mut child = Command::new("sqlite3")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the sqlite3 shell is installed (.ci/run installs it)");
        let stdin = child.stdin.as_mut().unwrap();
        stdin
            .write_all(b"BEGIN IMMEDIATE;\nSELECT 'holding the write lock';\n")
            .unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "holding the write lock");
        Sqlite3Shell { child }
    }

    fn rollback_and_quit(mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"ROLLBACK;\n.quit\n").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

#[actix_web::test]
async fn a_sqlite3_shell_holding_the_write_lock_gets_deliveries_a_503_never_a_false_2xx() {
    // The lock is SQLite's file lock, and busy_timeout SQLite's wait for it.
    if sqlite_only("the sqlite3 shell holding the SQLite file's write lock") {
        return;
    }
    let app = spawn_app_with(|s| s.busy_timeout = Duration::from_millis(300)).await;
    let db_path = app.database.file().to_owned();
    let shell =
        actix_web::rt::task::spawn_blocking(move || Sqlite3Shell::begin_immediate(&db_path))
            .await
            .unwrap();

    let bodies: Vec<Vec<u8>> = (0..5).map(succeeded_body).collect();
    let answers = join_all(bodies.iter().map(|body| app.deliver_stripe_body(body))).await;
    for answer in &answers {
        assert_eq!(answer.status, 503, "{:?}", answer.body);
        assert_eq!(
            answer.error(),
            "temporarily unable to record the event; retry later",
            "no SQLITE_BUSY leaks"
        );
    }
    // A load balancer asking now is told to send deliveries elsewhere, and why.
    let (status, health) = app.healthz().await;
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["status"], "unavailable");
    assert_eq!(health["components"]["database"]["status"], "unavailable");
    let problem = health["components"]["database"]["problem"]
        .as_str()
        .unwrap();
    assert!(problem.contains("does not take writes"), "{problem}");
    assert!(
        !problem.contains(".db"),
        "no file path in a public answer: {problem}"
    );
    actix_web::rt::task::spawn_blocking(move || shell.rollback_and_quit())
        .await
        .unwrap();
    assert_eq!(app.row_counts(), (0, 0, 0));
    app.clock.advance(Duration::from_secs(2)); // past the reuse of the last probe's result
    let (status, health) = app.healthz().await;
    assert_eq!(
        (status, &health["status"]),
        (200, &serde_json::json!("ok")),
        "{health}"
    );

    for n in 0..5 {
        assert_eq!(
            app.deliver_stripe_body(&succeeded_body(n)).await.outcome(),
            "processed"
        );
    }
}

#[actix_web::test]
async fn a_backup_taken_while_deliveries_continue_is_whole_and_holds_the_dedup_rows() {
    let app = spawn_app().await;
    for n in 0..50 {
        app.deliver_stripe_body(&succeeded_body(n)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("copy.db");
    let (db, out_path) = (app.db_arg(), out.clone());
    let backup = actix_web::rt::task::spawn_blocking(move || {
        Command::new(sekali_bin())
            .args(["backup", "--db"])
            .arg(&db)
            .arg(&out_path)
            .output()
            .unwrap()
    });
    // Keep delivering while the copy is taken.
    let load = join_all((50..450).map(|n| {
        let body = succeeded_body(n);
        let app = &app;
        async move { app.deliver_stripe_body(&body).await.status }
    }));
    let (backup, statuses) = futures_util::future::join(backup, load).await;
    let backup = backup.unwrap();
    assert!(backup.status.success(), "{backup:?}");
    assert!(statuses.iter().all(|s| *s == 200));
    let stdout = String::from_utf8_lossy(&backup.stdout);
    assert!(stdout.contains("integrity ok"), "{stdout}");

    let copy = rusqlite::Connection::open(&out).unwrap();
    let check: String = copy
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let copied: i64 = copy
        .query_row("SELECT count(*) FROM processed_events", [], |r| r.get(0))
        .unwrap();
    assert!((50..=450).contains(&copied), "copied {copied}");
    // Every copied dedup row is a real one, with its order and email.
    let orphaned: i64 = copy
        .query_row(
            "SELECT count(*) FROM processed_events e
             WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = e.order_id)
                OR NOT EXISTS (SELECT 1 FROM email_outbox m WHERE m.event_id = e.event_id)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphaned, 0, "the copy is transactionally consistent");

    let again = Command::new(sekali_bin())
        .args(["backup", "--db"])
        .arg(app.db_arg())
        .arg(&out)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("refusing to overwrite"));

    let nowhere = dir.path().join("missing").join("copy.db");
    let refused = Command::new(sekali_bin())
        .args(["backup", "--db"])
        .arg(app.db_arg())
        .arg(&nowhere)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot write the backup {}: the directory {} does not exist",
            nowhere.display(),
            dir.path().join("missing").display()
        )),
        "{stderr}"
    );
}

/// Makes a file unwritable for this process for as long as it lives, so SQLite opens it
/// read-only, as it would a file of another user's: read-only permissions, or, for root, whom
/// permissions do not stop, the immutable attribute (`chattr +i`).
struct Unwritable(std::path::PathBuf);

impl Unwritable {
    fn set(path: &std::path::Path) -> Self {
        if is_root() {
            let status = Command::new("chattr").arg("+i").arg(path).status();
            assert!(
                status.is_ok_and(|s| s.success()),
                "chattr +i {} needs the chattr command (e2fsprogs) and a file system with \
                 attributes",
                path.display()
            );
        } else {
            let mut permissions = std::fs::metadata(path).unwrap().permissions();
            permissions.set_readonly(true);
            std::fs::set_permissions(path, permissions).unwrap();
        }
        Unwritable(path.to_owned())
    }
}

impl Drop for Unwritable {
    fn drop(&mut self) {
        if is_root() {
            let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        }
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[actix_web::test]
async fn a_database_file_sekali_cannot_write_is_refused_at_start_not_answered_503_forever() {
    // A file's permissions (or chattr +i): a PostgreSQL server's files are not sekali's.
    if sqlite_only("a SQLite file sekali cannot write") {
        return;
    }
    let app = spawn_app().await;
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    app.stop().await;
    let db_path = app.database.file();
    let _unwritable = Unwritable::set(db_path);

    let mut serve = Command::new(sekali_bin())
        .args(["serve", "--no-relay", "--listen", "127.0.0.1:0", "--db"])
        .arg(db_path)
        .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Started anyway, it would report healthy and answer every delivery 503.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = serve.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            serve.kill().unwrap();
            panic!("serve started on a database file it cannot write");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut serve.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("can only be opened read-only; sekali must be able to write it"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("sekali is listening"),
        "it never said it listens: {stderr}"
    );

    // The maintenance commands that write say the same; the one that only reads still works.
    let purge = Command::new(sekali_bin())
        .args(["purge", "--db"])
        .arg(db_path)
        .output()
        .unwrap();
    assert!(!purge.status.success());
    assert!(String::from_utf8_lossy(&purge.stderr).contains("can only be opened read-only"));
    let list = Command::new(sekali_bin())
        .args(["events", "list", "--db"])
        .arg(db_path)
        .output()
        .unwrap();
    assert!(list.status.success(), "{list:?}");
    assert!(String::from_utf8_lossy(&list.stdout).contains("payment_intent.succeeded"));
}

#[test]
fn nothing_secret_reaches_the_logs_even_at_trace_level() {
    let both_secrets = format!("{STRIPE_SECRET},{STRIPE_SECRET_NEXT}");
    let server = ServeProcess::start(
        &[
            ("STRIPE_WEBHOOK_SECRET", &both_secrets),
            ("MIDTRANS_SERVER_KEY", MIDTRANS_KEY),
        ],
        "trace",
    );
    let base = server.base_url();
    let mut forbidden: Vec<String> = vec![
        STRIPE_SECRET.into(),
        STRIPE_SECRET_NEXT.into(),
        MIDTRANS_KEY.into(),
    ];
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let post = |path: &str, body: &[u8], signature: Option<&str>| {
        let mut request = agent
            .post(&format!("{base}{path}"))
            .set("Content-Type", "application/json");
        if let Some(s) = signature {
            request = request.set("Stripe-Signature", s);
        }
        match request.send_bytes(body) {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{e}"),
        }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for (name, _) in STRIPE_IN_ORDER {
        let body = fixture(&format!("stripe/{name}.json"));
        let header = stripe_header(&body, now);
        forbidden.push(header.split("v1=").nth(1).unwrap().to_owned());
        assert_eq!(post("/webhooks/stripe", &body, Some(&header)), 200);
        // and forged: a signature that is not ours
        let forged = format!("t={now},v1={}", "ab".repeat(32));
        assert_eq!(post("/webhooks/stripe", &body, Some(&forged)), 401);
    }
    for name in MIDTRANS_IN_ORDER {
        let body = sign_midtrans(&fixture(&format!("midtrans/{name}.json")));
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        forbidden.push(value["signature_key"].as_str().unwrap().to_owned());
        assert_eq!(post("/webhooks/midtrans", &body, None), 200);
    }
    assert_eq!(
        post(
            "/webhooks/stripe",
            b"{\"receipt_email\": \"leak@example.com\"}",
            Some("t=1,v1=00")
        ),
        401
    );
    forbidden.extend(
        [
            "ana@example.com",
            "budi@example.com",
            "citra@example.com",
            "dewi@example.com",
            "eko@example.com",
            "leak@example.com",
        ]
        .map(String::from),
    );
    // Distinctive fragments of raw bodies.
    forbidden.extend(
        [
            "\"object\": \"payment_intent\"",
            "\"transaction_status\"",
            "va_numbers",
        ]
        .map(String::from),
    );

    let (status, logs) = server.stop();
    assert!(status.success());
    assert!(logs.contains("delivery recorded"), "trace logging was on");
    for needle in &forbidden {
        assert!(!logs.contains(needle.as_str()), "the logs contain {needle}");
    }
}

#[test]
fn at_the_default_level_a_rejection_names_its_provider_and_a_success_logs_nothing() {
    let server = ServeProcess::start(&[("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)], "info");
    let base = server.base_url();
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let post = |body: &[u8], signature: &str| match agent
        .post(&format!("{base}/webhooks/stripe"))
        .set("Content-Type", "application/json")
        .set("Stripe-Signature", signature)
        .send_bytes(body)
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{e}"),
    };
    let body = fixture("stripe/payment_intent.succeeded.json");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert_eq!(post(&body, &stripe_header(&body, now)), 200);
    assert_eq!(post(&body, &format!("t={now},v1={}", "ab".repeat(32))), 401);

    let (status, logs) = server.stop();
    assert!(status.success());
    let rejected: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("delivery rejected"))
        .collect();
    assert_eq!(rejected.len(), 1, "{logs}");
    assert!(rejected[0].contains("provider=stripe"), "{logs}");
    assert!(rejected[0].contains("status=401"), "{logs}");
    assert!(
        !logs.contains("evt_1QA0002succeeded000001"),
        "the delivery that succeeded is not logged at info: {logs}"
    );
}

/// Fails on the version that said only `unable to open database file: ro/x.db`: the path as
/// given, and nothing about why.
#[test]
fn a_database_that_cannot_be_created_is_named_by_its_absolute_path_with_the_reason() {
    // The directory of a SQLite file, as the test names it (it starts no server of the switch).
    if sqlite_only("a SQLite file in a missing or unwritable directory") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let serve = |db: &str| {
        let output = Command::new(sekali_bin())
            .args(["serve", "--no-relay", "--listen", "127.0.0.1:0", "--db", db])
            .current_dir(dir.path())
            .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
            .output()
            .unwrap();
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let absolute = dir.path().canonicalize().unwrap();
    let missing = serve("no-such-dir/sekali.db");
    assert!(
        missing.contains(&format!(
            "cannot open the database file {}/no-such-dir/sekali.db: the directory {}/no-such-dir does not exist",
            absolute.display(),
            absolute.display()
        )),
        "{missing}"
    );
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    let _unwritable = Unwritable::set(&locked);
    let refused = serve("locked/sekali.db");
    assert!(
        refused.contains(&format!(
            "the directory {}/locked is not writable by this user",
            absolute.display()
        )),
        "{refused}"
    );
}

/// Fails on the version where actix logged a stranger's unparsable request at ERROR: an operator
/// alerting on errors was paged for every port scan.
#[test]
fn a_malformed_request_is_logged_at_the_level_of_a_4xx_not_as_an_error() {
    use std::io::{Read, Write};
    let server = ServeProcess::start_with(
        &[("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)],
        "info",
        &["--no-relay"],
    );
    for request in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"GET /\x1b[31m HTTP/1.1\r\n\r\n",
    ] {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        stream.write_all(request).unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    }
    let (_, logs) = server.stop();
    assert!(logs.contains("request parse error"), "{logs}");
    assert!(
        !logs.lines().any(|l| l.contains(" ERROR ")),
        "nothing at ERROR: {logs}"
    );
}
