//! sekali ("once"): receives Stripe and Midtrans payment webhooks and applies each event's
//! effects exactly once, durably, before answering 2xx.
//!
//! Layout (the folders are the architecture):
//! - [`providers`]: pure signature verification and parsing per provider; no HTTP, no SQL.
//! - [`domain`]: newtypes and the forward-only order state machine.
//! - [`store`]: every SQL statement, the schema, the single writer thread and the read pool.
//! - [`routes`]: thin HTTP handlers that map errors onto each provider's retry protocol.
//! - [`jobs`]: background work (the purge of expired event ids, the outbox relay).
//! - [`clients`]: outbound HTTP to other services (Midtrans's status API).
//! - [`startup`]: builds the HTTP server from [`config::Settings`]; tests build it on port 0.

#![forbid(unsafe_code)]

/// `println!` for the commands' output on stdout (see [`cli::write_stdout`]): when the reader
/// has gone away, as in `sekali events list | head`, the rest is dropped instead of panicking.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub mod bench;
pub mod cli;
pub mod clients;
pub mod clock;
pub mod config;
pub mod domain;
pub mod durable;
pub mod jobs;
pub mod mail;
pub mod providers;
pub mod replay;
pub mod routes;
pub mod startup;
pub mod store;
pub mod telemetry;
