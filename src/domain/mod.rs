//! Provider-independent types: what an event means once its provider's format is gone.

pub mod event;
pub mod money;
pub mod order;

pub use event::{NormalizedEvent, OrderRef, Provider, StatusChange};
pub use order::{Notice, OrderStatus};
