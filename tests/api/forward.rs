//! Forwarding (`SEKALI_FORWARD_URL`, `SEKALI_FORWARD_SECRET`): every order change POSTed to the
//! shop's endpoint, signed per Standard Webhooks, at least once, and in order per order.
//! Black-box: the real `sekali serve` binary against tests/support/forward_receiver.py, a shop's
//! endpoint that verifies each message with the official `standardwebhooks` Python package and
//! logs what it answered; the `sekali forward` commands as an operator runs them. On either
//! engine (SEKALI_TEST_ENGINE).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::{self, sekali_bin, Database, ServeProcess};

/// The orders API's (and the change feed's) bearer token in these tests.
const TOKEN: &str = "tok-forward-shop-5d1e";

/// Relay timings short enough for a test: retries within a second (and idle polls every 50 ms,
/// which [`ServeProcess`] passes itself: a flag given twice is refused).
const FAST_RELAY: &[&str] = &["--relay-base-delay", "100ms", "--relay-max-delay", "1s"];

/// [`FAST_RELAY`] with a lease of `lease`, a timeout of `timeout` and `attempts` tries.
fn relay_args<'a>(lease: &'a str, timeout: &'a str, attempts: &'a str) -> Vec<&'a str> {
    let mut args = FAST_RELAY.to_vec();
    args.extend([
        "--relay-lease",
        lease,
        "--relay-timeout",
        timeout,
        "--relay-max-attempts",
        attempts,
    ]);
    args
}

/// One Stripe payment's life: pending, paid, partly refunded, refunded (four changes).
const LIFECYCLE: [&str; 4] = [
    "payment_intent.processing",
    "payment_intent.succeeded",
    "charge.refunded.partial",
    "charge.refunded.full",
];

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build()
}

fn new_secret() -> String {
    sekali::forward::new_secret().unwrap()
}

/// How [`Receiver`] answers (see tests/support/forward_receiver.py).
#[derive(Default)]
struct Answers {
    /// The fraction of messages answered 500 at random.
    fail_ratio: f64,
    /// Listen here (else on a port of the system's choosing).
    port: Option<u16>,
    /// Wait this long before each answer (after logging it).
    delay_ms: u64,
    /// `ORDER_ID:SEQUENCE[:FLAG]`: that change answered 410 (while the file FLAG exists).
    refuse: Vec<String>,
    /// `ORDER_ID:SEQUENCE:STATUS[:RETRY_AFTER]`: that change always answered STATUS.
    answer: Vec<String>,
}

/// tests/support/forward_receiver.py as a child process, killed when this is dropped.
struct Receiver {
    child: Child,
    port: u16,
}

impl Receiver {
    /// Starts the shop's endpoint, verifying with `secret`, appending what it answers to `log`.
    fn start(secret: &str, log: &Path, answers: Answers) -> Receiver {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/forward_receiver.py");
        let mut command = Command::new("python3");
        command
            .arg(script)
            .arg(secret)
            .arg(answers.fail_ratio.to_string())
            .arg(log)
            .arg("--delay-ms")
            .arg(answers.delay_ms.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(port) = answers.port {
            command.arg("--port").arg(port.to_string());
        }
        for refusal in &answers.refuse {
            command.arg("--refuse").arg(refusal);
        }
        for answer in &answers.answer {
            command.arg("--answer").arg(answer);
        }
        let mut child = command
            .spawn()
            .expect("python3 (with the standardwebhooks package) runs the receiver");
        let mut line = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        let port = match line.trim().parse() {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("the receiver printed no port ({line:?}); it exited: {status:?}");
            }
        };
        Receiver { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/sekali", self.port)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every answer the receiver(s) logged to `log`, in the order they were given.
fn answers(log: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn of_kind<'a>(answers: &'a [Value], kind: &str) -> Vec<&'a Value> {
    answers.iter().filter(|a| a["answer"] == kind).collect()
}

/// The environment of a `serve` that forwards to `url`, signing with `secrets`, with the
/// tests' providers and the change feed on.
fn forward_env(url: &str, secrets: &str) -> Vec<(String, String)> {
    let mut env = base_env();
    env.push(("SEKALI_FORWARD_URL".into(), url.into()));
    env.push(("SEKALI_FORWARD_SECRET".into(), secrets.into()));
    env
}

/// The tests' providers and the change feed's token.
fn base_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = helpers::PROVIDER_ENV
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.push(("SEKALI_API_TOKENS".into(), format!("shop:{TOKEN}")));
    env
}

fn refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// `sekali serve` on `db`, forwarding to `url` with `secrets`, with the fast relay timings.
fn serve_forwarding(db: &Database, url: &str, secrets: &str) -> ServeProcess {
    let env = forward_env(url, secrets);
    ServeProcess::start_on(
        Some(db.path()),
        &refs(&env),
        "warn",
        &relay_args("5s", "3s", "50"),
    )
}

/// `sekali serve` on `db` with forwarding off (neither variable set, whatever this process's
/// environment holds).
fn serve_not_forwarding(db: &Database) -> ServeProcess {
    let env = base_env();
    ServeProcess::start_unsetting(
        Some(db.path()),
        &refs(&env),
        &["SEKALI_FORWARD_URL", "SEKALI_FORWARD_SECRET"],
        "warn",
        &relay_args("5s", "3s", "50"),
    )
}

/// The four deliveries of order `ord_{tag}_{i}`'s life, in order.
fn lifecycle(tag: &str, i: usize) -> Vec<Vec<u8>> {
    LIFECYCLE
        .iter()
        .map(|name| {
            String::from_utf8(helpers::fixture(&format!("stripe/{name}.json")))
                .unwrap()
                .replace("Order1001", &format!("Order{tag}{i}"))
                .replace("ord_1001", &format!("ord_{tag}_{i}"))
                .replace("\"evt_", &format!("\"evt_{tag}{i}_"))
                .into_bytes()
        })
        .collect()
}

fn order_id(tag: &str, i: usize) -> String {
    format!("ord_{tag}_{i}")
}

/// Delivers the lives of orders `orders` (of `tag`), steps `steps` of each, from four threads:
/// each order's events in order, orders interleaved, each event to one of `ports` in turn (so
/// that with two instances an order's events alternate between them). Each must be processed
/// (a 503, the server busy, is sent again as a provider would).
fn deliver_lives(
    ports: &[u16],
    tag: &str,
    orders: std::ops::Range<usize>,
    steps: std::ops::Range<usize>,
) {
    let orders: Vec<usize> = orders.collect();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let mine: Vec<usize> = orders.iter().copied().filter(|i| i % 4 == t).collect();
            let steps = steps.clone();
            scope.spawn(move || {
                let agent = agent();
                let lives: Vec<Vec<Vec<u8>>> = mine.iter().map(|&i| lifecycle(tag, i)).collect();
                for step in steps {
                    for (life, &i) in lives.iter().zip(&mine) {
                        let port = ports[(i + step) % ports.len()];
                        let mut answer = helpers::deliver_stripe(&agent, port, &life[step]);
                        for _ in 0..50 {
                            if answer.0 != 503 {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(50));
                            answer = helpers::deliver_stripe(&agent, port, &life[step]);
                        }
                        assert_eq!(
                            answer,
                            (200, "processed".to_owned()),
                            "{} of {}",
                            LIFECYCLE[step],
                            order_id(tag, i)
                        );
                    }
                }
            });
        }
    });
}

/// `POST /orders` for a Stripe order with metadata: one change, made by the API.
fn create_api_order(port: u16, order_id: &str) {
    let body = json!({
        "order_id": order_id,
        "amount": 2500,
        "currency": "USD",
        "provider": "stripe",
        "customer_email": "ana@example.com",
        "metadata": {"cart": "c-77", "channel": "web"},
    });
    let answer = agent()
        .post(&format!("http://127.0.0.1:{port}/orders"))
        .set("Authorization", &format!("Bearer {TOKEN}"))
        .set("Idempotency-Key", &format!("create-{order_id}"))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string());
    match answer {
        Ok(response) => assert_eq!(response.status(), 201),
        Err(e) => panic!("POST /orders {order_id}: {e}"),
    }
}

/// `sekali ARGS`: its output.
fn sekali(args: &[&str]) -> Output {
    Command::new(sekali_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `sekali orders set-status ORDER STATUS` as an operator: one change, by `operator`.
fn operator_sets(db: &Database, order_id: &str, status: &str) {
    let output = sekali(&[
        "orders",
        "set-status",
        order_id,
        status,
        "--db",
        &db.arg(),
        "--reason",
        "the customer called",
        "--by",
        "rina",
    ]);
    assert!(output.status.success(), "{output:?}");
}

/// Every change of the feed (`GET /changes`), oldest first.
fn all_changes(port: u16) -> Vec<Value> {
    let agent = agent();
    let mut changes = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("http://127.0.0.1:{port}/changes?limit=1000");
        if let Some(after) = &after {
            url.push_str(&format!("&after={after}"));
        }
        let page: Value = agent
            .get(&url)
            .set("Authorization", &format!("Bearer {TOKEN}"))
            .call()
            .unwrap_or_else(|e| panic!("GET {url}: {e}"))
            .into_string()
            .map(|text| serde_json::from_str(&text).unwrap())
            .unwrap();
        let batch = page["changes"].as_array().unwrap().clone();
        if batch.is_empty() {
            return changes;
        }
        changes.extend(batch);
        after = page["next_after"].as_str().map(str::to_owned);
    }
}

/// Waits until `state` says nothing is left (`None`); panics with the last thing it said if
/// `within` passes first.
fn wait_until(within: Duration, mut state: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + within;
    loop {
        let Some(left) = state() else { return };
        assert!(Instant::now() < deadline, "after {within:?}: {left}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `(status, count)` of the forwarding rows.
fn statuses(db: &Database) -> BTreeMap<String, i64> {
    db.query("SELECT status, count(*) FROM forward_outbox GROUP BY status")
        .into_iter()
        .map(|row| {
            (
                row[0].clone().unwrap(),
                row[1].as_deref().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// Waits until every change has its forwarding row and every row is sent; panics at once if a
/// row is dead (with its last error).
fn wait_all_sent(db: &Database, within: Duration) {
    wait_until(within, || {
        let dead = db.texts(
            "SELECT coalesce(last_error, '') FROM forward_outbox WHERE status = 'dead' LIMIT 1",
        );
        assert!(dead.is_empty(), "a forwarding row is dead: {dead:?}");
        let changes = db.count("SELECT count(*) FROM order_transitions");
        let sent = db.count("SELECT count(*) FROM forward_outbox WHERE status = 'sent'");
        let rows = db.count("SELECT count(*) FROM forward_outbox");
        (sent != changes || rows != changes).then(|| {
            format!(
                "{changes} changes, forwarding rows by status: {:?}",
                statuses(db)
            )
        })
    });
}

/// Checks what arrived against `expected` (changes as the feed serves them): nothing the
/// verifier rejected; every accepted message is one of `expected`, its body exactly the feed's
/// change of its webhook-id; each of `expected` accepted at least once; and the first acceptance
/// of each webhook-id, in the order the receiver answered, gives each order's changes in their
/// order (the sequences `expected` has for it, ascending).
fn check_arrivals(answers: &[Value], expected: &[Value]) {
    let rejected = of_kind(answers, "rejected");
    assert!(
        rejected.is_empty(),
        "the official verifier rejected {} messages: {rejected:?}",
        rejected.len()
    );
    let by_id: HashMap<&str, &Value> = expected
        .iter()
        .map(|c| (c["id"].as_str().unwrap(), c))
        .collect();
    let mut seen = HashSet::new();
    let mut arrived: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for answer in of_kind(answers, "accepted") {
        let id = answer["id"].as_str().unwrap();
        let body = &answer["body"];
        assert_eq!(
            body["id"], id,
            "the webhook-id is the change's id: {answer}"
        );
        let change = by_id
            .get(id)
            .unwrap_or_else(|| panic!("a change that was not to be forwarded arrived: {answer}"));
        assert_eq!(
            body, *change,
            "the message is the change as GET /changes serves it"
        );
        if seen.insert(id.to_owned()) {
            let order = body["order_id"].as_str().unwrap().to_owned();
            arrived
                .entry(order)
                .or_default()
                .push(body["sequence"].as_i64().unwrap());
        }
    }
    let mut wanted: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for change in expected {
        wanted
            .entry(change["order_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(change["sequence"].as_i64().unwrap());
    }
    for sequences in wanted.values_mut() {
        sequences.sort_unstable();
    }
    let missing: Vec<&&str> = by_id.keys().filter(|id| !seen.contains(**id)).collect();
    assert!(missing.is_empty(), "never arrived: {missing:?}");
    for (order, sequences) in &wanted {
        assert_eq!(
            arrived.get(order),
            Some(sequences),
            "order {order}: the first arrival of each of its changes, in arrival order"
        );
    }
}

/// The forwarding rows as `sekali forward list --json` prints them (up to 1000, newest first),
/// with `filters` (`--status S`, `--order O`).
fn forward_list(db: &Database, filters: &[&str]) -> Vec<Value> {
    let db_arg = db.arg();
    let mut args = vec![
        "forward", "list", "--db", &db_arg, "--limit", "1000", "--json",
    ];
    args.extend_from_slice(filters);
    let output = sekali(&args);
    assert!(output.status.success(), "{output:?}");
    stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// The forwarding row (from `forward list --json`) of change `sequence` of `order`.
fn row_of(db: &Database, changes: &[Value], order: &str, sequence: i64) -> Value {
    let change = changes
        .iter()
        .find(|c| c["order_id"] == order && c["sequence"] == sequence)
        .unwrap_or_else(|| panic!("no change {sequence} of {order}"));
    let rows = forward_list(db, &["--order", order]);
    rows.into_iter()
        .find(|r| r["message_id"] == change["id"])
        .unwrap_or_else(|| panic!("no forwarding row for {}", change["id"]))
}

/// Through an endpoint that answers 500 to a fifth of the messages at random: 40 orders' lives
/// (four changes each, interleaved, from four threads), an order created by the API with
/// metadata and cancelled by an operator. Every change arrives, verified by the official
/// library, at least once, with its body exactly the feed's; each order's changes first arrive
/// in their order; every row ends `sent`, its attempts the number of answers it got.
#[test]
fn every_change_arrives_verified_and_in_order_per_order_through_a_flaky_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let secret = new_secret();
    let receiver = Receiver::start(
        &secret,
        &log,
        Answers {
            fail_ratio: 0.2,
            ..Default::default()
        },
    );
    let db = Database::fresh(dir.path().join("forward.db"));
    let serve = serve_forwarding(&db, &receiver.url(), &secret);
    let started = Instant::now();

    const ORDERS: usize = 40;
    std::thread::scope(|scope| {
        scope.spawn(|| deliver_lives(&[serve.port], "flaky", 0..ORDERS, 0..4));
        create_api_order(serve.port, "ord_flaky_api");
        operator_sets(&db, "ord_flaky_api", "cancelled");
    });
    wait_all_sent(&db, Duration::from_secs(60));
    println!(
        "{} changes forwarded in {:?}",
        ORDERS * 4 + 2,
        started.elapsed()
    );

    let changes = all_changes(serve.port);
    assert_eq!(changes.len(), ORDERS * 4 + 2);
    assert_eq!(
        changes.len() as i64,
        db.count("SELECT count(*) FROM order_transitions")
    );
    let answers = answers(&log);
    check_arrivals(&answers, &changes);
    let failed = of_kind(&answers, "failed").len();
    assert!(
        failed > 0,
        "the endpoint failed no message: retries were not exercised"
    );

    // The API's change carries the order's metadata, the operator's says who made it.
    let received = |order: &str, sequence: i64| {
        answers
            .iter()
            .find(|a| {
                a["answer"] == "accepted" && a["order_id"] == order && a["sequence"] == sequence
            })
            .map(|a| a["body"].clone())
            .unwrap_or_else(|| panic!("change {sequence} of {order} never arrived"))
    };
    let created = received("ord_flaky_api", 1);
    assert_eq!(created["changed_by"], "api", "{created}");
    assert_eq!(
        created["metadata"],
        json!({"cart": "c-77", "channel": "web"})
    );
    let cancelled = received("ord_flaky_api", 2);
    assert_eq!(cancelled["changed_by"], "operator", "{cancelled}");
    assert_eq!(cancelled["type"], "order.cancelled", "{cancelled}");
    assert_eq!(cancelled["previous_status"], "pending", "{cancelled}");

    // Each row's attempts are the answers its message got (500s and the 200 that ended it).
    let mut answered: HashMap<String, i64> = HashMap::new();
    for a in &answers {
        *answered
            .entry(a["id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let rows = forward_list(&db, &[]);
    assert_eq!(rows.len(), changes.len());
    for row in &rows {
        assert_eq!(row["status"], "sent", "{row}");
        let id = row["message_id"].as_str().unwrap();
        assert_eq!(row["attempts"].as_i64(), answered.get(id).copied(), "{row}");
    }
    drop(serve);
}

/// While rotating: `SEKALI_FORWARD_SECRET=OLD,NEW` signs each message with both, so an endpoint
/// that already knows only NEW verifies every one.
#[test]
fn with_two_secrets_an_endpoint_that_knows_only_the_new_one_verifies_every_message() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let (old, new) = (new_secret(), new_secret());
    let receiver = Receiver::start(&new, &log, Answers::default());
    let db = Database::fresh(dir.path().join("forward.db"));
    let serve = serve_forwarding(&db, &receiver.url(), &format!("{old},{new}"));
    deliver_lives(&[serve.port], "rot", 0..5, 0..4);
    wait_all_sent(&db, Duration::from_secs(30));

    let changes = all_changes(serve.port);
    assert_eq!(changes.len(), 20);
    let answers = answers(&log);
    check_arrivals(&answers, &changes);
    for answer in &answers {
        assert_eq!(
            answer["signatures"], 2,
            "one signature per secret: {answer}"
        );
    }
    drop(serve);
}

/// An endpoint that cannot be reached (its port closed) costs no message a try: nothing is
/// sent, nothing dies, every row's attempts stay 0 while sekali probes it. Once it listens on
/// that port, every change arrives, in order per order.
#[test]
fn an_unreachable_endpoint_counts_no_try_and_gets_everything_once_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let secret = new_secret();
    let port = helpers::free_port();
    let url = format!("http://127.0.0.1:{port}/hooks/sekali");
    let db = Database::fresh(dir.path().join("forward.db"));
    let serve = serve_forwarding(&db, &url, &secret);
    deliver_lives(&[serve.port], "down", 0..10, 0..4);
    std::thread::sleep(Duration::from_secs(3));

    let changes = db.count("SELECT count(*) FROM order_transitions");
    assert_eq!(changes, 40);
    assert_eq!(
        statuses(&db),
        BTreeMap::from([("pending".to_owned(), 40)]),
        "every change waits: none sent, none dead"
    );
    let rows = forward_list(&db, &[]);
    assert_eq!(rows.len(), 40);
    for row in &rows {
        assert_eq!(row["attempts"], 0, "no try is counted: {row}");
        assert!(row["first_tried_at"].is_null(), "{row}");
    }
    assert!(
        rows.iter().any(|r| r["last_error"].is_string()),
        "sekali probed the endpoint and says why it waits: {rows:#?}"
    );

    let _receiver = Receiver::start(
        &secret,
        &log,
        Answers {
            port: Some(port),
            ..Default::default()
        },
    );
    wait_all_sent(&db, Duration::from_secs(20));
    check_arrivals(&answers(&log), &all_changes(serve.port));
    drop(serve);
}

/// An endpoint that refuses a change for good (410): that row is `dead`, with the 410 in its
/// last error, tried once; its order's later changes wait (untried) while other orders' go.
/// `sekali forward skip` on it lets them go (the skipped change is never sent); `sekali forward
/// retry` on another dead row makes it pending, and once the endpoint takes it, its order's
/// later changes follow it, in order.
#[test]
fn a_refused_change_is_dead_and_holds_its_orders_later_changes_until_skipped_or_retried() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let flag = dir.path().join("refusing");
    std::fs::write(&flag, "").unwrap();
    let secret = new_secret();
    let (skipped, retried) = (order_id("ref", 0), order_id("ref", 1));
    let refuse = vec![
        format!("{skipped}:1"),
        format!("{retried}:1:{}", flag.display()),
    ];
    let receiver = Receiver::start(
        &secret,
        &log,
        Answers {
            refuse,
            ..Default::default()
        },
    );
    let db = Database::fresh(dir.path().join("forward.db"));
    let serve = serve_forwarding(&db, &receiver.url(), &secret);
    deliver_lives(&[serve.port], "ref", 0..6, 0..4);
    wait_until(Duration::from_secs(20), || {
        let now = statuses(&db);
        (now != BTreeMap::from([
            ("dead".to_owned(), 2),
            ("pending".to_owned(), 6),
            ("sent".to_owned(), 16),
        ]))
        .then(|| format!("{now:?}"))
    });
    // Still held a while later: the relay polls every 50 ms.
    std::thread::sleep(Duration::from_millis(500));
    let changes = all_changes(serve.port);
    let db_arg = db.arg();
    for order in [&skipped, &retried] {
        let dead = row_of(&db, &changes, order, 1);
        assert_eq!(dead["status"], "dead", "{dead}");
        assert_eq!(
            dead["attempts"], 1,
            "a refusal is final, not retried: {dead}"
        );
        let error = dead["last_error"].as_str().unwrap_or_default();
        assert!(error.contains("410"), "{dead}");
        for sequence in 2..=4 {
            let held = row_of(&db, &changes, order, sequence);
            assert_eq!(held["status"], "pending", "{held}");
            assert_eq!(
                held["attempts"], 0,
                "never sent while change 1 is dead: {held}"
            );
        }
    }
    let answers_so_far = answers(&log);
    assert_eq!(
        of_kind(&answers_so_far, "refused").len(),
        2,
        "{answers_so_far:?}"
    );
    for answer in of_kind(&answers_so_far, "accepted") {
        assert!(
            answer["order_id"] != skipped.as_str() && answer["order_id"] != retried.as_str(),
            "a later change of a held order was sent: {answer}"
        );
    }

    // What the operator sees.
    let skip_row = row_of(&db, &changes, &skipped, 1);
    let retry_row = row_of(&db, &changes, &retried, 1);
    let (skip_id, retry_id) = (skip_row["id"].to_string(), retry_row["id"].to_string());
    let dead = forward_list(&db, &["--status", "dead"]);
    let mut dead_ids: Vec<String> = dead.iter().map(|r| r["id"].to_string()).collect();
    dead_ids.sort();
    let mut expected = vec![skip_id.clone(), retry_id.clone()];
    expected.sort();
    assert_eq!(dead_ids, expected, "{dead:#?}");
    let table = sekali(&["forward", "list", "--db", &db_arg, "--status", "dead"]);
    assert!(table.status.success(), "{table:?}");
    let table = stdout(&table);
    for (row, order) in [(&skip_row, &skipped), (&retry_row, &retried)] {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(row["id"].to_string().as_str()))
            .unwrap_or_else(|| panic!("row {} is not listed:\n{table}", row["id"]));
        for word in [
            "dead",
            order.as_str(),
            row["message_id"].as_str().unwrap(),
            "410",
        ] {
            assert!(line.contains(word), "{word:?} is not in {line:?}");
        }
    }
    let show = sekali(&["forward", "show", &skip_id, "--db", &db_arg]);
    assert!(show.status.success(), "{show:?}");
    let shown = stdout(&show);
    for word in [
        "dead",
        skipped.as_str(),
        skip_row["message_id"].as_str().unwrap(),
        "410",
    ] {
        assert!(shown.contains(word), "{word:?} is not in:\n{shown}");
    }
    let show = sekali(&["forward", "show", &skip_id, "--db", &db_arg, "--json"]);
    let shown: Value = serde_json::from_str(&stdout(&show)).unwrap();
    let feed_change = changes
        .iter()
        .find(|c| c["id"] == skip_row["message_id"])
        .unwrap();
    assert_eq!(
        &shown["message"], feed_change,
        "show prints the message as sent"
    );
    assert_eq!(shown["row"]["status"], "dead");

    // Skip: the skipped order's later changes go; the skipped change never does.
    let output = sekali(&["forward", "skip", &skip_id, "--db", &db_arg]);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout(&output).contains("dead -> skipped"), "{output:?}");
    // Retry, once the endpoint takes it: it goes, then its order's later changes.
    std::fs::remove_file(&flag).unwrap();
    let output = sekali(&["forward", "retry", &retry_id, "--db", &db_arg]);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout(&output).contains("dead -> pending"), "{output:?}");
    wait_until(Duration::from_secs(20), || {
        let now = statuses(&db);
        (now != BTreeMap::from([("sent".to_owned(), 23), ("skipped".to_owned(), 1)]))
            .then(|| format!("{now:?}"))
    });
    let answers = answers(&log);
    let forwarded: Vec<Value> = changes
        .iter()
        .filter(|c| c["id"] != skip_row["message_id"])
        .cloned()
        .collect();
    check_arrivals(&answers, &forwarded);
    assert!(
        !answers
            .iter()
            .any(|a| a["answer"] == "accepted" && a["id"] == skip_row["message_id"]),
        "the skipped change was sent"
    );
    // A finished row is neither retried nor skipped.
    let sent_id = row_of(&db, &changes, &skipped, 2)["id"].to_string();
    for command in ["retry", "skip"] {
        let output = sekali(&["forward", command, &sent_id, "--db", &db_arg]);
        assert!(!output.status.success(), "{command} a sent row: {output:?}");
    }
    drop(serve);
}

/// `sekali forward new-secret`: one line, `whsec_` and the base64 of 32 bytes, alone on stdout;
/// a new one each time.
#[test]
fn new_secret_prints_one_fresh_32_byte_secret_alone() {
    use base64::Engine as _;
    let run = || {
        let output = sekali(&["forward", "new-secret"]);
        assert!(output.status.success(), "{output:?}");
        let text = stdout(&output);
        assert!(text.ends_with('\n'), "{text:?}");
        assert_eq!(text.lines().count(), 1, "{text:?}");
        let secret = text.trim_end_matches('\n').to_owned();
        let encoded = secret
            .strip_prefix("whsec_")
            .unwrap_or_else(|| panic!("{secret:?}"));
        let key = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap_or_else(|e| panic!("{secret:?}: {e}"));
        assert_eq!(key.len(), 32, "{secret:?}");
        secret
    };
    assert_ne!(run(), run());
}

/// A forwarding setting that cannot work refuses startup: the message names the variable, never
/// a secret's value, and nothing is created.
#[test]
fn serve_refuses_a_forwarding_setting_that_cannot_work_naming_it_and_never_the_secret() {
    use base64::Engine as _;
    let good = new_secret();
    let short = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode([7u8; 16])
    );
    let no_prefix = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
    let url = "http://127.0.0.1:9/hooks";
    // (URL, secret, the variable the refusal must name)
    let mut cases: Vec<(Option<&str>, Option<String>, &str)> = vec![
        (Some(url), None, "SEKALI_FORWARD_SECRET"),
        (None, Some(good.clone()), "SEKALI_FORWARD_URL"),
        (
            Some(url),
            Some("whsec_short".into()),
            "SEKALI_FORWARD_SECRET",
        ),
        (Some(url), Some(short.clone()), "SEKALI_FORWARD_SECRET"),
        (Some(url), Some(no_prefix.clone()), "SEKALI_FORWARD_SECRET"),
        (
            Some(url),
            Some(format!("{good},{short}")),
            "SEKALI_FORWARD_SECRET",
        ),
        (Some("ftp://x"), Some(good.clone()), "SEKALI_FORWARD_URL"),
        (
            Some("shop.example/hooks"),
            Some(good.clone()),
            "SEKALI_FORWARD_URL",
        ),
    ];
    // 65 bytes: one over the longest.
    let long = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode([5u8; 65])
    );
    cases.push((Some(url), Some(long), "SEKALI_FORWARD_SECRET"));
    for (url, secret, named) in cases {
        let case = format!("URL {url:?}, secret {secret:?}");
        let (out, err) = refused_start(url, secret.as_deref(), &case);
        assert!(
            err.contains(named),
            "{case}: the refusal names {named}: {err}"
        );
        if let Some(secret) = &secret {
            for part in secret.split(',') {
                // The key's base64, or the whole setting when that is too short to be telling.
                let encoded = part.trim_start_matches("whsec_");
                let value = if encoded.len() >= 16 { encoded } else { part };
                assert!(
                    !err.contains(value) && !out.contains(value),
                    "{case}: a secret's value is printed: {err}{out}"
                );
            }
        }
    }
    // The shortest and the longest secret start (with two, rotating, as well).
    let bounds = [24, 64].map(|bytes| {
        format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(vec![3u8; bytes])
        )
    });
    for secrets in [bounds[0].clone(), bounds[1].clone(), bounds.join(",")] {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::fresh(dir.path().join("bounds.db"));
        let env = forward_env(url, &secrets);
        let mut args = relay_args("5s", "3s", "50");
        args.push("--no-relay");
        let (status, logs) =
            ServeProcess::start_on(Some(db.path()), &refs(&env), "warn", &args).stop();
        assert!(status.success(), "{secrets}: {logs}");
    }
}

/// `sekali serve` with `SEKALI_FORWARD_URL` `url` and `SEKALI_FORWARD_SECRET` `secret` (each
/// unset when `None`), which must refuse to start (said as `case`) and create nothing (no
/// database, no mail directory): what it printed, (stdout, stderr).
fn refused_start(url: Option<&str>, secret: Option<&str>, case: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::fresh(dir.path().join("never.db"));
    let mut command = Command::new(sekali_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--db", &db.arg()])
        .arg("--mail-dir")
        .arg(dir.path().join("mail"))
        .env_remove("SEKALI_FORWARD_URL")
        .env_remove("SEKALI_FORWARD_SECRET")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in helpers::PROVIDER_ENV {
        command.env(name, value);
    }
    if let Some(url) = url {
        command.env("SEKALI_FORWARD_URL", url);
    }
    if let Some(secret) = secret {
        command.env("SEKALI_FORWARD_SECRET", secret);
    }
    let output = output_within(command, Duration::from_secs(15), case);
    let (out, err) = (
        stdout(&output),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(!output.status.success(), "{case}: started: {err}");
    assert!(db.is_untouched(), "{case}: the database was created");
    assert!(
        !dir.path().join("mail").exists(),
        "{case}: the mail directory was created"
    );
    (out, err)
}

/// A password in `SEKALI_FORWARD_URL` (`https://user:password@host/...`) is never printed: not
/// in a running instance's logs (`***@`), and not when the URL is refused at startup, as no
/// other URL setting's password is.
#[test]
fn a_password_in_the_forward_url_is_never_printed_running_or_refused() {
    const PASSWORD: &str = "pa55-w0rd-fwd";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let secret = new_secret();
    let receiver = Receiver::start(&secret, &log, Answers::default());
    let url = format!("http://shop:{PASSWORD}@127.0.0.1:{}/hooks", receiver.port);
    let db = Database::fresh(dir.path().join("forward.db"));
    let env = forward_env(&url, &secret);
    let serve = ServeProcess::start_on(
        Some(db.path()),
        &refs(&env),
        "debug",
        &relay_args("5s", "3s", "50"),
    );
    deliver_lives(&[serve.port], "pw", 0..1, 0..2);
    wait_all_sent(&db, Duration::from_secs(20));
    let (_, logs) = serve.stop();
    assert!(logs.contains("forwarding started"), "{logs}");
    assert!(!logs.contains(PASSWORD), "{logs}");

    for url in [
        format!("ftp://shop:{PASSWORD}@shop.example/hooks"),
        format!("https://shop:{PASSWORD}@/hooks"),
    ] {
        let (out, err) = refused_start(Some(&url), Some(&secret), &url);
        assert!(err.contains("SEKALI_FORWARD_URL"), "{url}: {err}");
        assert!(
            !err.contains(PASSWORD) && !out.contains(PASSWORD),
            "the refusal of {url} prints its password: {err}{out}"
        );
    }
}

/// Runs `command` to its end; kills it and panics (saying `case`) if it runs past `within`.
fn output_within(mut command: Command, within: Duration, case: &str) -> Output {
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "{case}: serve started and ran for {within:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Without `SEKALI_FORWARD_URL` no change is queued for forwarding. Started with it, only the
/// changes made from then on are queued and arrive (an order's later change too, its earlier
/// ones never having been queued); started without it again, new changes are not queued.
#[test]
fn only_changes_made_while_forwarding_is_on_are_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let secret = new_secret();
    let receiver = Receiver::start(&secret, &log, Answers::default());
    let db = Database::fresh(dir.path().join("forward.db"));

    let off = serve_not_forwarding(&db);
    deliver_lives(&[off.port], "off", 0..2, 0..4);
    deliver_lives(&[off.port], "off", 2..3, 0..2);
    assert_eq!(db.count("SELECT count(*) FROM order_transitions"), 10);
    assert_eq!(db.count("SELECT count(*) FROM forward_outbox"), 0);
    let before = db.count("SELECT max(id) FROM order_transitions");
    let (status, logs) = off.stop();
    assert!(status.success(), "{logs}");

    let on = serve_forwarding(&db, &receiver.url(), &secret);
    // The rest of the third order's life, and a new order's whole life.
    deliver_lives(&[on.port], "off", 2..3, 2..4);
    deliver_lives(&[on.port], "on", 0..1, 0..4);
    wait_until(Duration::from_secs(20), || {
        let now = statuses(&db);
        (now != BTreeMap::from([("sent".to_owned(), 6)])).then(|| format!("{now:?}"))
    });
    let changes = all_changes(on.port);
    assert_eq!(changes.len(), 16);
    let after: Vec<Value> = changes
        .iter()
        .filter(|c| {
            let id: i64 = c["id"].as_str().unwrap()["chg_".len()..].parse().unwrap();
            id > before
        })
        .cloned()
        .collect();
    assert_eq!(after.len(), 6);
    check_arrivals(&answers(&log), &after);
    let (status, logs) = on.stop();
    assert!(status.success(), "{logs}");

    let off_again = serve_not_forwarding(&db);
    deliver_lives(&[off_again.port], "off", 3..4, 0..4);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(db.count("SELECT count(*) FROM order_transitions"), 20);
    assert_eq!(statuses(&db), BTreeMap::from([("sent".to_owned(), 6)]));
    assert_eq!(answers(&log).len(), 6, "nothing more arrived");
    drop(off_again);
}

/// `sekali serve` killed with SIGKILL three times while it takes deliveries and forwards them
/// (started again each time on the same database; a delivery that got no answer is sent again,
/// as a provider would): every change arrives at least once, each order's in order, and no
/// change is lost (each has its row, and every row ends `sent`).
#[test]
fn killed_while_forwarding_it_loses_no_change_and_keeps_each_orders_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let secret = new_secret();
    let receiver = Receiver::start(
        &secret,
        &log,
        // Slow answers: a kill finds messages in flight.
        Answers {
            fail_ratio: 0.1,
            delay_ms: 300,
            ..Default::default()
        },
    );
    let db = Database::fresh(dir.path().join("forward.db"));
    let env = forward_env(&receiver.url(), &secret);
    // A lease that a killed instance's rows outlive soon.
    let args = relay_args("2s", "1s", "50");
    let start = || ServeProcess::start_on(Some(db.path()), &refs(&env), "warn", &args);
    let mut serve = Some(start());
    let port = AtomicU16::new(serve.as_ref().unwrap().port);

    const ORDERS: usize = 60;
    let deliveries = AtomicUsize::new(0);
    let mut at_kills = Vec::new();
    std::thread::scope(|scope| {
        let senders: Vec<_> = (0..4)
            .map(|t| {
                let (port, deliveries) = (&port, &deliveries);
                scope.spawn(move || {
                    let agent = agent();
                    let mine: Vec<usize> = (0..ORDERS).filter(|i| i % 4 == t).collect();
                    let lives: Vec<_> = mine.iter().map(|&i| lifecycle("kill", i)).collect();
                    for step in 0..4 {
                        for (life, &i) in lives.iter().zip(&mine) {
                            let deadline = Instant::now() + Duration::from_secs(30);
                            loop {
                                let answer = helpers::deliver_stripe(
                                    &agent,
                                    port.load(Ordering::SeqCst),
                                    &life[step],
                                );
                                if answer.0 == 200 {
                                    assert!(
                                        ["processed", "duplicate"].contains(&answer.1.as_str()),
                                        "{answer:?}"
                                    );
                                    break;
                                }
                                assert!(
                                    Instant::now() < deadline,
                                    "{} of {}: {answer:?}",
                                    LIFECYCLE[step],
                                    order_id("kill", i)
                                );
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            deliveries.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                })
            })
            .collect();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(1000));
            let killed = serve.take().unwrap();
            // The rows this instance is sending right now (its relay's owner is
            // host:pid:random:forward).
            let in_flight = format!(
                "SELECT count(*) FROM forward_outbox WHERE status = 'pending' \
                 AND lease_owner LIKE '%:{}:%'",
                killed.pid()
            );
            at_kills.push((
                deliveries.load(Ordering::SeqCst),
                db.count("SELECT count(*) FROM forward_outbox WHERE status = 'pending'"),
                db.count(&in_flight),
            ));
            let signal = Command::new("kill")
                .args(["-KILL", &killed.pid().to_string()])
                .status()
                .unwrap();
            assert!(signal.success());
            let (status, _) = killed.wait();
            assert!(!status.success(), "{status}");
            let started = start();
            port.store(started.port, Ordering::SeqCst);
            serve = Some(started);
        }
        for sender in senders {
            if let Err(panic) = sender.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    println!("(deliveries done, rows pending, rows in flight) at each kill: {at_kills:?}");
    assert!(
        at_kills.iter().all(|(done, _, _)| *done < ORDERS * 4),
        "every kill came while events were still being delivered: {at_kills:?}"
    );
    assert!(
        at_kills.iter().any(|(_, _, in_flight)| *in_flight > 0),
        "a kill came while changes were being sent: {at_kills:?}"
    );
    let serve = serve.unwrap();
    wait_all_sent(&db, Duration::from_secs(30));
    let changes = all_changes(serve.port);
    assert_eq!(changes.len(), ORDERS * 4, "each order's four changes");
    let answers = answers(&log);
    check_arrivals(&answers, &changes);
    let accepted = of_kind(&answers, "accepted").len();
    println!(
        "{accepted} acceptances of {} changes (the rest were sent again after a kill)",
        changes.len()
    );
    drop(serve);
}

/// How the endpoint's answer decides a message's fate: one worth another try (429, 503, 425)
/// is tried again, after the endpoint's Retry-After when it gives one (instead of the much
/// shorter backoff), up to --relay-max-attempts tries, then the row is dead; any other (a 302:
/// redirects are not followed) is dead at once. The answer is in the dead row's last error, and
/// its order's later changes wait; another order's go.
#[test]
fn an_answer_worth_a_retry_is_tried_again_after_its_retry_after_until_the_attempt_limit() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let secret = new_secret();
    // (order, status, Retry-After, tries expected)
    let cases = [
        (order_id("again", 0), 429, Some(1), 3),
        (order_id("again", 1), 503, None, 3),
        (order_id("again", 2), 425, None, 3),
        (order_id("again", 3), 302, None, 1),
    ];
    let answer = cases
        .iter()
        .map(|(order, status, retry_after, _)| match retry_after {
            Some(seconds) => format!("{order}:1:{status}:{seconds}"),
            None => format!("{order}:1:{status}"),
        })
        .collect();
    let receiver = Receiver::start(
        &secret,
        &log,
        Answers {
            answer,
            ..Default::default()
        },
    );
    let db = Database::fresh(dir.path().join("forward.db"));
    let env = forward_env(&receiver.url(), &secret);
    let serve = ServeProcess::start_on(
        Some(db.path()),
        &refs(&env),
        "warn",
        &relay_args("5s", "3s", "3"),
    );
    deliver_lives(&[serve.port], "again", 0..5, 0..4);
    wait_until(Duration::from_secs(20), || {
        let now = statuses(&db);
        (now != BTreeMap::from([
            ("dead".to_owned(), 4),
            ("pending".to_owned(), 12),
            ("sent".to_owned(), 4),
        ]))
        .then(|| format!("{now:?}"))
    });
    let changes = all_changes(serve.port);
    let answers = answers(&log);
    for (order, status, retry_after, expected) in &cases {
        let row = row_of(&db, &changes, order, 1);
        assert_eq!(row["status"], "dead", "{row}");
        assert_eq!(row["attempts"], *expected, "{row}");
        let error = row["last_error"].as_str().unwrap_or_default();
        assert!(
            error.contains(&status.to_string()) && error.contains("not now"),
            "the answer's status and body: {row}"
        );
        let tries: Vec<f64> = answers
            .iter()
            .filter(|a| a["id"] == row["message_id"])
            .map(|a| {
                assert_eq!(a["status"], *status, "{a}");
                a["at"].as_f64().unwrap()
            })
            .collect();
        assert_eq!(
            tries.len(),
            *expected as usize,
            "tries of {order}'s first change: {tries:?}"
        );
        let gaps: Vec<f64> = tries.windows(2).map(|w| w[1] - w[0]).collect();
        if retry_after.is_some() {
            assert!(
                gaps.iter().all(|g| *g >= 0.95),
                "Retry-After: 1 is honoured: {gaps:?}"
            );
        } else {
            assert!(
                gaps.iter().all(|g| *g < 0.9),
                "without Retry-After the backoff (100 ms, then 200 ms at most) applies: {gaps:?}"
            );
        }
        for sequence in 2..=4 {
            let held = row_of(&db, &changes, order, sequence);
            assert_eq!(held["status"], "pending", "{held}");
            assert_eq!(held["attempts"], 0, "{held}");
        }
    }
    let forwarded: Vec<Value> = changes
        .iter()
        .filter(|c| c["order_id"] == order_id("again", 4).as_str())
        .cloned()
        .collect();
    check_arrivals(&answers, &forwarded);
    drop(serve);
}

/// `serve --no-relay` with forwarding set queues every change but sends none; an instance that
/// sends (started later on the same database) sends them all, in order per order.
#[test]
fn with_no_relay_changes_are_queued_but_sent_only_by_an_instance_that_sends() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let secret = new_secret();
    let receiver = Receiver::start(&secret, &log, Answers::default());
    let db = Database::fresh(dir.path().join("forward.db"));
    let env = forward_env(&receiver.url(), &secret);
    let mut args = relay_args("5s", "3s", "50");
    args.push("--no-relay");
    let quiet = ServeProcess::start_on(Some(db.path()), &refs(&env), "warn", &args);
    deliver_lives(&[quiet.port], "quiet", 0..3, 0..4);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(statuses(&db), BTreeMap::from([("pending".to_owned(), 12)]));
    assert_eq!(answers(&log).len(), 0, "nothing was sent");
    let (status, logs) = quiet.stop();
    assert!(status.success(), "{logs}");

    let sender = serve_forwarding(&db, &receiver.url(), &secret);
    wait_all_sent(&db, Duration::from_secs(20));
    check_arrivals(&answers(&log), &all_changes(sender.port));
    drop(sender);
}

/// Two instances on one PostgreSQL database, each forwarding, each taking half of every order's
/// events, through an endpoint that fails a fifth of the messages: the instances never send one
/// change twice (their claims exclude each other), and each order's changes still arrive in
/// order.
#[test]
fn two_instances_on_one_postgresql_database_send_each_change_once_in_order_per_order() {
    if helpers::engine() != helpers::Engine::Postgres {
        println!("skipped on sqlite: several instances share a PostgreSQL database");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("received.jsonl");
    let secret = new_secret();
    let receiver = Receiver::start(
        &secret,
        &log,
        Answers {
            fail_ratio: 0.2,
            ..Default::default()
        },
    );
    let db = Database::fresh(dir.path().join("forward.db"));
    let a = serve_forwarding(&db, &receiver.url(), &secret);
    let b = serve_forwarding(&db, &receiver.url(), &secret);
    deliver_lives(&[a.port, b.port], "pair", 0..40, 0..4);
    wait_all_sent(&db, Duration::from_secs(60));
    let changes = all_changes(a.port);
    assert_eq!(changes.len(), 160);
    let answers = answers(&log);
    check_arrivals(&answers, &changes);
    let mut accepted: HashMap<&str, usize> = HashMap::new();
    for answer in of_kind(&answers, "accepted") {
        *accepted.entry(answer["id"].as_str().unwrap()).or_default() += 1;
    }
    let twice: Vec<_> = accepted.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "sent again after it was taken: {twice:?}");
    drop((a, b));
}

/// An order id from a webhook is whatever a stranger put in the payment's metadata: HTML, a
/// control character, a bidi override. Through the real server it reaches the change feed as
/// JSON (the same text back, no raw control byte, served as `application/json`), and the
/// operator's `forward list` and `forward show` print it escaped: nothing in it can recolour a
/// terminal or turn the rest of a line around.
#[test]
fn a_hostile_order_id_stays_inert_in_the_feed_and_in_the_forwarding_listings() {
    let db = Database::fresh(tempfile::tempdir().unwrap().keep().join("hostile.db"));
    // Forwarding on, to a port nothing listens on: the change stays pending, listed.
    let server = serve_forwarding(
        &db,
        &format!("http://127.0.0.1:{}/hooks", helpers::free_port()),
        &new_secret(),
    );
    let hostile_json = r#"ord_<script>alert(1)</script>\u202egnp.exe\u0007\u001b[31m"#;
    let hostile: String = serde_json::from_str(&format!("\"{hostile_json}\"")).unwrap();
    let body = String::from_utf8(helpers::fixture("stripe/payment_intent.succeeded.json"))
        .unwrap()
        .replace("\"ord_1001\"", &format!("\"{hostile_json}\""))
        .replace("\"evt_", "\"evt_hostile_");
    assert_eq!(
        helpers::deliver_stripe(&agent(), server.port, body.as_bytes()),
        (200, "processed".to_owned())
    );

    let response = agent()
        .get(&format!("http://127.0.0.1:{}/changes", server.port))
        .set("Authorization", &format!("Bearer {TOKEN}"))
        .call()
        .unwrap();
    assert!(
        response.content_type().starts_with("application/json"),
        "{}",
        response.content_type()
    );
    let raw = response.into_string().unwrap();
    assert!(
        !raw.contains('\u{7}') && !raw.contains('\u{1b}'),
        "no raw control byte in the feed: {raw:?}"
    );
    let page: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(
        page["changes"][0]["order_id"],
        Value::String(hostile.clone())
    );

    let db_arg = db.arg();
    let listed = stdout(&sekali(&["forward", "list", "--db", &db_arg]));
    let row = forward_list(&db, &[]);
    assert_eq!(row.len(), 1, "{listed}");
    assert_eq!(row[0]["order_id"], Value::String(hostile.clone()));
    let id = row[0]["id"].as_i64().unwrap().to_string();
    let shown = stdout(&sekali(&["forward", "show", &id, "--db", &db_arg]));
    for printed in [&listed, &shown] {
        for raw_char in ['\u{7}', '\u{1b}', '\u{202e}'] {
            assert!(
                !printed.contains(raw_char),
                "{raw_char:?} printed raw: {printed:?}"
            );
        }
        assert!(printed.contains("gnp.exe"), "{printed}");
    }
    assert!(listed.contains(r"\u{202e}"), "{listed}");
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");
}
