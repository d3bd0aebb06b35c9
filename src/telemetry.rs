//! Logging: `tracing` to stderr, verbosity from `RUST_LOG` (default `info`).
//!
//! What is never logged: secrets, signature values, raw bodies, customer emails. Per-delivery
//! detail is at `debug`; `info` carries rejections and lifecycle events only. Text that came from
//! outside is escaped (`domain::text::Escaped`) or printed in debug form, so it cannot start a
//! line of its own.

use std::io::IsTerminal;

use tracing::{Event, Level, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub fn init() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        // The PostgreSQL driver logs every statement's parameters at debug level: payloads,
        // signatures, customers' addresses. Never shown, whatever RUST_LOG asks for.
        .add_directive("tokio_postgres=info".parse().expect("a directive"))
        .add_directive("postgres=info".parse().expect("a directive"));
    // Whether INFO lines are wanted at all: a demoted line is shown only then.
    let info_enabled = filter
        .max_level_hint()
        .is_none_or(|max| max >= tracing::level_filters::LevelFilter::INFO);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal; log files and collectors get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .event_format(StrangersAtTheirLevel(format::Format::default()))
        .with_filter(tracing_subscriber::filter::filter_fn(move |metadata| {
            info_enabled || !is_a_strangers_malformed_request(metadata.level(), metadata.target())
        }));
    // Already set up: tests that run several servers in one process.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
}

/// actix's HTTP/1 dispatcher logs a request it cannot parse (`stream error: request parse
/// error: invalid Header provided`) at ERROR, though it is a stranger's malformed request that
/// was answered 400. Such a line is written at INFO, the level of every other 4xx, so that an
/// operator alerting on errors is not paged for a port scan.
fn is_a_strangers_malformed_request(level: &Level, target: &str) -> bool {
    *level == Level::ERROR && target.starts_with("actix_http::h1")
}

/// The default format, but for [`is_a_strangers_malformed_request`] lines, which it writes the
/// same way at INFO.
struct StrangersAtTheirLevel<F>(F);

impl<S, N, F> FormatEvent<S, N> for StrangersAtTheirLevel<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let normalized = event.normalized_metadata();
        let metadata = normalized.as_ref().unwrap_or_else(|| event.metadata());
        if !is_a_strangers_malformed_request(metadata.level(), metadata.target()) {
            return self.0.format_event(ctx, writer, event);
        }
        SystemTime.format_time(&mut writer)?;
        write!(writer, "  INFO {}: ", metadata.target())?;
        ctx.format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// An error with its whole cause chain on one line, `top: cause: cause`, for log fields
/// (`error = %ErrorChain(&e)`): a 5xx's log line says why, down to SQLite's extended result code
/// (`disk I/O error: Error code 1034: …`), instead of nested `Debug`. A cause whose text the line
/// already holds (a wrapper that prints its source, before a hint of its own too) is not
/// repeated.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut line = self.0.to_string();
        let mut source = self.0.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            if !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            source = cause.source();
        }
        f.write_str(&line)
    }
}
