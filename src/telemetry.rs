//! Logging: `tracing` to stderr, verbosity from `RUST_LOG` (default `info`).
//!
//! What is never logged: secrets, signature values, raw bodies, customer emails. Per-delivery
//! detail is at `debug`; `info` carries rejections and lifecycle events only. Text that came from
//! outside is escaped (`domain::text::Escaped`) or printed in debug form, so it cannot start a
//! line of its own.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal; log files and collectors get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .finish();
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        return; // already set up (tests that run several servers in one process)
    }
    // actix logs through the `log` crate; its records reach tracing through this bridge.
    if log::set_boxed_logger(Box::new(StrangersAtTheirLevel(
        tracing_log::LogTracer::new(),
    )))
    .is_ok()
    {
        log::set_max_level(log::LevelFilter::Trace);
    }
}

/// Forwards `log` records to tracing, with one change: actix's HTTP/1 dispatcher logs a request
/// it cannot parse (`stream error: request parse error: invalid Header provided`) at ERROR,
/// though it is a stranger's malformed request that was answered 400. It is logged at INFO, the
/// level of every other 4xx, so that an operator alerting on errors is not paged for it.
struct StrangersAtTheirLevel(tracing_log::LogTracer);

impl StrangersAtTheirLevel {
    fn demoted(level: log::Level, target: &str) -> log::Level {
        if level == log::Level::Error && target.starts_with("actix_http::h1") {
            log::Level::Info
        } else {
            level
        }
    }
}

impl log::Log for StrangersAtTheirLevel {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        let level = Self::demoted(metadata.level(), metadata.target());
        self.0.enabled(
            &log::Metadata::builder()
                .level(level)
                .target(metadata.target())
                .build(),
        )
    }

    fn log(&self, record: &log::Record<'_>) {
        let level = Self::demoted(record.level(), record.target());
        self.0.log(
            &log::Record::builder()
                .args(*record.args())
                .level(level)
                .target(record.target())
                .module_path(record.module_path())
                .file(record.file())
                .line(record.line())
                .build(),
        );
    }

    fn flush(&self) {
        self.0.flush()
    }
}
