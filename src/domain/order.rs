//! The forward-only order state machine.
//!
//! Arrows: pending → paid | failed | cancelled | expired | needs_review; failed → paid |
//! cancelled | expired | needs_review; expired → paid | needs_review; paid → partially_refunded |
//! refunded | disputed; partially_refunded → refunded | disputed. A move is *forward* when the
//! target is reachable along the arrows; everything else is backwards and is recorded as `stale`
//! without changing the order. One move off the arrows is decided in `domain::decision`: the
//! reversal of the payment that paid an order (paid → needs_review). Because every lifecycle is
//! a path along these arrows, applying its events in any order ends in the same status as
//! applying them in order.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    Pending,
    Paid,
    Failed,
    Cancelled,
    Expired,
    PartiallyRefunded,
    Refunded,
    Disputed,
    /// A payment did not match an API order's amount or currency, or the provider reversed the
    /// payment that paid the order. Only an operator moves the order on; webhooks on it are
    /// stale.
    NeedsReview,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 9] = [
        OrderStatus::Pending,
        OrderStatus::Paid,
        OrderStatus::Failed,
        OrderStatus::Cancelled,
        OrderStatus::Expired,
        OrderStatus::PartiallyRefunded,
        OrderStatus::Refunded,
        OrderStatus::Disputed,
        OrderStatus::NeedsReview,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "pending",
            OrderStatus::Paid => "paid",
            OrderStatus::Failed => "failed",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Expired => "expired",
            OrderStatus::PartiallyRefunded => "partially_refunded",
            OrderStatus::Refunded => "refunded",
            OrderStatus::Disputed => "disputed",
            OrderStatus::NeedsReview => "needs_review",
        }
    }

    /// The direct arrows out of this status.
    fn successors(self) -> &'static [OrderStatus] {
        use OrderStatus::*;
        match self {
            Pending => &[Paid, Failed, Cancelled, Expired, NeedsReview],
            // A failed attempt can still be paid, or the payment abandoned for good.
            Failed => &[Paid, Cancelled, Expired, NeedsReview],
            // A payment that completes as its request expires: Xendit documents the race
            // (docs.xendit.co/docs/delayed-webhooks, "Payment request expired but you received a
            // webhook for it": the money moved, mark the payment successful), and a provider
            // reports only payments that happened. Never the reverse: a late `expired` after a
            // payment is stale.
            Expired => &[Paid, NeedsReview],
            Paid => &[PartiallyRefunded, Refunded, Disputed],
            PartiallyRefunded => &[Refunded, Disputed],
            Cancelled | Refunded | Disputed | NeedsReview => &[],
        }
    }

    /// True when `target` is reachable from `self` along one or more arrows.
    pub fn can_move_forward_to(self, target: OrderStatus) -> bool {
        // The graph is acyclic and has nine nodes: a depth-first walk is cheaper than a table
        // that has to be kept in sync with the arrows above.
        self.successors()
            .iter()
            .any(|&next| next == target || next.can_move_forward_to(target))
    }

    /// Is this one of the refund states, where the refunded amount can still grow?
    pub fn is_refund(self) -> bool {
        matches!(self, OrderStatus::PartiallyRefunded | OrderStatus::Refunded)
    }

    /// The notice a customer should get on reaching this status, if any.
    pub fn notice(self) -> Option<Notice> {
        match self {
            OrderStatus::Paid => Some(Notice::Receipt),
            OrderStatus::Failed => Some(Notice::PaymentFailed),
            OrderStatus::PartiallyRefunded | OrderStatus::Refunded => Some(Notice::RefundNotice),
            _ => None,
        }
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown order status `{0}`")]
pub struct UnknownStatus(pub String);

impl FromStr for OrderStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OrderStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// The customer emails sekali queues in `email_outbox.template`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    Receipt,
    PaymentFailed,
    RefundNotice,
}

impl Notice {
    pub fn template(self) -> &'static str {
        match self {
            Notice::Receipt => "receipt",
            Notice::PaymentFailed => "payment_failed",
            Notice::RefundNotice => "refund_notice",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::OrderStatus::*;
    use super::*;

    #[test]
    fn forward_moves_follow_the_arrows_transitively() {
        assert!(Pending.can_move_forward_to(Paid));
        assert!(Pending.can_move_forward_to(Refunded));
        assert!(Failed.can_move_forward_to(Disputed));
        assert!(PartiallyRefunded.can_move_forward_to(Refunded));
    }

    #[test]
    fn backward_and_sideways_moves_are_not_forward() {
        assert!(!Paid.can_move_forward_to(Pending));
        assert!(!Paid.can_move_forward_to(Failed));
        assert!(!Refunded.can_move_forward_to(PartiallyRefunded));
        assert!(!Cancelled.can_move_forward_to(Paid));
        assert!(!Disputed.can_move_forward_to(Refunded));
        for status in OrderStatus::ALL {
            assert!(!status.can_move_forward_to(status), "{status} to itself");
        }
    }

    #[test]
    fn statuses_round_trip_through_their_names() {
        for status in OrderStatus::ALL {
            assert_eq!(status.as_str().parse::<OrderStatus>().unwrap(), status);
        }
        assert!("settled".parse::<OrderStatus>().is_err());
    }
}
