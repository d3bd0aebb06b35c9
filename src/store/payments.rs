//! A payment as both engines store it (`payments` and its child rows, read back into the
//! ledger's facts), and the time format of its columns: the same on either engine.

use crate::clock::iso_seconds;
use crate::domain::ledger::{OrderPayment, PaymentFacts};

/// A payment as stored: the order it is linked to, and its facts.
#[derive(Debug, Clone)]
pub struct StoredPayment {
    pub reference: String,
    pub order_id: Option<String>,
    pub facts: PaymentFacts,
}

/// The payments of an order as the ledger's `compute` reads them.
pub fn views(payments: &[(String, StoredPayment)]) -> Vec<OrderPayment<'_>> {
    payments
        .iter()
        .map(|(provider, stored)| OrderPayment {
            provider,
            reference: &stored.reference,
            facts: &stored.facts,
        })
        .collect()
}

/// A time the ledger keeps (Unix seconds, 0 for unknown) as the schema's text, NULL for unknown.
pub(crate) fn time_text(at: i64) -> Option<String> {
    (at != 0).then(|| iso_seconds(at))
}

/// The schema's text back to Unix seconds, 0 for NULL or unreadable.
pub(crate) fn time_of(text: Option<String>) -> i64 {
    text.and_then(|t| humantime::parse_rfc3339(&t).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs() as i64)
}
