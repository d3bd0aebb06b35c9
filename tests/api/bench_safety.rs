//! `sekali bench` against a database that holds real orders (issue 30): the real binary. With
//! `--check-db` it refuses to send beside orders that are not its own unless `--force`; without
//! it, it warns that it cannot see the database; and `--cleanup` removes every row and `.eml`
//! file of the run, and nothing else.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::*;

/// `sekali bench --url url args…`, signing as Stripe with the test secret.
fn bench(url: &str, args: &[&str]) -> Output {
    Command::new(sekali_bin())
        .args(["bench", "--url", url])
        .args(args)
        .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
        .output()
        .unwrap()
}

/// [`bench`] off the test's event loop, for a server in this process.
async fn bench_in_process(url: String, args: Vec<String>) -> Output {
    actix_web::rt::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        bench(&url, &args)
    })
    .await
    .unwrap()
}

/// The JSON line of bench's report.
fn report(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let first = stdout
        .lines()
        .next()
        .unwrap_or_else(|| panic!("{output:?}"));
    serde_json::from_str(first).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Every row of every table sekali writes, as text, by table: what a run must leave as it was.
fn database_rows(db: &Database) -> BTreeMap<&'static str, Vec<String>> {
    let mut tables = BTreeMap::new();
    for (table, order) in [
        ("processed_events", "provider, event_id"),
        ("orders", "order_id"),
        ("order_transitions", "id"),
        ("payments", "provider, payment_ref"),
        ("payment_refunds", "provider, payment_ref, refund_id"),
        ("payment_disputes", "provider, payment_ref, dispute_id"),
        ("payment_aliases", "provider, alias"),
        ("email_outbox", "id"),
        ("idempotency_keys", "client, key"),
    ] {
        let rows = db.query(&format!("SELECT * FROM {table} ORDER BY {order}"));
        let rows = rows.iter().map(|values| format!("{values:?}")).collect();
        tables.insert(table, rows);
    }
    tables
}

/// Every file in `dir`, by name, with its text.
fn files(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            (
                entry.file_name().into_string().unwrap(),
                String::from_utf8_lossy(&std::fs::read(entry.path()).unwrap()).into_owned(),
            )
        })
        .collect()
}

/// Fails on the version that sent its thousands of paid orders into any database: a user who
/// pointed bench at the shop's server (and named its database) got them beside the real ones.
#[actix_web::test]
async fn bench_refuses_a_database_with_real_orders_without_force_and_sends_nothing() {
    let app = spawn_app().await;
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    let before = database_rows(&app.database);
    let url = format!("{}/webhooks/stripe", app.address);
    let db = app.db_arg();
    let args = |extra: &[&str]| {
        [
            &["--events", "40", "--concurrency", "2", "--check-db", &db],
            extra,
        ]
        .concat()
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
    };

    let refused = bench_in_process(url.clone(), args(&[])).await;
    assert!(!refused.status.success(), "{refused:?}");
    assert!(refused.stdout.is_empty(), "no report: {refused:?}");
    let message = stderr(&refused);
    for words in [
        &format!("--check-db {db} holds 1 order that is not the load generator's (ord_1001)"),
        "bench would add up to 40 paid orders beside them",
        &format!("`sekali backup --db {db} COPY`"),
        "--check-db COPY",
        "pass --force",
    ] {
        assert!(message.contains(words), "{words:?} missing from: {message}");
    }
    assert_eq!(database_rows(&app.database), before, "nothing was sent");

    let forced = bench_in_process(url, args(&["--force"])).await;
    assert!(forced.status.success(), "{forced:?}");
    assert_eq!(report(&forced)["check_db"], "ok");
    assert!(
        stderr(&forced).contains("--force: writing up to 40 paid orders"),
        "{forced:?}"
    );
    assert_eq!(app.order("ord_1001"), ("paid".into(), 2500, 0));
    assert_eq!(app.count("SELECT count(*) FROM orders"), 41);
}

/// A database whose every order is some run's is no shop's: bench sends without a word.
#[actix_web::test]
async fn bench_sends_into_a_database_of_earlier_runs_without_force() {
    let app = spawn_app().await;
    let url = format!("{}/webhooks/stripe", app.address);
    let db = app.db_arg();
    for _ in 0..2 {
        let args = ["--events", "20", "--concurrency", "2", "--check-db", &db];
        let output = bench_in_process(url.clone(), args.map(str::to_owned).to_vec()).await;
        assert!(output.status.success(), "{output:?}");
        assert!(!stderr(&output).contains("warning"), "{output:?}");
    }
    assert_eq!(app.count("SELECT count(*) FROM orders"), 40);
}

/// Fails on the version that sent without a word: bench cannot know whose database is behind
/// the URL, and must say so, with what it will write there.
#[actix_web::test]
async fn bench_without_check_db_warns_that_it_cannot_see_the_database_and_what_it_writes() {
    let app = spawn_app().await;
    let output = bench_in_process(
        format!("{}/webhooks/stripe", app.address),
        ["--events", "20", "--concurrency", "2"]
            .map(str::to_owned)
            .to_vec(),
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    let run_id = report(&output)["run_id"].as_str().unwrap().to_owned();
    let warning = stderr(&output);
    assert!(warning.starts_with("warning: "), "{warning}");
    for words in [
        &format!(
            "without --check-db, bench cannot see the database of the server at {}/webhooks/stripe",
            app.address
        ),
        "cannot tell whether it holds real orders",
        &format!("write up to 20 paid orders there (bench_{run_id}_0, bench_{run_id}_1, …)"),
        "a receipt for each, which the server's relay sends",
        "`sekali backup`",
        "--check-db",
    ] {
        assert!(warning.contains(words), "{words:?} missing from: {warning}");
    }
}

/// Waits until `path` exists, at most 10 s.
fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never came", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A real order and its receipt, sent by the relay, then a run with `--check-db --force
/// --cleanup` against the same `sekali serve`, whose relay sends the run's receipts while it
/// runs. Afterwards the database and the mail directory are exactly as before the run: every
/// row and file of the run is gone, the real order's are untouched. Fails on the version
/// without `--cleanup` (clap refuses it), and with a cleanup that removed files by anything
/// but the run's own email keys (the mail directory would lose the real receipt or keep the
/// run's).
#[test]
fn bench_cleanup_leaves_nothing_of_the_run_and_the_real_order_and_its_email_untouched() {
    let server = ServeProcess::start(&[("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)], "warn");
    let db = server.db();
    let mail = server.mail_dir();
    let body = fixture("stripe/payment_intent.succeeded.json");
    let header = stripe_header(&body, sekali::clock::SystemClock.now_unix());
    let answer = ureq::post(&format!("{}/webhooks/stripe", server.base_url()))
        .set("Content-Type", "application/json")
        .set("Stripe-Signature", &header)
        .send_bytes(&body)
        .unwrap();
    assert_eq!(answer.status(), 200);
    let key = db.texts("SELECT idempotency_key FROM email_outbox WHERE order_id = 'ord_1001'");
    let [key] = &key[..] else {
        panic!("one receipt: {key:?}")
    };
    wait_for_file(&mail.join(format!("{key}.eml")));
    // Its row is marked sent once the file is durable.
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.count("SELECT count(*) FROM email_outbox WHERE status = 'sent'") < 1 {
        assert!(Instant::now() < deadline, "the real receipt was never sent");
        std::thread::sleep(Duration::from_millis(20));
    }
    let rows_before = database_rows(db);
    let files_before = files(&mail);
    assert_eq!(files_before.len(), 1, "{:?}", files_before.keys());

    let output = bench(
        &format!("{}/webhooks/stripe", server.base_url()),
        &[
            "--events",
            "300",
            "--dup-ratio",
            "0.2",
            "--concurrency",
            "8",
            "--check-db",
            &db.arg(),
            "--force",
            "--cleanup",
            "--mail-dir",
            mail.to_str().unwrap(),
        ],
    );
    assert!(output.status.success(), "{output:?}");
    let report = report(&output);
    assert_eq!(report["check_db"], "ok", "{output:?}");
    let cleaned = &report["cleanup"]["done"];
    assert_eq!(cleaned["orders"], 300, "{output:?}");
    assert_eq!(cleaned["events"], 300, "{output:?}");
    assert_eq!(cleaned["emails"], 300, "{output:?}");
    assert_eq!(cleaned["transitions"], 300, "{output:?}");
    assert_eq!(cleaned["payments"], 300, "{output:?}");
    assert!(
        cleaned["files"].as_u64().unwrap() > 0,
        "the relay had written some of the run's emails: {output:?}"
    );
    assert_eq!(cleaned["files_kept"], serde_json::json!([]), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("cleanup            removed 300 events"),
        "{output:?}"
    );

    // A relay still at work would write a file after the cleanup: give it the time to.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(database_rows(db), rows_before);
    assert_eq!(files(&mail), files_before);
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");
}

/// An HTTP email API that answers every email 200 after `delay`, on a thread of its own (the
/// test blocks on the binaries it runs): its URL, and the handle that stops it.
fn slow_email_api(delay: Duration) -> (String, actix_web::dev::ServerHandle) {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/emails", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let server = HttpServer::new(move || {
                App::new().route(
                    "/emails",
                    web::post().to(move || async move {
                        actix_web::rt::time::sleep(delay).await;
                        HttpResponse::Ok().json(serde_json::json!({"id": "email_1"}))
                    }),
                )
            })
            .workers(1)
            .disable_signals()
            .listen(listener)
            .unwrap()
            .run();
            tx.send(server.handle()).unwrap();
            let _ = server.await;
        });
    });
    (url, rx.recv().unwrap())
}

/// The server's relay is still sending the run's emails when the run ends (each takes the email
/// API 2 s): the cleanup waits until the relay has recorded them, then deletes every row in one
/// go, so no relay holds a row of the run when it goes (with the file transport, a file written
/// after the cleanup looked). Fails on a cleanup that deletes under a live lease: it does not
/// wait, and says nothing.
#[test]
fn bench_cleanup_waits_for_the_relay_to_finish_the_runs_emails_it_holds() {
    let (api, api_server) = slow_email_api(Duration::from_secs(2));
    let server = ServeProcess::start(
        &[
            ("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET),
            ("SEKALI_MAIL_API_URL", &api),
            ("SEKALI_MAIL_API_KEY", "key-bench-safety"),
        ],
        "warn",
    );
    let db = server.db();
    let output = bench(
        &format!("{}/webhooks/stripe", server.base_url()),
        &[
            // Over one second, so that the relay (polling every 50 ms) claims the run's
            // receipts while it runs.
            "--events",
            "50",
            "--rate",
            "50",
            "--concurrency",
            "2",
            "--check-db",
            &db.arg(),
            "--cleanup",
        ],
    );
    assert!(output.status.success(), "{output:?}");
    assert!(
        stderr(&output).contains("cleanup: a relay is sending")
            && stderr(&output).contains("of the run's emails; waiting for it to finish"),
        "{output:?}"
    );
    let report = report(&output);
    let cleaned = &report["cleanup"]["done"];
    assert_eq!(cleaned["orders"], 50, "{output:?}");
    assert!(cleaned["waited_s"].as_f64().unwrap() > 0.0, "{output:?}");
    assert_eq!(cleaned["files"], 0, "the email API writes no files");
    for table in [
        "processed_events",
        "orders",
        "email_outbox",
        "order_transitions",
    ] {
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM {table}")),
            0,
            "{table}"
        );
    }
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");
    // The command is sent when `stop` is called, not when its future is awaited.
    drop(api_server.stop(false));
}
