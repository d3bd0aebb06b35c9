//! `sekali replay` as a first-time user meets it (issue 30): the real binary against a real
//! `sekali serve`, for each provider. Fields set before signing (`--set`), the hints after a
//! 503 "not confirmed" and after a refused connection, and the fixtures' README, whose table of
//! outcomes is replayed in its own order.

use std::io::Read;
use std::process::{Command, Output};

use serde_json::Value;

use crate::helpers::*;

/// The callback verification token the Xendit deliveries carry.
const XENDIT_TOKEN: &str = "cb-token-sekali-replay-test-3c9d1e";

/// Each provider's secret, as both the server and `replay` read it.
fn secret_of(provider: &str) -> (&'static str, &'static str) {
    match provider {
        "stripe" => ("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET),
        "midtrans" => ("MIDTRANS_SERVER_KEY", MIDTRANS_KEY),
        "xendit" => ("XENDIT_CALLBACK_TOKEN", XENDIT_TOKEN),
        other => panic!("no provider {other}"),
    }
}

/// `sekali serve` with all three providers, the Midtrans status check off (as ServeProcess
/// sets it), and no relay: these tests look at orders, not emails.
fn serve_all_providers() -> ServeProcess {
    ServeProcess::start_with(
        &[
            secret_of("stripe"),
            secret_of("midtrans"),
            secret_of("xendit"),
        ],
        "warn",
        &["--no-relay"],
    )
}

fn fixture_path(name: &str) -> String {
    format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `sekali replay` of `files` to `base_url`'s `provider` route, signing with its secret, with
/// `extra` arguments (`--set …`) before the files.
fn replay_command(base_url: &str, provider: &str, extra: &[&str], files: &[&str]) -> Command {
    let (variable, secret) = secret_of(provider);
    let mut command = Command::new(sekali_bin());
    command
        .args([
            "replay",
            "--url",
            &format!("{base_url}/webhooks/{provider}"),
        ])
        .args(extra)
        .args(files.iter().map(|f| fixture_path(f)))
        .env_remove("STRIPE_WEBHOOK_SECRET")
        .env_remove("MIDTRANS_SERVER_KEY")
        .env_remove("XENDIT_CALLBACK_TOKEN")
        .env(variable, secret);
    command
}

fn replay(server: &ServeProcess, provider: &str, extra: &[&str], files: &[&str]) -> Output {
    replay_command(&server.base_url(), provider, extra, files)
        .output()
        .unwrap()
}

/// Runs `command` with its stdout and stderr into one pipe, as a terminal shows them: the
/// exit status and everything written, in the order it was written.
fn run_interleaved(mut command: Command) -> (std::process::ExitStatus, String) {
    let (mut reader, writer) = std::io::pipe().unwrap();
    command.stdout(writer.try_clone().unwrap()).stderr(writer);
    let mut child = command.spawn().unwrap();
    // The command holds the pipe's writing ends: gone, the read ends when the child exits.
    drop(command);
    let mut text = String::new();
    reader.read_to_string(&mut text).unwrap();
    (child.wait().unwrap(), text)
}

/// The JSON body of the answer `replay` printed for its `index`th file (`FILE: STATUS BODY`).
fn answer(output: &Output, index: usize) -> (u16, Value) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .nth(index)
        .unwrap_or_else(|| panic!("no line {index}: {output:?}"));
    let (_, rest) = line.rsplit_once(".json: ").expect("FILE: STATUS BODY");
    let (status, body) = rest.split_once(' ').expect("STATUS BODY");
    (
        status.parse().unwrap(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// An order's status and amount, if it exists.
fn order(server: &ServeProcess, order_id: &str) -> Option<(String, Option<i64>)> {
    let rows = server.db().query(&format!(
        "SELECT status, amount FROM orders WHERE order_id = {}",
        sql_text(order_id)
    ));
    let row = rows.into_iter().next()?;
    Some((
        row[0].clone().unwrap(),
        row[1].as_deref().map(|a| a.parse().unwrap()),
    ))
}

fn stored_payload(server: &ServeProcess, event_id: &str) -> Value {
    let payload = server.db().texts(&format!(
        "SELECT payload FROM processed_events WHERE event_id = {}",
        sql_text(event_id)
    ));
    let [payload] = &payload[..] else {
        panic!("{event_id}: {payload:?}")
    };
    serde_json::from_str(payload).unwrap()
}

// --- --set ------------------------------------------------------------------------------------

/// Fails on the version without `--set` (clap refuses the argument): a fixture could only pay
/// the order written in it, `ord_1001`.
#[test]
fn replay_set_gives_a_stripe_event_the_shops_order_id_and_signs_the_changed_body() {
    let server = serve_all_providers();
    let output = replay(
        &server,
        "stripe",
        &["--set", "data.object.metadata.order_id=ord_42"],
        &["stripe/payment_intent.succeeded.json"],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(answer(&output, 0).1["status"], "processed", "{output:?}");
    assert_eq!(order(&server, "ord_42"), Some(("paid".into(), Some(2500))));
    assert_eq!(order(&server, "ord_1001"), None);
    // The body sent, and verified, is the file with that one field changed, in its own layout.
    let sent = stored_payload(&server, "evt_1QA0002succeeded000001");
    let mut expected: Value =
        serde_json::from_slice(&fixture("stripe/payment_intent.succeeded.json")).unwrap();
    expected["data"]["object"]["metadata"]["order_id"] = "ord_42".into();
    assert_eq!(sent, expected);
}

/// Midtrans signs `order_id + status_code + gross_amount`: the signature must be computed over
/// the values set, or the server refuses it (401). `gross_amount` exists as a string, so
/// `99000.00` stays the string Midtrans sends, which is what the signature covers.
#[test]
fn replay_set_changes_a_midtrans_order_and_amount_and_the_signature_covers_the_new_values() {
    let server = serve_all_providers();
    let output = replay(
        &server,
        "midtrans",
        &[
            "--set",
            "order_id=ORDER-9",
            "--set",
            "gross_amount=99000.00",
        ],
        &["midtrans/settlement.json"],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        answer(&output, 0),
        (
            200,
            serde_json::json!({"event_id": "ORDER-9:settlement:200:accept", "status": "processed"})
        )
    );
    assert_eq!(
        order(&server, "ORDER-9"),
        Some(("paid".into(), Some(9_900_000)))
    );
    assert_eq!(order(&server, "ORDER-2001"), None);
    let sent = stored_payload(&server, "ORDER-9:settlement:200:accept");
    assert_eq!(sent["gross_amount"], "99000.00");
}

/// A Xendit callback's order is its `external_id`; its amounts are JSON numbers, and stay so.
#[test]
fn replay_set_gives_a_xendit_callback_another_order_and_amount() {
    let server = serve_all_providers();
    let output = replay(
        &server,
        "xendit",
        &[
            "--set",
            "external_id=ord_x_42",
            "--set",
            "amount=99000",
            "--set",
            "paid_amount=99000",
        ],
        &["xendit/invoice.paid.json"],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(answer(&output, 0).1["status"], "processed", "{output:?}");
    assert_eq!(
        order(&server, "ord_x_42"),
        Some(("paid".into(), Some(9_900_000)))
    );
    assert_eq!(order(&server, "ord_x_1001"), None);
}

/// Each refusal names the path and why; nothing is sent, not even the files before the one
/// that could not be changed.
#[test]
fn replay_set_that_cannot_be_applied_sends_nothing_and_says_why() {
    let server = serve_all_providers();
    for (set, reason) in [
        (
            "data.object.id.suffix=x",
            "data.object.id is a string: there is no `suffix` inside it to set",
        ),
        (
            "data.object.metadata.0=x",
            "data.object.metadata is an object, not an array: the index `0` cannot be taken in it",
        ),
        (
            "data.object.amount=lots",
            "data.object.amount is a number, and `lots` is not one",
        ),
        (
            "data.object.payment_method_types.3=card",
            "data.object.payment_method_types has 2 elements: the index 3 is past its end",
        ),
    ] {
        let output = replay(
            &server,
            "stripe",
            &["--set", set],
            &[
                "stripe/payment_intent.processing.json",
                "stripe/payment_intent.succeeded.json",
            ],
        );
        assert!(!output.status.success(), "{set}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("cannot set a field of") && stderr.contains(reason),
            "{set}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{set}: {output:?}");
    }
    let events = server.db().count("SELECT count(*) FROM processed_events");
    assert_eq!(events, 0);

    let output = replay(&server, "stripe", &["--set", "order_id"], &[]);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("expected PATH=VALUE"),
        "{output:?}"
    );
}

// --- hints ------------------------------------------------------------------------------------

/// Fails on the version that printed only the 503 line: a first-time user replaying a Midtrans
/// fixture at a server with the status check on (the default) was told "retry later", which
/// never helps, since the fixture's transaction is not in Midtrans.
#[test]
fn replay_explains_a_midtrans_503_not_confirmed_after_the_files_line() {
    // The check on, against a status API nobody answers.
    let api = format!("http://127.0.0.1:{}", free_port());
    let server = ServeProcess::start_with(
        &[
            secret_of("midtrans"),
            ("SEKALI_MIDTRANS_STATUS_CHECK", "on"),
            ("MIDTRANS_API_URL", &api),
        ],
        "warn",
        &["--no-relay"],
    );
    let (status, text) = run_interleaved(replay_command(
        &server.base_url(),
        "midtrans",
        &[],
        &["midtrans/settlement.json", "midtrans/pending.json"],
    ));
    assert!(!status.success(), "the exit status stays failure: {text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "two files' lines and one hint: {text}");
    assert!(
        lines[0].ends_with(&format!(
            "settlement.json: 503 {{\"error\":\"{}\"}}",
            sekali::routes::NOT_CONFIRMED
        )),
        "{text}"
    );
    let hint = lines[1];
    for words in [
        "hint: the server's Midtrans status check could not confirm",
        "cannot reach Midtrans",
        "not in Midtrans at all",
        "`sekali serve --midtrans-status-check off`",
        "SEKALI_MIDTRANS_STATUS_CHECK=off",
        "Keep it on in production: the signature does not cover the transaction status",
    ] {
        assert!(hint.contains(words), "{words:?} missing from: {text}");
    }
    // Once a run: the second file's 503 is not explained again.
    assert!(lines[2].contains("pending.json: 503"), "{text}");
}

/// Fails on the version that printed only `request failed: Failed to connect to host:
/// Connection refused`, without saying that no server was running there.
#[test]
fn replay_to_a_port_nobody_listens_on_says_to_start_sekali_serve_or_check_the_url() {
    let base_url = format!("http://127.0.0.1:{}", free_port());
    let (status, text) = run_interleaved(replay_command(
        &base_url,
        "stripe",
        &[],
        &[
            "stripe/payment_intent.succeeded.json",
            "stripe/customer.created.json",
        ],
    ));
    assert!(!status.success(), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].contains("payment_intent.succeeded.json: request failed")
            && lines[0].contains("Connection refused"),
        "{text}"
    );
    assert_eq!(
        lines[1],
        format!(
            "hint: the connection to {base_url}/webhooks/stripe was refused: no server listens \
             there. Start one with `sekali serve` (with the same secret set as here), or check \
             --url"
        )
    );
    assert!(
        lines[2].contains("customer.created.json: request failed"),
        "{text}"
    );
}

// --- the fixtures' README ---------------------------------------------------------------------

/// One row of the table "Files and expected outcome", or of the table "Ledger fixtures", in
/// `fixtures/README.md`.
#[derive(Debug)]
struct Row {
    file: String,
    provider: String,
    /// The order it names, `None` for "none".
    order_id: Option<String>,
    /// The last column: an order status (`paid`), or an outcome (`ignored`), then any words.
    expected: String,
}

impl Row {
    /// A row from its cells: the file, the provider and the order id at those places (the file
    /// and order id in backquotes, or "none"), the expected outcome last.
    fn from_cells(line: &str, cells: &[&str], file: usize, provider: usize, order: usize) -> Row {
        let backquoted = |cell: &str| cell.split('`').nth(1).map(str::to_owned);
        Row {
            file: backquoted(cells[file]).unwrap_or_else(|| panic!("a file in backquotes: {line}")),
            provider: cells[provider].to_lowercase(),
            order_id: if cells[order].starts_with("none") {
                None
            } else {
                Some(backquoted(cells[order]).expect("an order id in backquotes"))
            },
            expected: cells.last().unwrap().to_string(),
        }
    }
}

fn readme_rows(starts: impl Fn(&str) -> bool, columns: usize) -> Vec<(String, Vec<String>)> {
    let readme = std::fs::read_to_string(fixture_path("README.md")).unwrap();
    readme
        .lines()
        .filter(|line| starts(line))
        .map(|line| {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect();
            assert_eq!(cells.len(), columns, "{line}");
            (line.to_owned(), cells)
        })
        .collect()
}

/// The first table's rows, in the README's order. Its format: `| \`file\` | Provider | type |
/// order id (how found) | expected outcome |`, the order id and file in backquotes.
fn fixture_table() -> Vec<Row> {
    readme_rows(|line| line.starts_with("| `"), 5)
        .iter()
        .map(|(line, cells)| {
            let cells: Vec<&str> = cells.iter().map(String::as_str).collect();
            Row::from_cells(line, &cells, 0, 1, 3)
        })
        .collect()
}

/// The ledger table's rows, in the README's order: `| scenario | \`file\` | Provider | type |
/// order id (how found) | what it shows | expected outcome |`.
fn ledger_table() -> Vec<Row> {
    let numbered = |line: &str| {
        line.strip_prefix("| ")
            .and_then(|rest| rest.split(' ').next())
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    readme_rows(numbered, 7)
        .iter()
        .map(|(line, cells)| {
            let cells: Vec<&str> = cells.iter().map(String::as_str).collect();
            Row::from_cells(line, &cells, 1, 2, 4)
        })
        .collect()
}

/// Sends each row's file through `sekali replay` to `server`, in their order, and says where
/// the order or the delivery is not what the row's last column says: the order's status where
/// it names one, else the delivery's outcome (`ignored`, `parked`), and the outcome it names in
/// parentheses (``(outcome `reversed`)``) too.
fn replay_rows(server: &ServeProcess, rows: &[Row]) -> Vec<String> {
    let mut wrong = Vec::new();
    for row in rows {
        let output = replay(server, &row.provider, &[], &[&row.file]);
        let (status, body) = answer(&output, 0);
        assert_eq!(status, 200, "{}: {output:?}", row.file);
        let outcome = body["status"].as_str().unwrap_or_default().to_owned();
        let first_word: String = row
            .expected
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let found = match first_word.parse::<sekali::domain::OrderStatus>() {
            Ok(_) => {
                let order_id = row.order_id.as_deref().expect("a status needs an order");
                order(server, order_id).map_or_else(|| "no order".to_owned(), |(s, _)| s)
            }
            Err(_) => outcome.clone(),
        };
        if found != first_word {
            wrong.push(format!(
                "{}: the table says {}, found {found} (outcome {outcome})",
                row.file, row.expected
            ));
        }
        if let Some((_, rest)) = row.expected.split_once("(outcome `") {
            let named = rest.split('`').next().unwrap();
            if named != outcome {
                wrong.push(format!(
                    "{}: the table names the outcome {named}, the delivery's was {outcome}",
                    row.file
                ));
            }
        }
    }
    wrong
}

/// The README's table is what a first-time user replays, top to bottom. Each file goes through
/// `sekali replay` to one server (status check off, as the README says to for local tests), and
/// after each the order it names must have the status the last column names; where that column
/// names an outcome instead (`ignored`), the delivery's outcome must be it, and where it names
/// one in parentheses (``(outcome `reversed`)``), that too. Then the ledger's scenarios, on the
/// same server, as their table says (some continue orders of the first table).
#[test]
fn every_fixture_in_the_readme_tables_ends_where_the_table_says_when_replayed_in_its_order() {
    let rows = fixture_table();
    assert!(rows.len() >= 37, "the table was read: {rows:?}");
    let ledger = ledger_table();
    assert!(ledger.len() >= 40, "the ledger table was read: {ledger:?}");
    let server = serve_all_providers();
    let mut wrong = replay_rows(&server, &rows);
    wrong.extend(replay_rows(&server, &ledger));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The README says what a first-time Midtrans replay needs: the status check off.
#[test]
fn the_fixtures_readme_says_to_turn_the_midtrans_status_check_off_for_local_replays() {
    let readme = std::fs::read_to_string(fixture_path("README.md")).unwrap();
    for words in [
        "--midtrans-status-check off",
        "SEKALI_MIDTRANS_STATUS_CHECK=off",
        "not confirmed with the provider yet",
    ] {
        assert!(
            readme.contains(words),
            "{words:?} missing from fixtures/README.md"
        );
    }
}
