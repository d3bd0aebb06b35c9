//! A payment as both engines store it (`payments` and its child rows, read back into the
//! ledger's facts), and the time format of its columns: the same on either engine.

use crate::clock::iso_seconds;
use crate::domain::decision::{Decision, News};
use crate::domain::ledger::{OrderPayment, PaymentFacts};
use crate::domain::text::Escaped;
use crate::domain::{decide, NormalizedEvent, OrderRef, OrderState, Outcome, PaymentReport};

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

impl Merged {
    /// What the order `order_id` (`current`, with its `others` payments) becomes with the
    /// payment `reference` as merged.
    pub fn apply(
        &self,
        event: &NormalizedEvent,
        reference: &str,
        order_id: &str,
        current: Option<&OrderState>,
        others: &[(String, StoredPayment)],
    ) -> Applied {
        let provider = event.provider.as_str();
        let mut before_payments = views(others);
        let mut after_payments = before_payments.clone();
        // A payment newly linked did not count for the order before this event.
        if self.linked.is_some() {
            before_payments.push(OrderPayment {
                provider,
                reference,
                facts: &self.before,
            });
        }
        after_payments.push(OrderPayment {
            provider,
            reference,
            facts: &self.after,
        });
        let decision = decide(
            order_id,
            current,
            event,
            &before_payments,
            &after_payments,
            self.news,
        );
        if !matches!(decision.outcome, Outcome::Processed | Outcome::Stale) {
            tracing::warn!(
                order_id = %Escaped(order_id),
                provider,
                event_type = %Escaped(&event.event_type),
                outcome = decision.outcome.as_str(),
                reason = %Escaped(decision.next.review.as_deref().unwrap_or("")),
                "order moved to needs_review"
            );
        }
        Applied {
            decision,
            // Saved whenever the merge changed anything, not only in what counts
            // (`News::New`): a later time of the same attempt state (a retry's `processing`
            // after a decline) must be kept, or an older event delivered after it would win the
            // merge.
            save_payment: self.after != self.before || self.linked.as_deref() != Some(order_id),
            // A payment linked by this event, or one that took in the facts of another name of
            // it (which may have been waiting unlinked): the events whose facts waited for this
            // link count now, those parked under the payment's key, which includes those parked
            // under another name of it (a refund parked under a PaymentIntent that an invoice,
            // named by the order, turned out to be paid by). Released with the order's write.
            release_parked: self.linked.is_none() || self.folded,
        }
    }
}

/// The order `event`'s facts count for, its payment linked to `linked` (if it is): the order it
/// names, else its payment's; `None` while neither is known (the facts wait on the payment).
pub(crate) fn order_for(
    event: &NormalizedEvent,
    reference: &str,
    linked: Option<&str>,
) -> Option<String> {
    match (&event.order_ref, linked) {
        (OrderRef::OrderId(named), Some(linked)) if named != linked => {
            // A payment pays one order: the first link stands, and the event's facts are that
            // order's. Said, as a provider should not do this.
            tracing::warn!(
                provider = event.provider.as_str(),
                payment = %Escaped(reference),
                named = %Escaped(named),
                linked = %Escaped(linked),
                "an event names another order than the one its payment is linked to; its facts count for the linked one"
            );
            Some(linked.to_owned())
        }
        (OrderRef::OrderId(named), _) => Some(named.clone()),
        (_, linked) => linked.map(str::to_owned),
    }
}

/// What an event does to its order, computed by [`Merged::apply`].
pub(crate) struct Applied {
    pub decision: Decision,
    /// Whether the payment's row is to be written.
    pub save_payment: bool,
    /// Whether the events parked under the payment's key are released to the order.
    pub release_parked: bool,
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
