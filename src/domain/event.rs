//! The normalised form of a webhook event, whatever its provider.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::{EmailAddress, OrderStatus};

/// A payment provider's name (`stripe`, `midtrans`, `xendit`): its webhook route is
/// `/webhooks/{name}`, and it is what `processed_events.provider` and `orders.provider` hold. The
/// registry (`providers::REGISTRY`) says which names exist; past the edge a name is just text.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct ProviderName(String);

impl ProviderName {
    /// A name is 1-32 lower-case letters and digits: it stands in a URL path and a column.
    pub fn new(name: &str) -> Result<Self, String> {
        Self::from_owned(name.to_owned()).map_err(|name| {
            format!("`{name}` is not a provider name (1-32 lower-case letters and digits)")
        })
    }

    /// [`ProviderName::new`] for a name already owned (read from a column), without a copy; a
    /// name that is not one is given back.
    pub fn from_owned(name: String) -> Result<Self, String> {
        let valid = (1..=32).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if valid {
            Ok(ProviderName(name))
        } else {
            Err(name)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ProviderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ProviderName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProviderName::new(s)
    }
}

impl PartialEq<&str> for ProviderName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// How an event names the order it concerns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OrderRef {
    /// The shop's own order id (Stripe `metadata.order_id` / `client_reference_id`, Midtrans
    /// `order_id`, Xendit `external_id`).
    OrderId(String),
    /// Only a payment's id (a Stripe PaymentIntent, or for a charge of the Charges API the
    /// charge); the order is whichever one recorded it. `park_if_unlinked` is set for charges and
    /// disputes, which may arrive before the event that links the payment to its order and must
    /// then wait for it rather than be dropped.
    Payment {
        reference: String,
        park_if_unlinked: bool,
    },
    /// Nothing to act on.
    None,
}

/// What an event says about its order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatusChange {
    pub target: OrderStatus,
    /// The order's amount in minor units, when the event states it.
    pub amount: Option<i64>,
    /// Decimals of the minor units of this event's amounts, by its provider's rules (Stripe's
    /// table, ISO 4217 for the others); `None` when the event names no currency.
    pub exponent: Option<u32>,
    /// What the payment itself says was paid, in minor units (Stripe `amount_received`,
    /// Checkout `amount_total`, Midtrans `gross_amount`); checked against an API order's amount
    /// on a move to paid.
    pub paid_amount: Option<i64>,
    /// Cumulative refunded amount in minor units (refund events only).
    pub refunded_amount: Option<i64>,
    pub currency: Option<String>,
    /// One address, parsed at the edge; an address that is not exactly one is dropped there.
    pub customer_email: Option<EmailAddress>,
    /// The provider reports that a payment it had settled was reversed (Midtrans `deny` or
    /// `cancel` after `settlement` or `capture`): an order already paid by that same payment
    /// (the event's `payment_ref`) goes to `needs_review` rather than being treated as stale; a
    /// reversal of another payment of the order is stale.
    pub reverses_payment: bool,
}

/// One verified delivery, reduced to what the store needs. Serialised as it is into a parked
/// event's row, so that it is applied later without its provider.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NormalizedEvent {
    pub provider: ProviderName,
    /// The provider's event id (Stripe `evt_…`, Xendit's `webhook-id` header), or one derived
    /// from the delivery where it has none (Midtrans; Xendit without the header).
    pub event_id: String,
    pub event_type: String,
    pub order_ref: OrderRef,
    /// The payment this event is about: for Stripe a PaymentIntent, or a charge of the Charges
    /// API, so that later charges and disputes can find the order through it; for Midtrans the
    /// `transaction_id`. The event that pays an order records its payment on the order, and a
    /// reversal must name that payment.
    pub payment_ref: Option<String>,
    /// `None` for event types sekali does not act on: they are recorded as `ignored`.
    pub change: Option<StatusChange>,
    /// The id an older sekali derived for this same delivery, when it differs from `event_id`
    /// (Midtrans ids changed form): a live claim under it is a duplicate too.
    pub legacy_event_id: Option<String>,
    /// Said in the answer to the sender, for an event acknowledged but not acted on for a reason
    /// the shop can fix (a Stripe thin event).
    #[serde(skip)]
    pub detail: Option<&'static str>,
    /// How long the event id is remembered (the provider's retention): a redelivery within it is
    /// a duplicate.
    #[serde(skip, default = "default_retention")]
    pub retention: Duration,
}

fn default_retention() -> Duration {
    Duration::ZERO
}
