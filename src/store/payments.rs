//! A payment as both engines store it (`payments` and its child rows, read back into the
//! ledger's facts), and the time format of its columns: the same on either engine.

use crate::clock::iso_seconds;
use crate::domain::decision::News;
use crate::domain::ledger::{OrderPayment, PaymentFacts};
use crate::domain::PaymentReport;

/// A payment as stored: the order it is linked to, and its facts.
#[derive(Debug, Clone)]
pub struct StoredPayment {
    pub reference: String,
    pub order_id: Option<String>,
    pub facts: PaymentFacts,
}

/// A payment's facts before and after an event's are merged in, read under its lock: what both
/// engines compute from the stored payment before they apply it to its order.
pub(crate) struct Merged {
    /// The order the payment was linked to before the event (its own row's, or that of another
    /// name of it).
    pub linked: Option<String>,
    pub before: PaymentFacts,
    pub after: PaymentFacts,
    /// What the event's facts are to the payment's.
    pub news: News,
    /// Whether facts that waited under another name of it were folded in.
    pub folded: bool,
}

impl Merged {
    /// `report`'s facts merged into the payment `stored` and the facts `folded` in from its
    /// other names (one of which may have been linked to `linked_through_alias`).
    pub fn of(
        report: &PaymentReport,
        stored: Option<StoredPayment>,
        folded: PaymentFacts,
        linked_through_alias: Option<String>,
    ) -> Self {
        let linked = stored
            .as_ref()
            .and_then(|s| s.order_id.clone())
            .or(linked_through_alias);
        let before = stored.map(|s| s.facts).unwrap_or_default();
        let mut after = before.clone();
        after.merge(&folded);
        after.merge(&report.facts);
        let news = if before.material() != after.material() {
            News::New
        } else if report.facts.material() == after.material() {
            News::Same
        } else {
            News::Older
        };
        Merged {
            linked,
            before,
            after,
            news,
            folded: folded != PaymentFacts::default(),
        }
    }
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
