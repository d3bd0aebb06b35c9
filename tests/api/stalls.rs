//! A stranger cannot stall sekali: a body that never comes or trickles in is cut at its
//! deadline (408), and a flood of such connections is held below the open-file limit, so a
//! signed delivery is still answered: at once while the connections fit, and once the
//! deadline frees one when they do not.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use sekali::config::parse_api_tokens;

use crate::helpers::*;

/// A POST head to `path` that announces a 40-byte body, and `extra` headers.
fn head_announcing_a_body(path: &str, extra: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         {extra}Content-Length: 40\r\n\r\n"
    )
}

/// A connection to `port` that has sent a webhook's head announcing a body, and nothing more,
/// reading with `read_timeout`; and when it sent the head.
fn webhook_without_its_body(port: u16, read_timeout: Duration) -> (TcpStream, Instant) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_nodelay(true).unwrap();
    stream.set_read_timeout(Some(read_timeout)).unwrap();
    let head = head_announcing_a_body("/webhooks/stripe", "Stripe-Signature: t=1,v1=00\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    (stream, Instant::now())
}

/// Fails on the version that gave the body no deadline: the connection stayed open, answered
/// by nothing, for as long as the client liked.
#[actix_web::test]
async fn a_body_that_never_comes_is_cut_with_408_at_the_body_timeout() {
    let app = spawn_app_with(|s| s.body_timeout = Duration::from_secs(1)).await;
    let port = app.port;
    let (answer, took) = actix_web::rt::task::spawn_blocking(move || {
        // Generous beside the 1 s deadline, short beside "never".
        let (mut stream, sent) = webhook_without_its_body(port, Duration::from_secs(8));
        (read_answer(&mut stream, |_| false), sent.elapsed())
    })
    .await
    .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "{answer:?} after {took:?}"
    );
    assert!(
        answer.contains("the request body did not arrive within 1 s"),
        "{answer:?}"
    );
    assert!(
        took < Duration::from_secs(8),
        "the connection was closed: {took:?}"
    );
    assert_eq!(app.row_counts(), (0, 0, 0));
}

/// Fails on the version that read a body trickled a byte every 4 s for as long as it took (48 s
/// for this one's 12 bytes at that pace; here 300 ms a byte).
#[actix_web::test]
async fn a_trickled_body_is_cut_at_the_deadline_not_read_to_its_end() {
    let app = spawn_app_with(|s| s.body_timeout = Duration::from_secs(1)).await;
    let port = app.port;
    let (answer, took) = actix_web::rt::task::spawn_blocking(move || {
        let (mut stream, started) = webhook_without_its_body(port, Duration::from_millis(300));
        let mut answer = String::new();
        // 40 bytes at 300 ms each would take 12 s; the answer must come long before.
        for _ in 0..40 {
            if stream.write_all(b" ").is_err() {
                break;
            }
            let mut buf = [0u8; 4096];
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => answer.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(_) => {}
            }
            if answer.contains("\r\n\r\n") {
                break;
            }
        }
        (answer, started.elapsed())
    })
    .await
    .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "{answer:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert_eq!(app.row_counts(), (0, 0, 0));
}

/// The orders API's bodies have the same deadline, answered as a problem.
#[actix_web::test]
async fn an_orders_api_body_that_never_comes_gets_a_408_problem() {
    let app = spawn_app_with(|s| {
        s.body_timeout = Duration::from_secs(1);
        s.api_tokens = parse_api_tokens("shop:tok-stall").unwrap();
    })
    .await;
    let port = app.port;
    let answer = actix_web::rt::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(8)))
            .unwrap();
        let head = head_announcing_a_body(
            "/orders",
            "Authorization: Bearer tok-stall\r\nIdempotency-Key: k-stall\r\n",
        );
        stream.write_all(head.as_bytes()).unwrap();
        read_answer(&mut stream, |_| false)
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("application/problem+json"), "{answer:?}");
    assert!(
        answer.contains("urn:sekali:problem:request-timeout"),
        "{answer:?}"
    );
    assert_eq!(app.count("SELECT count(*) FROM idempotency_keys"), 0);
}

/// Opens `count` connections to `port` that each send a webhook's head announcing a body and
/// nothing more: the stalled connections of a flood. Those the server has not accepted yet wait
/// in its listen backlog, as the kernel has already completed them.
fn stalled_connections(port: u16, count: usize) -> Vec<TcpStream> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let head = head_announcing_a_body("/webhooks/stripe", "Stripe-Signature: t=1,v1=00\r\n");
    (0..count)
        .filter_map(|_| {
            let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
            stream.write_all(head.as_bytes()).ok()?;
            Some(stream)
        })
        .collect()
}

/// A signed Stripe delivery sent with ureq, waiting at most `within`: its status and how long it
/// took.
fn deliver_signed(port: u16, within: Duration) -> (Result<u16, String>, Duration) {
    let body = fixture("stripe/payment_intent.succeeded.json");
    let header = stripe_header(&body, sekali::clock::SystemClock.now_unix());
    let agent = ureq::AgentBuilder::new().timeout(within).build();
    let started = Instant::now();
    let status = agent
        .post(&format!("http://127.0.0.1:{port}/webhooks/stripe"))
        .set("Stripe-Signature", &header)
        .set("Content-Type", "application/json")
        .send_bytes(&body)
        .map(|r| r.status())
        .map_err(|e| e.to_string());
    (status, started.elapsed())
}

/// The connections `serve`'s listening line says it takes.
fn max_connections(logs: &str) -> usize {
    logs.lines()
        .find(|l| l.contains("sekali is listening"))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix("max_connections="))
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no max_connections in the listening line: {logs}"))
}

/// More stalled connections than the open-file limit allows (512 files, 600 connections): the
/// server holds what fits, the rest wait in the backlog, and the deadline frees connections in
/// turn until the signed delivery, queued behind them all, is answered. The log says once what
/// is happening. Fails on the version without a limit or a body deadline: it accepted
/// connections until the open files ran out, logged `Too many open files` every 500 ms, and
/// answered the delivery never.
#[test]
fn past_the_open_file_limit_a_signed_delivery_is_answered_once_the_deadline_frees_a_connection() {
    let server = ServeProcess::start_with_open_files(
        512,
        PROVIDER_ENV,
        "info",
        &["--body-timeout", "1s", "--workers", "2"],
    );
    let stalled = stalled_connections(server.port, 600);
    assert!(stalled.len() > 500, "{} connections opened", stalled.len());
    let (status, took) = deliver_signed(server.port, Duration::from_secs(40));
    drop(stalled);
    let (_, logs) = server.stop();
    assert_eq!(status, Ok(200), "after {took:?}: {logs}");
    let limit = max_connections(&logs);
    assert!((16..512).contains(&limit), "{limit}: {logs}");
    assert_eq!(
        logs.matches("connection limit reached").count(),
        1,
        "said once: {logs}"
    );
    assert!(!logs.contains("Too many open files"), "{logs}");
}

/// Thousands of stalled connections within the limit hold up nothing: a signed delivery is
/// answered at once (the bound here is loose, for a shared machine; the run prints what it
/// took).
#[test]
fn with_thousands_of_stalled_connections_held_a_signed_delivery_is_answered_at_once() {
    let server = ServeProcess::start_with(PROVIDER_ENV, "info", &["--workers", "2"]);
    // What this machine's limit allows (the listening line says), with room to spare.
    let limit = {
        let probe = deliver_signed(server.port, Duration::from_secs(10));
        assert_eq!(probe.0, Ok(200));
        server.logs_so_far()
    };
    let count = (max_connections(&limit) * 3 / 4).min(3_000);
    let stalled = stalled_connections(server.port, count);
    assert!(
        stalled.len() >= count * 9 / 10,
        "{} of {count}",
        stalled.len()
    );
    let (status, took) = deliver_signed(server.port, Duration::from_secs(20));
    println!(
        "answered in {took:?} beside {} stalled connections",
        stalled.len()
    );
    drop(stalled);
    let (_, logs) = server.stop();
    assert_eq!(status, Ok(200), "{logs}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(!logs.contains("connection limit reached"), "{logs}");
}
