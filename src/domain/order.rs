//! An order's statuses, and the notice each carries.
//!
//! The status is not moved by events along arrows: it is computed from the order's payments by
//! the ledger (`domain::ledger::compute`), or set by an operator. So no status is final, and a
//! payment that arrives after a cancellation, or a refund that fails, is reflected whatever
//! order the provider delivers its events in.

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
    /// Money moved in a way the order cannot hold (`orders.review_reason` says how): it needs
    /// an operator's look.
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
    use super::*;

    #[test]
    fn statuses_round_trip_through_their_names() {
        for status in OrderStatus::ALL {
            assert_eq!(status.as_str().parse::<OrderStatus>().unwrap(), status);
        }
        assert!("settled".parse::<OrderStatus>().is_err());
    }
}
