//! Background work that runs beside the HTTP server and stops with it.

pub mod forward;
pub mod purge;
pub mod relay;
