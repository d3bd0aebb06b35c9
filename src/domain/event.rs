//! The normalised form of a webhook event, whatever its provider.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::ledger::PaymentFacts;
use super::EmailAddress;

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
    /// `order_id`, Xendit `external_id`). The event links its payment to this order.
    OrderId(String),
    /// Only through its payment: the order is whichever one the payment is linked to. Until one
    /// is, the event's facts wait on the payment (`parked`), and count once an event names both.
    Payment,
    /// Nothing to act on.
    None,
}

/// What an event says about the payment it concerns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PaymentReport {
    /// The provider's reference of the payment: a Stripe PaymentIntent (or a Charges API charge,
    /// or a subscription's invoice), a Midtrans `transaction_id`, a Xendit invoice id.
    pub reference: String,
    /// Other references the event says name the same payment (a Stripe invoice's PaymentIntent
    /// and charge): facts that arrive under them are this payment's.
    pub aliases: Vec<String>,
    pub facts: PaymentFacts,
}

/// One verified delivery, reduced to what the store needs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NormalizedEvent {
    pub provider: ProviderName,
    /// The provider's event id (Stripe `evt_…`, Xendit's `webhook-id` header), or one derived
    /// from the delivery where it has none (Midtrans; Xendit without the header).
    pub event_id: String,
    pub event_type: String,
    pub order_ref: OrderRef,
    /// The payment the event is about and what it says of it; `None` for an event sekali does
    /// not act on (recorded as `ignored`).
    pub payment: Option<PaymentReport>,
    /// The payer's address, as the event reports it (parsed at the edge: an address that is not
    /// exactly one is dropped there).
    pub payer_email: Option<EmailAddress>,
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
    /// The request headers the delivery came with that are no secret and no signature, as a
    /// JSON object, kept with the stored event for an operator to look at; set by the HTTP
    /// route (a provider leaves it `None`).
    #[serde(skip)]
    pub headers: Option<String>,
}

impl NormalizedEvent {
    /// The payment's reference, if the event names a payment.
    pub fn payment_ref(&self) -> Option<&str> {
        self.payment.as_ref().map(|p| p.reference.as_str())
    }
}

fn default_retention() -> Duration {
    Duration::ZERO
}
