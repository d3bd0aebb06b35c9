use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::helpers::*;

/// Sends a raw HTTP/1.1 request with `body_bytes` of body, chunked or with a length, then reads
/// whatever the server answers. Sending stops quietly if the server closes first.
fn raw_post(port: u16, body_bytes: usize, chunked: bool) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_owned()
    } else {
        format!("Content-Length: {body_bytes}")
    };
    let head = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nStripe-Signature: t=1,v1=00\r\n{framing}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0;
    while sent < body_bytes {
        let result = if chunked {
            stream
                .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .and_then(|_| stream.write_all(&chunk))
                .and_then(|_| stream.write_all(b"\r\n"))
        } else {
            stream.write_all(&chunk)
        };
        if result.is_err() {
            break;
        }
        sent += chunk.len();
    }
    if chunked {
        let _ = stream.write_all(b"0\r\n\r\n");
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Read until the connection closes or the response is complete.
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
        if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
            break;
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[actix_web::test]
async fn an_oversized_body_gets_a_readable_413_and_stores_nothing() {
    let app = spawn_app().await;
    let port = app.port;
    for chunked in [false, true] {
        let answer =
            actix_web::rt::task::spawn_blocking(move || raw_post(port, 2 * 1024 * 1024, chunked))
                .await
                .unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "chunked={chunked}: {answer}"
        );
        assert!(
            answer.contains(r#"{"error":"request body exceeds the limit of 1048576 bytes"}"#),
            "{answer}"
        );
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
    }
    assert_eq!(app.row_counts(), (0, 0, 0));
}

#[actix_web::test]
async fn the_body_limit_is_checked_before_the_signature() {
    let app = spawn_app_with(|s| s.max_body_bytes = 1000).await;
    let mut body = fixture("stripe/payment_intent.succeeded.json");
    assert!(body.len() > 1000);
    // Properly signed, but too large: 413, not a signature verdict.
    let answer = app.deliver_stripe_body(&body).await;
    assert_eq!(answer.status, 413);
    body.truncate(900);
    let answer = app.post_stripe(&body, Some("t=1,v1=00")).await;
    assert_eq!(
        answer.status, 401,
        "under the limit the signature is checked"
    );
}

#[actix_web::test]
async fn a_full_write_queue_answers_503_with_retry_after() {
    // A queue of one, and a writer held up by another process's lock: the second concurrent
    // delivery finds the queue full. The lock is SQLite's write lock, which the writer waits
    // for at most busy_timeout (a SQLite setting) before every delivery gets its 503.
    if sqlite_only("SQLite's write lock held by another connection, and busy_timeout") {
        return;
    }
    let app = spawn_app_with(|s| {
        s.queue_capacity = 1;
        s.batch_max = 1;
        s.busy_timeout = Duration::from_millis(1500);
    })
    .await;
    let locker = rusqlite::Connection::open(app.database.file()).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let template = String::from_utf8(fixture("stripe/payment_intent.succeeded.json")).unwrap();
    let bodies: Vec<Vec<u8>> = (0..6)
        .map(|i| {
            template
                .replace("evt_1QA0002succeeded000001", &format!("evt_queue_{i}"))
                .into_bytes()
        })
        .collect();
    let requests = bodies.iter().map(|body| {
        let header = stripe_header(body, app.clock.now_unix());
        let request = app
            .client
            .post(format!("{}/webhooks/stripe", app.address))
            .insert_header(("Stripe-Signature", header));
        async move { request.send_body(body.clone()).await.unwrap() }
    });
    let mut responses = futures_util::future::join_all(requests).await;
    locker.execute_batch("ROLLBACK").unwrap();
    let mut overloaded = 0;
    for response in &mut responses {
        assert_eq!(
            response.status().as_u16(),
            503,
            "nothing acknowledged while the lock was held"
        );
        assert!(response.headers().contains_key("retry-after"));
        let body = response.body().await.unwrap();
        overloaded += usize::from(
            body.as_ref() == br#"{"error":"too many deliveries in flight; retry later"}"#,
        );
    }
    assert!(overloaded >= 1, "some deliveries found the queue full");
    assert_eq!(app.count("SELECT count(*) FROM processed_events"), 0);
}

/// Runs `sekali bench` (Stripe, signed with the server's secret) with `args` against a
/// `sekali serve` whose write queue holds `capacity` deliveries, logging at `rust_log`.
/// Returns the bench's report (its first stdout line), its whole output and the server's logs.
fn bench_a_small_queue(
    capacity: &str,
    rust_log: &str,
    args: &[&str],
    check_db: bool,
) -> (serde_json::Value, std::process::Output, String) {
    let server = ServeProcess::start_with(
        &[("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)],
        rust_log,
        &["--no-relay", "--queue-capacity", capacity],
    );
    let mut bench = std::process::Command::new(sekali_bin());
    bench
        .args(["bench", "--url"])
        .arg(format!("{}/webhooks/stripe", server.base_url()))
        .args(args)
        .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET);
    if check_db {
        bench.arg("--check-db").arg(server.db().arg());
    }
    let output = bench.output().unwrap();
    let (_, logs) = server.stop();
    let first = output.stdout.split(|b| *b == b'\n').next().unwrap();
    (serde_json::from_slice(first).unwrap(), output, logs)
}

#[test]
fn an_overloaded_server_logs_the_full_queue_once_a_second_with_a_count_not_once_a_refusal() {
    // One delivery may wait for the writer; 64 connections send 3,000: most find it full.
    let (report, _, logs) = bench_a_small_queue(
        "1",
        "info",
        &[
            "--events",
            "3000",
            "--dup-ratio",
            "0",
            "--concurrency",
            "64",
        ],
        false,
    );
    let refused = report["non_2xx"]["503"].as_u64().unwrap_or(0);
    let seconds = report["seconds"].as_f64().unwrap();
    assert!(refused >= 10, "the queue was full often: {report}");
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("write queue full"))
        .collect();
    assert!(!lines.is_empty(), "{logs}");
    assert!(
        lines.len() as f64 <= seconds.ceil() + 2.0,
        "{} lines for {refused} refusals in {seconds:.1} s",
        lines.len()
    );
    // Each line counts the refusals since the one before, and the last ones are logged when
    // the server stops: together, every refusal once.
    let counted: u64 = lines
        .iter()
        .map(|l| {
            let at = l.find("refused=").expect("a count") + "refused=".len();
            l[at..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(counted, refused, "{lines:?}");
}

#[test]
fn bench_retry_shows_nothing_refused_under_overload_is_lost() {
    // Four deliveries may wait for the writer; 32 connections find the queue full again and
    // again. With --retry the bench sends each refused delivery again after its Retry-After,
    // as Stripe would, and --check-db then finds every event once, with its effect.
    let (report, output, _) = bench_a_small_queue(
        "4",
        "warn",
        &[
            "--events",
            "300",
            "--dup-ratio",
            "0.2",
            "--concurrency",
            "32",
            "--retry",
        ],
        true,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(report["sent"], 360, "{stdout}");
    assert_eq!(report["ok_2xx"], 360, "every delivery ended 2xx: {stdout}");
    assert!(
        report["retried"].as_u64().unwrap() >= 1,
        "the queue was full at least once: {stdout}"
    );
    assert_eq!(report["check_db"], "ok", "{stdout}");
    assert!(stdout.contains("retried "), "{stdout}");
}
