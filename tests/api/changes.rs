//! The change feed, `GET /changes?after=CURSOR&limit=N`: every order change (each row of
//! `order_transitions`) once, oldest first, paged by an opaque cursor, behind the orders API's
//! bearer tokens. Black-box over HTTP, on either engine.

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::join_all;
use sekali::config::parse_api_tokens;
use serde_json::{json, Value};

use crate::helpers::*;

const SHOP: &str = "tok-feed-shop-81b2c4";

async fn spawn_api() -> TestApp {
    spawn_app_with(|s| s.api_tokens = parse_api_tokens(&format!("shop:{SHOP}")).unwrap()).await
}

/// A response: status, content type and body.
#[derive(Debug)]
struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// `GET path` with `token` as the bearer token (none when `None`).
async fn get(app: &TestApp, path: &str, token: Option<&str>) -> Reply {
    let mut request = app.client.get(format!("{}{path}", app.address));
    if let Some(token) = token {
        request = request.insert_header(("Authorization", format!("Bearer {token}")));
    }
    let mut response = request.send().await.expect("the request is answered");
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.body().limit(16 << 20).await.expect("a body");
    Reply {
        status: response.status().as_u16(),
        content_type,
        body: String::from_utf8(body.to_vec()).expect("a UTF-8 body"),
    }
}

/// `POST /orders` under `key`, as the shop.
async fn create_order(app: &TestApp, key: &str, body: &str) -> Reply {
    let mut response = app
        .client
        .post(format!("{}/orders", app.address))
        .insert_header(("Authorization", format!("Bearer {SHOP}")))
        .insert_header(("Idempotency-Key", key))
        .insert_header(("Content-Type", "application/json"))
        .send_body(body.to_owned())
        .await
        .expect("the request is answered");
    let body = response.body().await.expect("a body");
    Reply {
        status: response.status().as_u16(),
        content_type: String::new(),
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// `cursor` as a query value: opaque, so encoded as any value would be.
fn encoded(cursor: &str) -> String {
    percent_encoding::utf8_percent_encode(cursor, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The query of a page after `after` (from the start when `None`) of `limit` changes (the
/// server's default when `None`).
fn feed_query(after: Option<&str>, limit: Option<u32>) -> String {
    let mut parts = Vec::new();
    if let Some(after) = after {
        parts.push(format!("after={}", encoded(after)));
    }
    if let Some(limit) = limit {
        parts.push(format!("limit={limit}"));
    }
    if parts.is_empty() {
        "/changes".to_owned()
    } else {
        format!("/changes?{}", parts.join("&"))
    }
}

/// One page of the feed, which must be answered 200 with JSON: its changes (each checked by
/// [`check_shape`]) and its `next_after`.
async fn page(
    app: &TestApp,
    after: Option<&str>,
    limit: Option<u32>,
) -> (Vec<Value>, Option<String>) {
    let path = feed_query(after, limit);
    let reply = get(app, &path, Some(SHOP)).await;
    assert_eq!(reply.status, 200, "GET {path}: {}", reply.body);
    assert!(
        reply.content_type.starts_with("application/json"),
        "GET {path}: {}",
        reply.content_type
    );
    let json = reply.json();
    let object = json
        .as_object()
        .unwrap_or_else(|| panic!("GET {path}: not a JSON object: {}", reply.body));
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        ["changes", "next_after"],
        "GET {path}: {}",
        reply.body
    );
    let changes = json["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("GET {path}: changes is no array: {}", reply.body))
        .clone();
    for change in &changes {
        check_shape(change);
    }
    let next_after = match &json["next_after"] {
        Value::Null => None,
        Value::String(cursor) => Some(cursor.clone()),
        other => panic!("GET {path}: next_after is {other}"),
    };
    if let Some(limit) = limit {
        assert!(
            changes.len() <= limit as usize,
            "GET {path}: {} changes",
            changes.len()
        );
    }
    match changes.last() {
        // The cursor of the last change on the page. Opaque; on SQLite, the change's row id.
        Some(last) => {
            let cursor = next_after
                .as_deref()
                .unwrap_or_else(|| panic!("GET {path}: a page of changes with no next_after"));
            assert!(!cursor.is_empty(), "GET {path}: an empty next_after");
            if engine() == Engine::Sqlite {
                assert_eq!(
                    cursor,
                    change_number(last),
                    "GET {path}: next_after is the last change's id"
                );
            }
        }
        None => assert_eq!(
            next_after.as_deref(),
            after,
            "GET {path}: an empty page's next_after is the after passed"
        ),
    }
    (changes, next_after)
}

/// Follows the feed from `after` in pages of `limit` until a page comes back empty: every change
/// seen, the cursor to go on from, and the size of each non-empty page.
async fn follow(
    app: &TestApp,
    mut after: Option<String>,
    limit: u32,
) -> (Vec<Value>, Option<String>, Vec<usize>) {
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let (changes, next_after) = page(app, after.as_deref(), Some(limit)).await;
        if changes.is_empty() {
            return (seen, after, sizes);
        }
        assert!(sizes.len() < 10_000, "the feed never ends");
        sizes.push(changes.len());
        seen.extend(changes);
        after = next_after;
    }
}

/// The whole feed, read once the database holds `expected` changes and the feed shows all of
/// them (PostgreSQL's feed may hold a change back for a moment while another transaction runs).
/// Fails if the database holds another number, or the feed does not catch up within 5 s.
async fn settled_feed(app: &TestApp, expected: usize) -> Vec<Value> {
    assert_eq!(
        app.count("SELECT count(*) FROM order_transitions"),
        expected as i64,
        "changes in order_transitions"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (all, _, _) = follow(app, None, 1000).await;
        if all.len() >= expected || Instant::now() > deadline {
            assert_eq!(
                all.len(),
                expected,
                "the feed shows every change in order_transitions: {all:#?}"
            );
            return all;
        }
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The keys every change has (`metadata` besides, when its order has metadata).
const FIELDS: [&str; 13] = [
    "id",
    "type",
    "order_id",
    "status",
    "previous_status",
    "amount",
    "refunded_amount",
    "currency",
    "provider",
    "provider_event_id",
    "changed_by",
    "changed_at",
    "sequence",
];

fn text<'a>(change: &'a Value, key: &str) -> Option<&'a str> {
    change[key].as_str()
}

/// The number in a change's id (`chg_<number>`).
fn change_number(change: &Value) -> &str {
    let id = text(change, "id").unwrap_or_else(|| panic!("no id: {change}"));
    id.strip_prefix("chg_")
        .unwrap_or_else(|| panic!("id {id:?} does not start with chg_"))
}

fn changed_at(change: &Value) -> SystemTime {
    let at = text(change, "changed_at").unwrap_or_else(|| panic!("no changed_at: {change}"));
    humantime::parse_rfc3339(at).unwrap_or_else(|e| panic!("changed_at {at:?}: {e}"))
}

/// What every change must look like, whatever it is.
fn check_shape(change: &Value) {
    let object = change
        .as_object()
        .unwrap_or_else(|| panic!("a change is an object: {change}"));
    let mut keys: Vec<&str> = object
        .keys()
        .map(String::as_str)
        .filter(|k| *k != "metadata")
        .collect();
    keys.sort();
    let mut expected = FIELDS.to_vec();
    expected.sort();
    assert_eq!(keys, expected, "the fields of {change}");
    if let Some(metadata) = object.get("metadata") {
        assert!(
            metadata.is_object(),
            "metadata is an object when present: {change}"
        );
    }
    let number = change_number(change);
    assert!(
        !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()),
        "id: {change}"
    );
    let status = text(change, "status").unwrap_or_else(|| panic!("status: {change}"));
    assert_eq!(
        text(change, "type"),
        Some(format!("order.{status}").as_str()),
        "{change}"
    );
    assert!(
        change["previous_status"].is_null() || change["previous_status"].is_string(),
        "{change}"
    );
    assert!(
        change["sequence"].as_i64().is_some_and(|n| n >= 1),
        "sequence: {change}"
    );
    assert!(
        change["refunded_amount"].is_i64(),
        "refunded_amount: {change}"
    );
    assert!(
        change["amount"].is_null() || change["amount"].is_i64(),
        "amount: {change}"
    );
    assert!(
        change["currency"].is_null() || change["currency"].is_string(),
        "{change}"
    );
    assert!(
        matches!(
            text(change, "provider"),
            Some("stripe" | "midtrans" | "xendit")
        ),
        "provider: {change}"
    );
    let by = text(change, "changed_by");
    assert!(
        matches!(
            by,
            Some("stripe" | "midtrans" | "xendit" | "api" | "operator")
        ),
        "changed_by: {change}"
    );
    if matches!(by, Some("api" | "operator")) {
        assert!(change["provider_event_id"].is_null(), "{change}");
    } else {
        assert!(
            text(change, "provider_event_id").is_some_and(|id| !id.is_empty()),
            "a webhook's change names its event: {change}"
        );
    }
    let at = text(change, "changed_at").unwrap();
    assert!(at.ends_with('Z'), "changed_at in UTC: {change}");
    changed_at(change);
}

/// The changes of `order_id` among `changes`, in their order.
fn of_order<'a>(changes: &'a [Value], order_id: &str) -> Vec<&'a Value> {
    changes
        .iter()
        .filter(|c| c["order_id"] == order_id)
        .collect()
}

/// An order's changes, in feed order, tell one story: numbered 1, 2, 3, ..., each starting from
/// the status the one before it ended in, the first from none.
fn check_story(order_id: &str, changes: &[&Value]) {
    assert!(!changes.is_empty(), "{order_id}: no changes");
    let sequences: Vec<i64> = changes
        .iter()
        .map(|c| c["sequence"].as_i64().unwrap())
        .collect();
    let expected: Vec<i64> = (1..=changes.len() as i64).collect();
    assert_eq!(
        sequences, expected,
        "{order_id}: sequence numbers in feed order"
    );
    let mut previous: Option<&str> = None;
    for change in changes {
        assert_eq!(
            text(change, "previous_status"),
            previous,
            "{order_id}: each change starts where the one before ended: {change}"
        );
        previous = text(change, "status");
    }
}

/// An order's changes in the feed are its history as `GET /orders/{id}` shows it: the same
/// changes in the same order, with the same statuses, amounts refunded, authors, events and
/// times.
async fn check_against_history(app: &TestApp, order_id: &str, changes: &[&Value]) {
    let reply = get(app, &format!("/orders/{order_id}"), Some(SHOP)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let order = reply.json();
    let history = order["history"].as_array().expect("a history").clone();
    assert_eq!(
        changes.len(),
        history.len(),
        "{order_id}: the feed's changes and the history's: {changes:#?} {history:#?}"
    );
    for (change, h) in changes.iter().zip(&history) {
        assert_eq!(change["status"], h["to_status"], "{change} {h}");
        assert_eq!(change["previous_status"], h["from_status"], "{change} {h}");
        assert_eq!(
            change["refunded_amount"], h["refunded_amount"],
            "{change} {h}"
        );
        assert_eq!(change["changed_by"], h["provider"], "{change} {h}");
        if !matches!(text(change, "changed_by"), Some("api" | "operator")) {
            assert_eq!(change["provider_event_id"], h["event_id"], "{change} {h}");
        }
        let at = humantime::parse_rfc3339(h["changed_at"].as_str().unwrap()).unwrap();
        assert_eq!(changed_at(change), at, "{change} {h}");
        assert_eq!(change["provider"], order["provider"], "{change}");
    }
}

/// The ids of `changes`, which must all differ.
fn distinct_ids(changes: &[Value]) -> HashSet<String> {
    let ids: HashSet<String> = changes
        .iter()
        .map(|c| text(c, "id").unwrap().to_owned())
        .collect();
    assert_eq!(
        ids.len(),
        changes.len(),
        "a change appears twice: {changes:#?}"
    );
    ids
}

/// A Stripe payment's life for the order `ord_<tag>`: pending, paid, partly refunded ($10.00
/// of $25.00), refunded: the fixtures of ord_1001 with their ids made the tag's.
fn stripe_lifecycle(tag: &str) -> [Vec<u8>; 4] {
    [
        "payment_intent.processing",
        "payment_intent.succeeded",
        "charge.refunded.partial",
        "charge.refunded.full",
    ]
    .map(|name| {
        String::from_utf8(fixture(&format!("stripe/{name}.json")))
            .unwrap()
            .replace("Order1001", &format!("Order{tag}"))
            .replace("ord_1001", &format!("ord_{tag}"))
            .replace("\"evt_", &format!("\"evt_{tag}_"))
            .into_bytes()
    })
}

const API_ORDER: &str = r#"{"order_id": "ord_1001", "amount": 2500, "currency": "usd", "provider": "stripe", "customer_email": "ana@example.com", "metadata": {"locale": "en", "cart": [7, 9], "shop_ref": "A-17"}}"#;

/// An order created through the API, paid and refunded through Stripe, beside a Midtrans
/// order created by its webhooks: read one change a page, every change comes once, in the
/// order it happened, each order's numbered and chained, and as its history shows it.
#[actix_web::test]
async fn a_paid_and_refunded_order_tells_its_story_once_and_in_order_one_change_a_page() {
    let app = spawn_api().await;
    let created = create_order(&app, "k-story", API_ORDER).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(app.deliver_midtrans("pending").await.outcome(), "processed");
    let stripe = |name: &'static str| app.deliver_stripe(name);
    assert_eq!(
        stripe("payment_intent.succeeded").await.outcome(),
        "processed"
    );
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );
    assert_eq!(
        stripe("charge.refunded.partial").await.outcome(),
        "processed"
    );
    assert_eq!(stripe("charge.refunded.full").await.outcome(), "processed");

    let everything = settled_feed(&app, 6).await;
    let (paged, _, sizes) = follow(&app, None, 1).await;
    assert_eq!(sizes, [1; 6], "one change a page");
    assert_eq!(
        paged, everything,
        "one change a page or all at once, the same"
    );
    distinct_ids(&paged);
    let story: Vec<(&str, &str)> = paged
        .iter()
        .map(|c| (text(c, "order_id").unwrap(), text(c, "status").unwrap()))
        .collect();
    assert_eq!(
        story,
        [
            ("ord_1001", "pending"),
            ("ORDER-2001", "pending"),
            ("ord_1001", "paid"),
            ("ORDER-2001", "paid"),
            ("ord_1001", "partially_refunded"),
            ("ord_1001", "refunded"),
        ],
        "oldest first"
    );
    // The row ids of order_transitions, each once.
    let mut numbers: Vec<i64> = paged
        .iter()
        .map(|c| change_number(c).parse().unwrap())
        .collect();
    numbers.sort();
    let rows: Vec<i64> = app
        .texts("SELECT id FROM order_transitions ORDER BY id")
        .iter()
        .map(|id| id.parse().unwrap())
        .collect();
    assert_eq!(
        numbers, rows,
        "chg_ and the row id of each order_transitions row"
    );

    let api_order = of_order(&paged, "ord_1001");
    check_story("ord_1001", &api_order);
    check_against_history(&app, "ord_1001", &api_order).await;
    let column = |key: &str| -> Vec<Value> { api_order.iter().map(|c| c[key].clone()).collect() };
    assert_eq!(
        column("type"),
        [
            "order.pending",
            "order.paid",
            "order.partially_refunded",
            "order.refunded"
        ]
    );
    assert_eq!(column("changed_by"), ["api", "stripe", "stripe", "stripe"]);
    assert_eq!(
        column("provider_event_id"),
        [
            Value::Null,
            json!("evt_1QA0002succeeded000001"),
            json!("evt_1QA0003refundpartial01"),
            json!("evt_1QA0004refundfull00001")
        ]
    );
    assert_eq!(column("refunded_amount"), [0, 0, 1000, 2500]);
    assert_eq!(column("amount"), [2500; 4]);
    assert_eq!(column("provider"), ["stripe"; 4]);
    for change in &api_order {
        assert_eq!(
            text(change, "currency")
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("usd"),
            "{change}"
        );
        assert_eq!(
            change.get("metadata"),
            Some(&json!({"locale": "en", "cart": [7, 9], "shop_ref": "A-17"})),
            "the API order's metadata in each of its changes: {change}"
        );
    }

    let webhook_order = of_order(&paged, "ORDER-2001");
    check_story("ORDER-2001", &webhook_order);
    check_against_history(&app, "ORDER-2001", &webhook_order).await;
    let midtrans_order = get(&app, "/orders/ORDER-2001", Some(SHOP)).await.json();
    for change in &webhook_order {
        assert_eq!(change["changed_by"], "midtrans", "{change}");
        assert_eq!(change["provider"], "midtrans", "{change}");
        assert!(
            change.get("metadata").is_none(),
            "no metadata, no key: {change}"
        );
        assert_eq!(change["amount"], midtrans_order["amount"], "{change}");
        assert_eq!(change["currency"], midtrans_order["currency"], "{change}");
    }
    assert_ne!(
        webhook_order[0]["provider_event_id"], webhook_order[1]["provider_event_id"],
        "each change names the event that made it"
    );
}

/// Pages of 7 over 25 changes of 7 orders are the one page of 1000, cut; the end is an empty
/// page that gives the cursor back; and a stored cursor later brings exactly the changes made
/// since.
#[actix_web::test]
async fn pages_of_seven_are_one_big_page_cut_and_a_stored_cursor_brings_only_later_changes() {
    let app = spawn_api().await;
    // Nothing yet: an empty page, and no cursor to go on from.
    assert_eq!(page(&app, None, None).await, (vec![], None));
    assert_eq!(page(&app, None, Some(7)).await, (vec![], None));

    let lifecycles: Vec<[Vec<u8>; 4]> =
        (0..6).map(|o| stripe_lifecycle(&format!("P{o}"))).collect();
    for step in 0..4 {
        for lifecycle in &lifecycles {
            let answer = app.deliver_stripe_body(&lifecycle[step]).await;
            assert_eq!(answer.outcome(), "processed", "{answer:?}");
        }
        if step == 1 {
            assert_eq!(
                app.deliver_midtrans("settlement").await.outcome(),
                "processed"
            );
        }
    }
    let everything = settled_feed(&app, 25).await;
    let (one_page, cursor) = page(&app, None, Some(1000)).await;
    assert_eq!(one_page, everything);
    let (paged, stored, sizes) = follow(&app, None, 7).await;
    assert_eq!(sizes, [7, 7, 7, 4]);
    assert_eq!(paged, one_page, "pages of 7 are the page of 1000, cut");
    assert_eq!(
        stored, cursor,
        "the last page ends where the one big page ends"
    );
    let before = distinct_ids(&paged);
    for o in 0..6 {
        let order_id = format!("ord_P{o}");
        let changes = of_order(&paged, &order_id);
        check_story(&order_id, &changes);
        let statuses: Vec<&str> = changes.iter().map(|c| text(c, "status").unwrap()).collect();
        assert_eq!(
            statuses,
            ["pending", "paid", "partially_refunded", "refunded"]
        );
    }
    // Round by round: each order's pending, then each one's payment, ...
    let first_round: Vec<&str> = paged[..6]
        .iter()
        .map(|c| text(c, "order_id").unwrap())
        .collect();
    assert_eq!(
        first_round,
        ["ord_P0", "ord_P1", "ord_P2", "ord_P3", "ord_P4", "ord_P5"]
    );

    // Later changes: three new orders, and a refund of the Midtrans one.
    for body in distinct_succeeded_bodies("late", 3) {
        assert_eq!(app.deliver_stripe_body(&body).await.outcome(), "processed");
    }
    assert_eq!(
        app.deliver_midtrans("partial_refund.1").await.outcome(),
        "processed"
    );
    settled_feed(&app, 29).await;
    let (later, _, _) = follow(&app, stored.clone(), 7).await;
    let later_orders: Vec<(&str, &str)> = later
        .iter()
        .map(|c| (text(c, "order_id").unwrap(), text(c, "status").unwrap()))
        .collect();
    assert_eq!(
        later_orders,
        [
            ("ord_late_00", "paid"),
            ("ord_late_01", "paid"),
            ("ord_late_02", "paid"),
            ("ORDER-2001", "partially_refunded"),
        ],
        "after the stored cursor: only what changed since, nothing earlier again"
    );
    assert!(distinct_ids(&later).is_disjoint(&before));
    let refund = &later[3];
    assert_eq!(
        (refund["sequence"].as_i64(), text(refund, "previous_status")),
        (Some(2), Some("paid"))
    );
    // And from the start, the same changes with the later ones after them.
    let (all, _, _) = follow(&app, None, 7).await;
    assert_eq!(all, [paged, later].concat());
}

/// Without `limit`, a page holds 100 changes.
#[actix_web::test]
async fn without_a_limit_a_page_holds_a_hundred_changes() {
    let app = spawn_api().await;
    let bodies = distinct_succeeded_bodies("many", 103);
    let answers = join_all(bodies.iter().map(|body| app.deliver_stripe_body(body))).await;
    assert!(
        answers.iter().all(|a| a.outcome() == "processed"),
        "{answers:?}"
    );
    let everything = settled_feed(&app, 103).await;
    let (first, cursor) = page(&app, None, None).await;
    assert_eq!(first.len(), 100);
    let (rest, _) = page(&app, cursor.as_deref(), None).await;
    assert_eq!(rest.len(), 3);
    assert_eq!([first, rest].concat(), everything);
}

/// The feed is the shop's: no token or an unknown one is a 401; a limit outside 1..=1000 or no
/// number, or a cursor the feed never gave, a 400; each a problem+json.
#[actix_web::test]
async fn the_feed_wants_a_token_and_refuses_bad_limits_and_cursors_as_problems() {
    let app = spawn_api().await;
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    settled_feed(&app, 1).await;
    for token in [None, Some("tok-not-the-shops"), Some("")] {
        let reply = get(&app, "/changes", token).await;
        assert_eq!(
            (reply.status, reply.content_type.as_str()),
            (401, "application/problem+json"),
            "token {token:?}: {}",
            reply.body
        );
        assert_eq!(
            reply.json()["type"],
            "urn:sekali:problem:unauthorized",
            "{}",
            reply.body
        );
        assert!(
            !reply.body.contains("ord_1001"),
            "no change is shown: {}",
            reply.body
        );
    }
    for query in [
        "limit=0",
        "limit=1001",
        "limit=abc",
        "limit=-1",
        "limit=1.5",
        "limit=",
        "after=garbage",
        "after=chg_1",
        "after=-5",
        "after=1.5",
        "after=1&limit=0",
    ] {
        let reply = get(&app, &format!("/changes?{query}"), Some(SHOP)).await;
        assert_eq!(
            (reply.status, reply.content_type.as_str()),
            (400, "application/problem+json"),
            "{query}: {}",
            reply.body
        );
        let problem = reply.json();
        assert_eq!(problem["status"], 400, "{query}: {}", reply.body);
        assert_eq!(
            problem["type"], "urn:sekali:problem:invalid-request",
            "{query}"
        );
        assert!(
            problem["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{query}: the detail says what to change: {}",
            reply.body
        );
    }
    // The bounds themselves are taken.
    for limit in [1, 1000] {
        let (changes, _) = page(&app, None, Some(limit)).await;
        assert_eq!(changes.len(), 1);
    }
    // Without any token configured, the feed is off, as the orders API is.
    let off = spawn_app().await;
    assert_eq!(
        off.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    let reply = get(&off, "/changes", Some(SHOP)).await;
    assert_eq!(
        (reply.status, reply.content_type.as_str()),
        (404, "application/problem+json"),
        "{}",
        reply.body
    );
    assert!(!reply.body.contains("ord_1001"), "{}", reply.body);
}

/// An operator's `sekali orders set-status` is a change like any other: in the feed after the
/// cursor that came before it, by `operator`, with no provider event.
#[actix_web::test]
async fn an_operators_change_is_in_the_feed_by_the_operator_with_no_event() {
    let app = spawn_api().await;
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    settled_feed(&app, 1).await;
    let (_, cursor) = page(&app, None, None).await;

    let output = Command::new(sekali_bin())
        .args(["orders", "set-status", "ord_1001", "refunded", "--db"])
        .arg(app.db_arg())
        .args(["--reason", "refunded in cash at the shop", "--by", "ana"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");

    let all = settled_feed(&app, 2).await;
    let (later, next) = page(&app, cursor.as_deref(), None).await;
    assert_eq!(later.len(), 1, "{later:#?}");
    assert_eq!(later[0], all[1]);
    let change = &later[0];
    assert_eq!(change["changed_by"], "operator", "{change}");
    assert!(change["provider_event_id"].is_null(), "{change}");
    assert_eq!(change["type"], "order.refunded");
    assert_eq!(change["previous_status"], "paid");
    assert_eq!(change["sequence"], 2);
    assert_eq!(change["order_id"], "ord_1001");
    assert_eq!(change["provider"], "stripe", "the order's provider");
    check_against_history(&app, "ord_1001", &of_order(&all, "ord_1001")).await;
    assert_eq!(
        page(&app, next.as_deref(), None).await.0,
        Vec::<Value>::new()
    );
}

/// A delivery sent again (or one that says less than is known) changes no order: it adds no
/// change, and the next real change comes right after the cursor.
#[actix_web::test]
async fn a_duplicate_or_stale_delivery_adds_no_change() {
    let app = spawn_api().await;
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "processed"
    );
    let before = settled_feed(&app, 2).await;
    let (_, cursor) = page(&app, None, None).await;

    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "duplicate"
    );
    assert_eq!(
        app.deliver_midtrans("settlement").await.outcome(),
        "duplicate"
    );
    assert_eq!(
        app.deliver_stripe("payment_intent.processing")
            .await
            .outcome(),
        "stale"
    );
    assert_eq!(
        page(&app, cursor.as_deref(), None).await.0,
        Vec::<Value>::new()
    );
    // A real change after them: the only one after the cursor.
    assert_eq!(
        app.deliver_stripe("charge.refunded.partial")
            .await
            .outcome(),
        "processed"
    );
    let after = settled_feed(&app, 3).await;
    assert_eq!(after[..2], before[..]);
    let (later, _) = page(&app, cursor.as_deref(), None).await;
    assert_eq!(later.len(), 1, "{later:#?}");
    assert_eq!(
        (
            text(&later[0], "order_id"),
            text(&later[0], "status"),
            later[0]["sequence"].as_i64()
        ),
        (Some("ord_1001"), Some("partially_refunded"), Some(2))
    );
}
