//! `sekali bench` against a database that holds real orders (issue 30): the real binary. With
//! `--check-db` it refuses to send beside orders that are not its own unless `--force`; without
//! it, it warns that it cannot see the database.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use rusqlite::{Connection, OpenFlags};
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
fn database_rows(db: &Path) -> BTreeMap<&'static str, Vec<String>> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut tables = BTreeMap::new();
    for (table, order) in [
        ("processed_events", "provider, event_id"),
        ("orders", "order_id"),
        ("order_transitions", "id"),
        ("order_payment_intents", "payment_intent_id"),
        ("email_outbox", "id"),
        ("idempotency_keys", "client, key"),
    ] {
        let mut statement = conn
            .prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))
            .unwrap();
        let columns = statement.column_count();
        let rows = statement
            .query_map([], |row| {
                (0..columns)
                    .map(|i| row.get::<_, rusqlite::types::Value>(i))
                    .collect::<Result<Vec<_>, _>>()
                    .map(|values| format!("{values:?}"))
            })
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        tables.insert(table, rows);
    }
    tables
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
    let before = database_rows(&app.db_path);
    let url = format!("{}/webhooks/stripe", app.address);
    let db = app.db_path.display().to_string();
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
    assert_eq!(database_rows(&app.db_path), before, "nothing was sent");

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
    let db = app.db_path.display().to_string();
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
