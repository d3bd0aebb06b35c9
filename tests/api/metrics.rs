//! `GET /metrics`: every series there from startup at 0, counted as deliveries and API
//! requests are answered, the outboxes' backlog read at the scrape, and no label that carries
//! an order, an event or an address.

use crate::helpers::*;

const TOKEN: &str = "tok-metrics-5b1e";

async fn scrape(app: &TestApp) -> (String, String) {
    let mut response = app
        .client
        .get(format!("{}/metrics", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = response.body().await.unwrap();
    (content_type, String::from_utf8(body.to_vec()).unwrap())
}

/// The value of the series `series` (name and labels as printed), or None when it is missing.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn spawn() -> TestApp {
    spawn_app_with(|s| {
        s.api_tokens = sekali::config::parse_api_tokens(&format!("shop:{TOKEN}")).unwrap()
    })
    .await
}

#[actix_web::test]
async fn every_series_is_there_from_startup_at_zero_in_the_prometheus_text_format() {
    let app = spawn().await;
    let (content_type, text) = scrape(&app).await;
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    for series in [
        r#"sekali_deliveries_total{provider="stripe",outcome="processed"}"#,
        r#"sekali_deliveries_total{provider="midtrans",outcome="duplicate"}"#,
        r#"sekali_deliveries_total{provider="stripe",outcome="needs_review"}"#,
        r#"sekali_webhook_responses_total{provider="stripe",code="503"}"#,
        r#"sekali_refusals_total{provider="stripe",reason="unauthorized"}"#,
        r#"sekali_refusals_total{provider="midtrans",reason="not_confirmed"}"#,
        r#"sekali_refusals_total{provider="stripe",reason="overloaded"}"#,
        r#"sekali_delivery_duration_seconds_count{provider="stripe"}"#,
        r#"sekali_orders_api_requests_total{result="created"}"#,
        r#"sekali_orders_api_requests_total{result="conflict"}"#,
        r#"sekali_orders_api_requests_total{result="unauthorized"}"#,
        r#"sekali_outbox_pending{outbox="email"}"#,
        r#"sekali_outbox_dead{outbox="forward"}"#,
        r#"sekali_outbox_oldest_due_age_seconds{outbox="email"}"#,
        "sekali_writer_deliveries_total",
        "sekali_writer_deliveries_together_total",
        r#"sekali_relay_attempts_total{transport="forward",result="dead"}"#,
        r#"sekali_relay_attempts_total{transport="smtp",result="unavailable"}"#,
        "sekali_purge_runs_total",
        r#"sekali_purge_deleted_rows_total{table="processed_events"}"#,
        "sekali_writer_commit_duration_seconds_count",
        "sekali_writer_queue_depth",
    ] {
        assert_eq!(value(&text, series), Some(0.0), "{series} at 0 in:\n{text}");
    }
    assert_eq!(
        value(
            &text,
            &format!(
                r#"sekali_build_info{{version="{}"}}"#,
                env!("CARGO_PKG_VERSION")
            )
        ),
        Some(1.0)
    );
    // Prometheus's naming rules: one prefix (but for the process's standard metrics, named as
    // every client library names them), counters end in _total, base units.
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut parts = line.split(' ').skip(2);
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        assert!(
            name.starts_with("sekali_") || name.starts_with("process_"),
            "{line}"
        );
        if kind == "counter" {
            assert!(name.ends_with("_total"), "{line}");
        }
        assert!(!name.contains("millis"), "{line}");
    }
    app.stop().await;
}

/// The process's own metrics, under the names every Prometheus client library gives them, so
/// the usual dashboards and alerts (CPU, memory, file descriptors near their limit) work.
#[cfg(target_os = "linux")]
#[actix_web::test]
async fn the_process_reports_its_cpu_memory_threads_and_file_descriptors_under_the_standard_names()
{
    let app = spawn().await;
    let (_, before) = scrape(&app).await;
    for _ in 0..20 {
        app.deliver_stripe("payment_intent.succeeded").await;
    }
    let (_, after) = scrape(&app).await;
    let get = |text: &str, name: &str| {
        value(text, name).unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    };
    let cpu = get(&after, "process_cpu_seconds_total");
    assert!(
        cpu > 0.0 && cpu >= get(&before, "process_cpu_seconds_total"),
        "{cpu}"
    );
    assert!(
        after.contains("# TYPE process_cpu_seconds_total counter"),
        "{after}"
    );
    assert!(get(&after, "process_resident_memory_bytes") > 1_000_000.0);
    assert!(
        get(&after, "process_virtual_memory_bytes") >= get(&after, "process_resident_memory_bytes")
    );
    let (open, max) = (
        get(&after, "process_open_fds"),
        get(&after, "process_max_fds"),
    );
    assert!(open >= 3.0 && open <= max, "{open} of {max}");
    assert!(get(&after, "process_threads") >= 2.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = get(&after, "process_start_time_seconds");
    assert!(
        started <= now + 1.0 && started > now - 86_400.0,
        "{started} against {now}"
    );
    app.stop().await;
}

#[actix_web::test]
async fn deliveries_refusals_and_order_requests_are_counted_as_answered_and_no_id_is_a_label() {
    let app = spawn().await;
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "processed"
    );
    assert_eq!(
        app.deliver_stripe("payment_intent.succeeded")
            .await
            .outcome(),
        "duplicate"
    );
    let forged = app
        .post_stripe(
            &fixture("stripe/payment_intent.succeeded.json"),
            Some("t=1,v1=00"),
        )
        .await;
    assert_eq!(forged.status, 401, "a stale, wrong signature");
    let order =
        r#"{"order_id":"ord_metrics_9","amount":2500,"currency":"usd","provider":"stripe"}"#;
    for _ in 0..2 {
        let response = app
            .client
            .post(format!("{}/orders", app.address))
            .insert_header(("Authorization", format!("Bearer {TOKEN}")))
            .insert_header(("Idempotency-Key", "metrics-key-1"))
            .insert_header(("Content-Type", "application/json"))
            .send_body(order)
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 201);
    }
    // Refused at the door: a token that is no client's, then a client without a key.
    let refused = |token: &'static str, key: Option<&'static str>| {
        let mut request = app
            .client
            .post(format!("{}/orders", app.address))
            .insert_header(("Authorization", format!("Bearer {token}")))
            .insert_header(("Content-Type", "application/json"));
        if let Some(key) = key {
            request = request.insert_header(("Idempotency-Key", key));
        }
        request.send_body(order)
    };
    assert_eq!(
        refused("not-a-token", Some("metrics-key-2"))
            .await
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    assert_eq!(refused(TOKEN, None).await.unwrap().status().as_u16(), 400);
    let (_, text) = scrape(&app).await;
    let at = |series: &str| value(&text, series).unwrap_or_else(|| panic!("{series} in:\n{text}"));
    assert_eq!(
        at(r#"sekali_deliveries_total{provider="stripe",outcome="processed"}"#),
        1.0
    );
    assert_eq!(
        at(r#"sekali_deliveries_total{provider="stripe",outcome="duplicate"}"#),
        1.0
    );
    assert_eq!(
        at(r#"sekali_webhook_responses_total{provider="stripe",code="200"}"#),
        2.0
    );
    assert_eq!(
        at(r#"sekali_refusals_total{provider="stripe",reason="unauthorized"}"#),
        1.0
    );
    assert_eq!(
        at(r#"sekali_webhook_responses_total{provider="stripe",code="401"}"#),
        1.0
    );
    assert_eq!(
        at(r#"sekali_delivery_duration_seconds_count{provider="stripe"}"#),
        3.0
    );
    assert_eq!(
        at(r#"sekali_orders_api_requests_total{result="created"}"#),
        1.0
    );
    assert_eq!(
        at(r#"sekali_orders_api_requests_total{result="replayed"}"#),
        1.0
    );
    assert_eq!(
        at(r#"sekali_orders_api_requests_total{result="unauthorized"}"#),
        1.0
    );
    assert_eq!(
        at(r#"sekali_orders_api_requests_total{result="invalid"}"#),
        1.0
    );
    assert_eq!(at("sekali_writer_deliveries_total"), 2.0);
    // The paid order's receipt waits (this server runs no relay): the backlog says so.
    assert_eq!(at(r#"sekali_outbox_pending{outbox="email"}"#), 1.0);
    // Nothing that identifies an order, an event or a customer is a label.
    for id in [
        "ord_1001",
        "ord_metrics_9",
        "evt_",
        "pi_3QA0001Order1001",
        "@example.com",
        "metrics-key-1",
    ] {
        assert!(!text.contains(id), "{id} appears in:\n{text}");
    }
    app.stop().await;
}

/// The alert rules in docs/prometheus-alerts.yml are valid, and fire (and stay quiet) on the
/// series their test file gives them: `promtool` from Prometheus's Debian package. Without it
/// the test says so and passes, unless SEKALI_REQUIRE_PROMTOOL=1 (as .ci/test sets).
#[test]
fn the_documented_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let run = |args: &[&str]| {
        std::process::Command::new("promtool")
            .args(args)
            .current_dir(&docs)
            .output()
    };
    match run(&["--version"]) {
        Ok(_) => {}
        Err(e) if std::env::var_os("SEKALI_REQUIRE_PROMTOOL").is_none() => {
            println!(
                "skipped: promtool not found ({e}); apt-get install prometheus, or run .ci/test"
            );
            return;
        }
        Err(e) => panic!("SEKALI_REQUIRE_PROMTOOL is set but promtool cannot run: {e}"),
    }
    for args in [
        &["check", "rules", "prometheus-alerts.yml"][..],
        &["test", "rules", "prometheus-alerts.test.yml"][..],
    ] {
        let output = run(args).unwrap();
        assert!(
            output.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// `--metrics-listen`: `/metrics` on an address of its own, and no longer on `--listen`'s.
#[test]
fn metrics_listen_moves_metrics_off_the_public_port() {
    let metrics_port = free_port();
    let server = ServeProcess::start_with(
        PROVIDER_ENV,
        "info",
        &["--metrics-listen", &format!("127.0.0.1:{metrics_port}")],
    );
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(10))
        .build();
    let on_public = agent
        .get(&format!("http://127.0.0.1:{}/metrics", server.port))
        .call();
    assert!(
        matches!(on_public, Err(ureq::Error::Status(404, _))),
        "the public port no longer serves /metrics: {on_public:?}"
    );
    let text = agent
        .get(&format!("http://127.0.0.1:{metrics_port}/metrics"))
        .call()
        .expect("the metrics port answers")
        .into_string()
        .unwrap();
    assert!(text.contains("sekali_build_info"), "{text}");
    // And nothing else there: the webhooks stay on the public port.
    let webhook_on_metrics_port = agent
        .post(&format!("http://127.0.0.1:{metrics_port}/webhooks/stripe"))
        .send_string("{}");
    assert!(
        matches!(webhook_on_metrics_port, Err(ureq::Error::Status(404, _))),
        "{webhook_on_metrics_port:?}"
    );
    let (status, logs) = server.stop();
    assert!(status.success(), "{logs}");
}
