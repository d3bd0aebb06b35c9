//! Outbound HTTP to other services: what sekali asks of them, and how their failures are named.
//! Nothing here decides what an answer means for an order; the callers do.

pub mod midtrans_status;
