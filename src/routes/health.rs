use std::time::Duration;

use actix_web::{web, HttpResponse};

use super::AppState;
use crate::store::{OutboxBacklog, WriteError};
use crate::telemetry::ErrorChain;

/// An outbox whose oldest due row has waited this long is reported `behind`.
const OUTBOX_BEHIND: Duration = Duration::from_secs(5 * 60);

/// How long a write probe's result is reused: a load balancer polling every instance every
/// second, or a flood of `/healthz`, costs the writer at most one probe a second.
const PROBE_REUSE: Duration = Duration::from_secs(1);

/// The last write probe: when it finished (the clock's milliseconds) and what it found
/// (`None`: the database took it).
#[derive(Default)]
pub struct WriteProbe(tokio::sync::Mutex<Option<(i64, Option<String>)>>);

impl WriteProbe {
    /// Whether the database takes writes, probed at most once per [`PROBE_REUSE`]: concurrent
    /// callers wait for the one probe in flight and share its result.
    async fn check(&self, state: &AppState) -> Option<String> {
        let mut last = self.0.lock().await;
        let now = state.clock.now_millis();
        if let Some((at, found)) = &*last {
            if (*at..*at + PROBE_REUSE.as_millis() as i64).contains(&now) {
                return found.clone();
            }
        }
        let found = match state.store.check_writable().await {
            Ok(()) => None,
            Err(e) => {
                tracing::error!(error = %ErrorChain(&e), "health check: the database does not take writes");
                Some(write_problem(&e).to_owned())
            }
        };
        *last = Some((state.clock.now_millis(), found.clone()));
        found
    }
}

/// What is wrong, in words that name no host, user or file: `/healthz` is public, and the log
/// line beside it has the database's own message.
fn write_problem(e: &WriteError) -> &'static str {
    match e {
        WriteError::QueueFull => "the writer's queue is full: the database takes writes slower than they come",
        WriteError::WriterGone => "the writer is not running (the server is stopping)",
        WriteError::Store(e) if e.is_connection_lost() => {
            "the database connection is lost; the writer reconnects before its next write"
        }
        WriteError::Store(e) if e.is_transient() => {
            "the database does not take writes now (locked by another process, a full disk, or a read-only server); the log says which"
        }
        WriteError::Store(_) => "the database refused a write; the log says why",
    }
}

fn outbox(backlog: &OutboxBacklog) -> serde_json::Value {
    let status = if backlog.dead > 0 {
        "dead_rows"
    } else if backlog.oldest_due_age >= OUTBOX_BEHIND {
        "behind"
    } else {
        "ok"
    };
    serde_json::json!({
        "status": status,
        "pending": backlog.pending,
        "dead": backlog.dead,
        "oldest_due_age_seconds": backlog.oldest_due_age.as_secs(),
    })
}

/// What a load balancer and an operator ask: 200 when this instance can take deliveries, 503
/// when its database cannot be read or written (a delivery would be answered 503 too). The body
/// says per component what is wrong:
///
/// - `database`: read, then a write probe through the writer (see
///   [`Store::check_writable`](crate::store::Store::check_writable));
/// - `writer`: what it has done, with its queue now and how often it replaced its connection (a
///   panic or an I/O fault each count one: a number that keeps climbing means the disk or the
///   database needs a look);
/// - `outbox_email`, `outbox_forward`: the backlog, `behind` when the oldest due row has waited
///   five minutes, `dead_rows` while rows wait for an operator (these never make it 503: the
///   deliveries are fine);
/// - the Midtrans status API when the status check is on: `failing` while its last call failed
///   (Midtrans notifications get 503 until it answers; the instance stays in the pool, as every
///   instance would fail them alike).
///
/// The top-level `writer`, `writer_reopens` and `write_connections_opened` of earlier versions
/// are kept.
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let read = state.store.check_health().await;
    let database = match &read {
        Ok(()) => match state.health_probe.check(&state).await {
            None => serde_json::json!({ "status": "ok" }),
            Some(problem) => serde_json::json!({ "status": "unavailable", "problem": problem }),
        },
        Err(e) => {
            tracing::error!(error = %ErrorChain(e), "health check: the database cannot be read");
            serde_json::json!({
                "status": "unavailable",
                "problem": "the database cannot be read; the log says why",
            })
        }
    };
    let writable = database["status"] == "ok";
    let stats = state.store.stats();
    let mut components = serde_json::Map::new();
    components.insert("database".into(), database);
    components.insert(
        "writer".into(),
        serde_json::json!({
            "status": "ok",
            "queued": stats.writer.queued,
            "transactions": stats.writer.transactions,
            "deliveries": stats.writer.deliveries,
            "reopens": stats.writer.reopens,
        }),
    );
    if read.is_ok() {
        match state.store.outbox_backlog(state.clock.now_millis()).await {
            Ok(backlogs) => {
                for (kind, backlog) in &backlogs {
                    components.insert(format!("outbox_{}", kind.label()), outbox(backlog));
                }
            }
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), "health check: the outboxes' backlog could not be read");
                components.insert(
                    "outboxes".into(),
                    serde_json::json!({
                        "status": "unknown",
                        "problem": "the backlog could not be read; the log says why",
                    }),
                );
            }
        }
    }
    for provider in state.providers.iter() {
        if let Some((name, health)) = provider.dependency_health() {
            components.insert(name.into(), health);
        }
    }
    let body = serde_json::json!({
        "status": if writable { "ok" } else { "unavailable" },
        "components": components,
        "writer_reopens": stats.writer.reopens,
        "writer": stats.writer,
        "write_connections_opened": stats.writer.connections_opened,
    });
    if writable {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
