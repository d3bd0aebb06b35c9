//! Logging: `tracing` to stderr, verbosity from `RUST_LOG` (default `info`).
//!
//! What is never logged: secrets, signature values, raw bodies, customer emails. Per-delivery
//! detail is at `debug`; `info` carries rejections and lifecycle events only.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal; log files and collectors get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
