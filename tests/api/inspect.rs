//! The inspection commands as a first-time user meets them (issue 30): `events` and `outbox`
//! through the real `sekali` binary, against a database the real server wrote.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::helpers::*;

/// Runs `sekali ARGS --db DB` off the test's event loop; its output, whatever its exit status.
async fn sekali_on(db: &Database, args: &[&str]) -> Output {
    let (db, args): (String, Vec<String>) =
        (db.arg(), args.iter().map(|a| a.to_string()).collect());
    actix_web::rt::task::spawn_blocking(move || {
        Command::new(sekali_bin())
            .args(&args)
            .arg("--db")
            .arg(&db)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// [`sekali_on`] for a command that must succeed: its stdout.
async fn stdout_of(db: &Database, args: &[&str]) -> String {
    let output = sekali_on(db, args).await;
    assert!(output.status.success(), "sekali {args:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// The Stripe fixture `name` (a PaymentIntent event) as event `event_id` of order `order_id`,
/// whose PaymentIntent is the order's own.
fn stripe_event(name: &str, event_id: &str, order_id: &str) -> Vec<u8> {
    let mut event: serde_json::Value =
        serde_json::from_slice(&fixture(&format!("stripe/{name}.json"))).unwrap();
    event["id"] = event_id.into();
    event["data"]["object"]["id"] = format!("pi_{order_id}").into();
    event["data"]["object"]["metadata"]["order_id"] = order_id.into();
    serde_json::to_vec(&event).unwrap()
}

/// A Stripe payment whose event id is `event_id` and whose order id is `order_id`.
fn payment(event_id: &str, order_id: &str) -> Vec<u8> {
    stripe_event("payment_intent.succeeded", event_id, order_id)
}

/// The ids in the last column of a listing's rows (EVENT_ID of `events list`), header left out.
fn last_column(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .skip(1)
        .map(|line| line.rsplit("  ").next().unwrap())
        .collect()
}

/// The ids in the first column of a listing's rows (ID of `outbox list`), header left out.
fn first_column(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .skip(1)
        .map(|line| line.split("  ").next().unwrap())
        .collect()
}

/// The characters the listings escape beside the control characters: a right-to-left override
/// and an isolate, zero-width ones, a line separator.
const HIDDEN: [char; 6] = [
    '\u{202e}', '\u{2066}', '\u{200b}', '\u{200d}', '\u{feff}', '\u{2028}',
];

/// Fails on the version that escaped control characters only: an id with U+202E printed as
/// stored, and the terminal showed the rest of the line reversed (`evt_gnp.exe` for
/// `evt_exe.png`), while zero-width characters made two different ids look the same.
#[actix_web::test]
async fn listings_print_bidi_overrides_and_invisible_characters_in_ids_escaped() {
    let app = spawn_app().await;
    let event_id = "evt_\u{202e}gnp.exe\u{2066}\u{200b}";
    let order_id = "ord_\u{202e}1001\u{200d}\u{feff}\u{2028}x";
    let answer = app.deliver_stripe_body(&payment(event_id, order_id)).await;
    assert_eq!(answer.outcome(), "processed", "{answer:?}");

    let events = stdout_of(&app.database, &["events", "list"]).await;
    let outbox = stdout_of(&app.database, &["outbox", "list"]).await;
    for output in [&events, &outbox] {
        assert!(
            !output.contains(HIDDEN),
            "a bidi or invisible character reached the terminal: {output:?}"
        );
    }
    assert!(
        events.contains("evt_\\u{202e}gnp.exe\\u{2066}\\u{200b}"),
        "{events}"
    );
    let shown_order = "ord_\\u{202e}1001\\u{200d}\\u{feff}\\u{2028}x";
    assert!(events.contains(shown_order), "{events}");
    assert!(outbox.contains(shown_order), "{outbox}");
}

/// Fails on the version whose error said only `database file sekali.db does not exist`: a new
/// user who ran a command in another directory than `serve`, or without the `--db` that `serve`
/// had, was not told how to name the file.
#[test]
fn a_command_whose_database_does_not_exist_says_how_to_choose_it_and_creates_nothing() {
    // The default database is the SQLite file sekali.db; a URL names a server's database.
    if sqlite_only("a missing SQLite file, the default --db") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // `orders set-status` opens its database through the same `open_maintenance`; it is not
    // run here, so that this test does not depend on that command's other arguments.
    let commands: [&[&str]; 9] = [
        &["events", "list"],
        &["events", "show", "evt_1"],
        &["outbox", "list"],
        &["outbox", "show", "1"],
        &["outbox", "retry", "1"],
        &["purge"],
        &["backup", "copy.db"],
        &["relay"],
        &["events", "list", "--db", "elsewhere/sekali.db"],
    ];
    for args in commands {
        let output = Command::new(sekali_bin())
            .args(args)
            .current_dir(dir.path())
            .env_remove("SEKALI_DB")
            .env_remove("SEKALI_SMTP_URL")
            .env_remove("SEKALI_MAIL_API_URL")
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?}: {output:?}");
        let path = if args.contains(&"--db") {
            "elsewhere/sekali.db"
        } else {
            "sekali.db"
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.ends_with(&format!(
                "error: database file {path} does not exist (choose the file with --db or \
                 SEKALI_DB; sekali serve creates it)\n"
            )),
            "{args:?}: {stderr}"
        );
        assert!(!dir.path().join(path).exists(), "{args:?} created {path}");
    }
}

/// Every argument of `command` and its subcommands without a description in `--help`, as
/// `sekali events list --limit`.
fn undescribed_arguments(command: &clap::Command, path: &str) -> Vec<String> {
    let path = format!("{path} {}", command.get_name()).trim().to_owned();
    let mut missing: Vec<String> = command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set())
        .filter(|arg| {
            let help = arg.get_help().or(arg.get_long_help());
            help.is_none_or(|h| h.to_string().trim().is_empty())
        })
        .map(|arg| match arg.get_long() {
            Some(long) => format!("{path} --{long}"),
            None => format!("{path} {}", arg.get_id()),
        })
        .collect();
    if command.get_about().is_none() && path != "sekali" {
        missing.push(format!("{path} (the command itself)"));
    }
    for sub in command.get_subcommands() {
        missing.extend(undescribed_arguments(sub, &path));
    }
    missing
}

/// Fails on the version whose `events list --help` listed `--limit <LIMIT>` and `--provider
/// <PROVIDER>` with nothing after them, as `outbox show` and `outbox retry` did their `<ID>`.
#[test]
fn every_argument_of_every_command_has_a_description_in_its_help() {
    use clap::CommandFactory;
    let missing = undescribed_arguments(&sekali::cli::Cli::command(), "");
    assert!(missing.is_empty(), "without a description: {missing:#?}");
}

/// The same through the binary: `--help` shows each argument with its description, and `purge
/// --help` says that it deletes the orders API's expired Idempotency-Keys too (it does, see
/// `purge_all_expired`), which it did not.
#[test]
fn help_through_the_binary_describes_each_argument_and_what_purge_deletes() {
    let help = |args: &[&str]| {
        let output = Command::new(sekali_bin())
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let events_list = help(&["events", "list"]);
    for argument in ["--limit <LIMIT>", "--provider <PROVIDER>"] {
        let line = events_list
            .lines()
            .find(|line| line.trim_start().starts_with(argument))
            .unwrap_or_else(|| panic!("no {argument}: {events_list}"));
        // What is left once the argument and clap's own `[default: …]` and `[env: …]` are gone.
        let described = line.trim_start()[argument.len()..]
            .split('[')
            .next()
            .unwrap();
        assert!(
            !described.trim().is_empty(),
            "{argument} has no description: {events_list}"
        );
    }
    let purge = help(&["purge"]);
    assert!(
        purge.contains("expired event ids") && purge.contains("Idempotency-Keys of the orders API"),
        "{purge}"
    );
}

/// Fails on the version whose listings took `--provider`, `--status` and `--limit` only: "what
/// happened to order X in the last hour" meant sqlite3 or grep.
#[actix_web::test]
async fn events_and_outbox_listings_filter_by_outcome_order_and_since() {
    let app = spawn_app().await;
    let now = sekali::clock::SystemClock.now_unix();
    // Three hours ago: order A is paid, and a customer event is ignored.
    app.clock.set(now - 3 * 3600);
    let deliver = |name: &'static str, event_id: &'static str, order_id: &'static str| {
        let app = &app;
        async move {
            let body = stripe_event(name, event_id, order_id);
            app.deliver_stripe_body(&body).await.outcome().to_owned()
        }
    };
    assert_eq!(
        deliver("payment_intent.succeeded", "evt_a_paid", "ord_a").await,
        "processed"
    );
    let customer = fixture("stripe/customer.created.json");
    assert_eq!(
        app.deliver_stripe_body(&customer).await.outcome(),
        "ignored"
    );
    // Now: order B is paid, and A's processing arrives late (stale).
    app.clock.set(now);
    assert_eq!(
        deliver("payment_intent.succeeded", "evt_b_paid", "ord_b").await,
        "processed"
    );
    assert_eq!(
        deliver("payment_intent.processing", "evt_a_late", "ord_a").await,
        "stale"
    );

    let events = |args: &'static [&'static str]| {
        let db = app.database.clone();
        async move {
            let mut all = vec!["events", "list"];
            all.extend(args);
            let listing = stdout_of(&db, &all).await;
            last_column(&listing)
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        events(&[]).await,
        [
            "evt_a_late",
            "evt_b_paid",
            "evt_1QA0011customercreate",
            "evt_a_paid"
        ]
    );
    assert_eq!(
        events(&["--since", "1h"]).await,
        ["evt_a_late", "evt_b_paid"]
    );
    assert_eq!(events(&["--outcome", "stale"]).await, ["evt_a_late"]);
    assert_eq!(
        events(&["--outcome", "ignored"]).await,
        ["evt_1QA0011customercreate"]
    );
    assert_eq!(
        events(&["--order", "ord_a"]).await,
        ["evt_a_late", "evt_a_paid"]
    );
    assert_eq!(
        events(&["--order", "ord_a", "--outcome", "processed", "--limit", "5"]).await,
        ["evt_a_paid"]
    );
    assert!(events(&["--order", "ord_c"]).await.is_empty());
    // A time as the listing prints it, and the same moment with an offset.
    let two_hours_ago = sekali::clock::iso_seconds(now - 2 * 3600);
    let listing = stdout_of(
        &app.database,
        &["events", "list", "--since", &two_hours_ago],
    )
    .await;
    assert_eq!(
        last_column(&listing),
        ["evt_a_late", "evt_b_paid"],
        "{listing}"
    );
    let in_jakarta = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs((now - 2 * 3600 + 7 * 3600) as u64),
    )
    .to_string()
    .replace('Z', "+07:00");
    let listing = stdout_of(&app.database, &["events", "list", "--since", &in_jakarta]).await;
    assert_eq!(
        last_column(&listing),
        ["evt_a_late", "evt_b_paid"],
        "{in_jakarta}: {listing}"
    );

    // The outbox: A's receipt three hours ago, B's now.
    let outbox = |args: &[&str]| {
        let (db, mut all) = (
            app.database.clone(),
            vec!["outbox".to_owned(), "list".to_owned()],
        );
        all.extend(args.iter().map(|a| a.to_string()));
        async move {
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            let listing = stdout_of(&db, &all).await;
            first_column(&listing)
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(outbox(&[]).await, ["2", "1"]);
    assert_eq!(outbox(&["--order", "ord_a"]).await, ["1"]);
    assert_eq!(outbox(&["--since", "1h"]).await, ["2"]);
    assert_eq!(
        outbox(&["--since", &two_hours_ago, "--status", "pending"]).await,
        ["2"]
    );
    assert!(outbox(&["--order", "ord_b", "--status", "sent"])
        .await
        .is_empty());

    // A mistake is pointed out, with what is accepted.
    for (args, says) in [
        (
            &["events", "list", "--since", "yesterday"][..],
            "an RFC 3339 time such as",
        ),
        (
            &["outbox", "list", "--since", "2026-11-29"][..],
            "a duration such as 90s",
        ),
        (
            &["events", "list", "--outcome", "duplicate"][..],
            "possible values: processed, stale",
        ),
    ] {
        let output = sekali_on(&app.database, args).await;
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// The lines of `output`, each parsed as one JSON object.
fn json_lines(output: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    assert!(output.ends_with('\n'), "{output:?}");
    output
        .lines()
        .map(|line| match serde_json::from_str(line) {
            Ok(serde_json::Value::Object(object)) => object,
            other => panic!("not one JSON object on the line: {line:?} ({other:?})"),
        })
        .collect()
}

/// The names of an object's fields, sorted.
fn keys(object: &serde_json::Map<String, serde_json::Value>) -> Vec<&str> {
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort();
    keys
}

/// Fails on the version without `--json`: a script had to cut the table's columns apart, and an
/// id with a space or a line break broke them.
#[actix_web::test]
async fn json_output_is_one_object_per_line_with_every_field_and_the_values_as_stored() {
    let app = spawn_app().await;
    // A line break would split a line of JSON Lines that was not escaped; U+202E and U+009B
    // (CSI), which serde_json leaves raw, would reach the terminal.
    let (event_id, order_id) = ("evt_\u{202e}two\nlines", "ord_\u{9b}31m \u{2066}x");
    let body = payment(event_id, order_id);
    assert_eq!(app.deliver_stripe_body(&body).await.outcome(), "processed");
    app.deliver_stripe("customer.created").await;

    let db = &app.database;
    let events = stdout_of(db, &["events", "list", "--json"]).await;
    let outbox = stdout_of(db, &["outbox", "list", "--json"]).await;
    let shown = stdout_of(db, &["events", "show", event_id, "--json"]).await;
    let row = stdout_of(db, &["outbox", "show", "1", "--json"]).await;
    for output in [&events, &outbox, &shown, &row] {
        assert!(
            !output.contains(['\u{202e}', '\u{9b}', '\u{2066}']),
            "reached the terminal raw: {output:?}"
        );
    }

    let events = json_lines(&events);
    assert_eq!(events.len(), 2, "one line per event: {events:?}");
    for event in &events {
        assert_eq!(
            keys(event),
            [
                "event_id",
                "event_type",
                "expires_at",
                "order_id",
                "outcome",
                "provider",
                "received_at"
            ]
        );
    }
    assert_eq!(
        events[0]["event_id"], "evt_1QA0011customercreate",
        "newest first"
    );
    assert_eq!(events[1]["event_id"], event_id, "as stored");
    assert_eq!(events[1]["order_id"], order_id);
    assert_eq!(events[1]["outcome"], "processed");

    let shown = json_lines(&shown);
    assert_eq!(shown.len(), 1);
    let headers: serde_json::Value =
        serde_json::from_str(shown[0]["headers"].as_str().unwrap()).unwrap();
    assert_eq!(headers["content-type"], "application/json", "{headers}");
    assert!(
        headers.get("stripe-signature").is_none(),
        "no signature is kept: {headers}"
    );
    assert_eq!(
        keys(&shown[0]),
        [
            "event_id",
            "event_type",
            "expires_at",
            "headers",
            "order_id",
            "outcome",
            "payload",
            "payment_intent_id",
            "provider",
            "received_at"
        ]
    );
    assert_eq!(
        shown[0]["payload"],
        String::from_utf8(body).unwrap(),
        "the payload as received"
    );
    assert_eq!(shown[0]["payment_intent_id"], format!("pi_{order_id}"));

    let outbox = json_lines(&outbox);
    assert_eq!(outbox.len(), 1);
    let expected_fields = [
        "attempts",
        "created_at",
        "first_tried_at",
        "id",
        "idempotency_key",
        "last_error",
        "lease_owner",
        "lease_until",
        "next_attempt_at",
        "next_try_at",
        "order_id",
        "params",
        "recipient",
        "sent_at",
        "status",
        "template",
    ];
    assert_eq!(keys(&outbox[0]), expected_fields);
    assert_eq!(outbox[0]["order_id"], order_id);
    assert_eq!(outbox[0]["recipient"], "ana@example.com");
    let params: serde_json::Value =
        serde_json::from_str(outbox[0]["params"].as_str().unwrap()).unwrap();
    assert_eq!(
        params["order_id"], order_id,
        "the parameters as a string of JSON"
    );
    assert_eq!(
        json_lines(&row),
        outbox,
        "show --json is the row's line of list --json"
    );
}

/// How the stand-in email API answers the emails of an order (named in the subject).
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// 200 at once.
    Accept,
    /// 503 with `Retry-After: 3600` to the first try, so the relay waits an hour (its default
    /// --relay-max-delay); 200 after.
    RetryInAnHour,
    /// Holds the request until the test releases it, then 200: the relay that sent it keeps
    /// the row's lease meanwhile.
    HoldThenAccept,
}

/// An HTTP email API (the shape of `SEKALI_MAIL_API_URL`) answering as the test scripts.
struct EmailApi {
    url: String,
    /// The subject of every request, in the order they came.
    subjects: Arc<Mutex<Vec<String>>>,
    released: Arc<AtomicBool>,
    _server: actix_web::dev::ServerHandle,
}

impl EmailApi {
    /// Requests seen whose subject names `order_id`.
    fn tries_of(&self, order_id: &str) -> usize {
        let subjects = self.subjects.lock().unwrap();
        subjects.iter().filter(|s| s.contains(order_id)).count()
    }

    fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    /// `sekali serve`, its relay sending through this API, with `env` besides.
    async fn serve(&self, env: &[(&str, &str)]) -> ServeProcess {
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        env.extend([
            ("STRIPE_WEBHOOK_SECRET".into(), STRIPE_SECRET.into()),
            ("SEKALI_MAIL_API_URL".into(), self.url.clone()),
            ("SEKALI_MAIL_API_KEY".into(), "re_test_key".into()),
            ("SEKALI_MAIL_FROM".into(), "shop@sekali.test".into()),
        ]);
        actix_web::rt::task::spawn_blocking(move || {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            ServeProcess::start(&env, "warn")
        })
        .await
        .unwrap()
    }
}

/// Starts an [`EmailApi`] answering each order of `replies` so, and any other with 200.
async fn email_api(replies: &[(&'static str, Reply)]) -> EmailApi {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let replies = replies.to_vec();
    let subjects: Arc<Mutex<Vec<String>>> = Default::default();
    let released = Arc::new(AtomicBool::new(false));
    let state = (replies, subjects.clone(), released.clone());
    let server = HttpServer::new(move || {
        let (replies, subjects, released) = state.clone();
        App::new().route(
            "/emails",
            web::post().to(move |body: web::Json<serde_json::Value>| {
                let (replies, subjects, released) =
                    (replies.clone(), subjects.clone(), released.clone());
                async move {
                    let subject = body["subject"].as_str().unwrap_or_default().to_owned();
                    let tries = {
                        let mut subjects = subjects.lock().unwrap();
                        subjects.push(subject.clone());
                        subjects.iter().filter(|s| **s == subject).count()
                    };
                    let reply = replies
                        .iter()
                        .find(|(order_id, _)| subject.contains(order_id))
                        .map_or(Reply::Accept, |(_, reply)| *reply);
                    match reply {
                        Reply::RetryInAnHour if tries == 1 => {
                            return HttpResponse::ServiceUnavailable()
                                .insert_header(("Retry-After", "3600"))
                                .json(serde_json::json!({"message": "busy"}));
                        }
                        Reply::HoldThenAccept => {
                            // Within the relay's 30 s send timeout.
                            for _ in 0..1000 {
                                if released.load(Ordering::SeqCst) {
                                    break;
                                }
                                actix_web::rt::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                        _ => {}
                    }
                    HttpResponse::Ok().json(serde_json::json!({"id": format!("email_{tries}")}))
                }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let port = server.addrs()[0].port();
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    EmailApi {
        url: format!("http://127.0.0.1:{port}/emails"),
        subjects,
        released,
        _server: handle,
    }
}

/// Signs `body` as Stripe would now and POSTs it to a served sekali; the outcome it answered.
async fn deliver_to(server: &ServeProcess, body: Vec<u8>) -> String {
    let header = stripe_header(&body, sekali::clock::SystemClock.now_unix());
    let mut response = awc::Client::default()
        .post(format!("{}/webhooks/stripe", server.base_url()))
        .insert_header(("Stripe-Signature", header))
        .insert_header(("Content-Type", "application/json"))
        .send_body(body)
        .await
        .unwrap();
    let answer: serde_json::Value = response.json().await.unwrap();
    answer["status"].as_str().unwrap_or_default().to_owned()
}

/// An outbox row as the relay left it.
#[derive(Debug)]
struct RowState {
    status: String,
    attempts: i64,
    next_attempt_at: Option<String>,
    lease_owner: Option<String>,
}

/// Polls outbox row `id` in `db` until `ready` holds, at most 20 s (the machine is shared: the
/// deadline is generous, and no step is timed more tightly).
async fn wait_for_row(
    db: &Database,
    id: i64,
    what: &str,
    ready: impl Fn(&RowState) -> bool,
) -> RowState {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let rows = db.query(&format!(
            "SELECT status, attempts, next_attempt_at, lease_owner FROM email_outbox WHERE id = {id}"
        ));
        let row = rows.into_iter().next().map(|r| RowState {
            status: r[0].clone().unwrap(),
            attempts: r[1].as_deref().unwrap().parse().unwrap(),
            next_attempt_at: r[2].clone(),
            lease_owner: r[3].clone(),
        });
        if let Some(row) = row {
            if ready(&row) {
                return row;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "row {id}, waiting for {what}: {row:?}"
            );
        } else {
            assert!(
                std::time::Instant::now() < deadline,
                "row {id} never came, waiting for {what}"
            );
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Unix seconds of a stored time.
fn unix_of(at: &str) -> u64 {
    humantime::parse_rfc3339(at)
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The cells of a listing's rows, header left out: columns are two spaces or more apart.
fn cells(listing: &str) -> Vec<Vec<&str>> {
    listing
        .lines()
        .skip(1)
        .map(|line| {
            line.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect()
}

/// Fails on the version whose NEXT_ATTEMPT_AT showed a row being sent as due in the past, and a
/// sent row as `-` alike with one that will never be tried: a first-time user read the row under
/// a lease as stuck.
#[actix_web::test]
async fn outbox_list_shows_when_each_row_is_really_tried_next() {
    let api = email_api(&[
        ("ord_wait", Reply::RetryInAnHour),
        ("ord_held", Reply::HoldThenAccept),
    ])
    .await;
    let server = api.serve(&[]).await;
    let db = server.db().clone();
    let sent = payment("evt_sent", "ord_sent");
    assert_eq!(deliver_to(&server, sent).await, "processed");
    wait_for_row(&db, 1, "sent", |r| r.status == "sent").await;
    assert_eq!(
        deliver_to(&server, payment("evt_wait", "ord_wait")).await,
        "processed"
    );
    wait_for_row(&db, 2, "the 503", |r| r.attempts == 1).await;
    assert_eq!(
        deliver_to(&server, payment("evt_held", "ord_held")).await,
        "processed"
    );
    wait_for_row(&db, 3, "a lease", |r| r.lease_owner.is_some()).await;

    let started = sekali::clock::SystemClock.now_unix() as u64;
    let table = stdout_of(&db, &["outbox", "list"]).await;
    let json = json_lines(&stdout_of(&db, &["outbox", "list", "--json"]).await);
    let rows = cells(&table);
    assert!(table.starts_with("ID  STATUS"), "{table}");
    assert!(
        table.lines().next().unwrap().contains("NEXT_TRY"),
        "{table}"
    );
    assert_eq!(rows.len(), 3, "{table}");

    // Row 3 is being sent: tried again only if its relay dies, when the lease runs out; its
    // next_attempt_at has passed.
    let (held, owner, until) = (&json[0], &json[0]["lease_owner"], &json[0]["lease_until"]);
    let (owner, until) = (owner.as_str().unwrap(), until.as_str().unwrap());
    assert_eq!(rows[0][0], "3");
    assert_eq!(
        rows[0][5],
        format!("leased by {owner} until {until}"),
        "{table}"
    );
    assert_eq!(held["next_try_at"], until);
    let next_attempt = held["next_attempt_at"].as_str().unwrap();
    assert!(unix_of(next_attempt) <= started, "due already: {held:?}");
    assert!(
        unix_of(until) >= started + 4 * 60,
        "the 5-minute lease: {held:?}"
    );

    // Row 2 waits out the email API's Retry-After.
    let waiting = &json[1];
    let next_attempt = waiting["next_attempt_at"].as_str().unwrap();
    assert_eq!(
        (rows[1][0], rows[1][1], rows[1][2]),
        ("2", "pending", "1"),
        "{table}"
    );
    assert_eq!(rows[1][5], next_attempt, "{table}");
    assert_eq!(waiting["next_try_at"], next_attempt);
    assert!(
        unix_of(next_attempt) >= started + 50 * 60,
        "an hour away: {waiting:?}"
    );

    // Row 1 is sent: no next try.
    assert_eq!(
        (rows[2][0], rows[2][1], rows[2][5]),
        ("1", "sent", "-"),
        "{table}"
    );
    assert_eq!(json[2]["next_try_at"], serde_json::Value::Null);
    // `outbox show` says the same as the listing.
    let shown: serde_json::Value =
        serde_json::from_str(&stdout_of(&db, &["outbox", "show", "3"]).await).unwrap();
    assert_eq!(shown["next_try_at"], until);

    // `outbox retry` leaves a row being sent alone: taking the lease could send it twice.
    let refused = sekali_on(&db, &["outbox", "retry", "3"]).await;
    assert!(!refused.status.success(), "{refused:?}");
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        format!(
            "error: outbox row 3 is being sent by {owner} (its lease runs until {until}); if \
             that relay died, the row is tried again then\n"
        )
    );

    api.release();
    wait_for_row(&db, 3, "the held row to be sent", |r| r.status == "sent").await;
    assert_eq!(
        (
            api.tries_of("ord_sent"),
            api.tries_of("ord_wait"),
            api.tries_of("ord_held")
        ),
        (1, 1, 1)
    );
    let (status, _) = server.stop();
    assert!(status.success());

    // A row no relay has claimed yet, on a database no relay sends from, is due now: since its
    // next_attempt_at, which has passed.
    let app = spawn_app().await;
    app.deliver_stripe("payment_intent.succeeded").await;
    let table = stdout_of(&app.database, &["outbox", "list"]).await;
    let json = json_lines(&stdout_of(&app.database, &["outbox", "list", "--json"]).await);
    assert_eq!(cells(&table)[0][5], "now", "{table}");
    assert_eq!(json[0]["next_try_at"], json[0]["next_attempt_at"]);
    let due = unix_of(json[0]["next_try_at"].as_str().unwrap());
    assert!(
        due <= sekali::clock::SystemClock.now_unix() as u64,
        "{json:?}"
    );
}

/// Fails on the version whose `outbox retry` took dead rows only ("only dead rows can be
/// retried"): a row waiting an hour for an email API's Retry-After could not be sent sooner,
/// once the API was known to be back.
#[actix_web::test]
async fn outbox_retry_sends_a_row_waiting_for_its_next_try_now_and_keeps_its_attempts() {
    let api = email_api(&[("ord_wait", Reply::RetryInAnHour)]).await;
    let server = api.serve(&[("MIDTRANS_SERVER_KEY", MIDTRANS_KEY)]).await;
    let db = server.db().clone();
    assert_eq!(
        deliver_to(&server, payment("evt_wait", "ord_wait")).await,
        "processed"
    );
    let waiting = wait_for_row(&db, 1, "the 503", |r| r.attempts == 1).await;
    assert_eq!(waiting.status, "pending");
    let next_attempt_at = waiting.next_attempt_at.unwrap();
    let now = sekali::clock::SystemClock.now_unix() as u64;
    assert!(
        unix_of(&next_attempt_at) >= now + 50 * 60,
        "an hour away: {next_attempt_at}"
    );

    let retried = stdout_of(&db, &["outbox", "retry", "1"]).await;
    assert_eq!(
        retried,
        format!(
            "outbox row 1: pending, due now (was due at {next_attempt_at}; attempts kept: 1)\n"
        )
    );
    // The relay polls every 50 ms; 20 s is for a busy machine, not a measure of anything.
    let sent = wait_for_row(&db, 1, "the row to be sent", |r| r.status == "sent").await;
    assert_eq!(sent.attempts, 2, "the try before the retry still counts");
    assert_eq!(api.tries_of("ord_wait"), 2);

    // Nothing to send again: a sent row, and a row without a recipient.
    let settlement = sign_midtrans(&fixture("midtrans/settlement.json"));
    let answer = awc::Client::default()
        .post(format!("{}/webhooks/midtrans", server.base_url()))
        .insert_header(("Content-Type", "application/json"))
        .send_body(settlement)
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    wait_for_row(&db, 2, "the row to be skipped", |r| r.status == "skipped").await;
    for (id, says) in [
        ("1", "outbox row 1 is sent: the transport confirmed it (only pending and dead rows can be retried)"),
        ("2", "outbox row 2 is skipped: it has no recipient address (only pending and dead rows can be retried)"),
        ("3", "no outbox row with id 3"),
    ] {
        let refused = sekali_on(&db, &["outbox", "retry", id]).await;
        assert!(!refused.status.success(), "{refused:?}");
        assert_eq!(String::from_utf8_lossy(&refused.stderr), format!("error: {says}\n"));
    }
    assert_eq!(api.tries_of("ord_wait"), 2, "nothing sent again");
    let (status, _) = server.stop();
    assert!(status.success());
}

/// `outbox skip`: a pending email is never sent; a skipped one, and an id with no row, are
/// refused with the reason.
#[actix_web::test]
async fn outbox_skip_never_sends_a_pending_email_and_says_why_when_it_does_nothing() {
    let app = spawn_app().await; // no relay: the receipt stays pending
    app.deliver_stripe("payment_intent.succeeded").await;
    assert_eq!(
        stdout_of(&app.database, &["outbox", "skip", "1"]).await,
        "outbox row 1: pending -> skipped (never sent)\n"
    );
    let row = &json_lines(&stdout_of(&app.database, &["outbox", "list", "--json"]).await)[0];
    assert_eq!(row["status"], "skipped");
    assert!(
        row["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("skipped by an operator")),
        "{row:?}"
    );
    for (id, says) in [
        ("1", "outbox row 1 is skipped already"),
        ("9", "no outbox row with id 9"),
    ] {
        let refused = sekali_on(&app.database, &["outbox", "skip", id]).await;
        assert!(!refused.status.success(), "{refused:?}");
        assert_eq!(
            String::from_utf8_lossy(&refused.stderr),
            format!("error: {says}\n")
        );
    }
}

/// Fails on the version that escaped control characters only: an order id with U+202E reached
/// the log raw, in the warning of an order that needs review, and reversed the rest of the line
/// in a terminal following the log.
#[actix_web::test]
async fn a_logged_order_id_shows_its_bidi_override_escaped() {
    let server = actix_web::rt::task::spawn_blocking(|| {
        ServeProcess::start(&[("MIDTRANS_SERVER_KEY", MIDTRANS_KEY)], "warn")
    })
    .await
    .unwrap();
    // A settlement of an order, then a cancel of the same transaction: a reversal, which logs
    // the order id at warn.
    let notification = |status: &str, code: &str| {
        let mut value: serde_json::Value =
            serde_json::from_slice(&fixture("midtrans/settlement.json")).unwrap();
        value["order_id"] = "ORDER-\u{202e}1002\u{2066}".into();
        value["transaction_status"] = status.into();
        value["status_code"] = code.into();
        sign_midtrans(&serde_json::to_vec(&value).unwrap())
    };
    for (body, outcome) in [
        (notification("settlement", "200"), "processed"),
        (notification("cancel", "202"), "reversed"),
    ] {
        let mut response = awc::Client::default()
            .post(format!("{}/webhooks/midtrans", server.base_url()))
            .insert_header(("Content-Type", "application/json"))
            .send_body(body)
            .await
            .unwrap();
        let answer: serde_json::Value = response.json().await.unwrap();
        assert_eq!(answer["status"], outcome, "{answer}");
    }
    let (status, logs) = server.stop();
    assert!(status.success());
    let warning = logs
        .lines()
        .find(|line| line.contains("order moved to needs_review"))
        .unwrap_or_else(|| panic!("no needs_review warning: {logs}"));
    assert!(
        warning.contains("order_id=ORDER-\\u{202e}1002\\u{2066}"),
        "{warning}"
    );
    assert!(!logs.contains(HIDDEN), "raw in the log: {logs:?}");
}
