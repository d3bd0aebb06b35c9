//! Event normalisation on arbitrary bytes: `stripe::parse_event` and `normalise_stored` for both
//! providers (what re-reading a stored payload does). None of them may panic, and
//! `normalise_stored` must agree with the provider's own parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sekali::domain::Provider;
use sekali::providers::midtrans::parse_notification;
use sekali::providers::normalise_stored;
use sekali::providers::stripe::parse_event;

fuzz_target!(|data: &[u8]| {
    let stripe = parse_event(data);
    if let Ok(event) = &stripe {
        assert!(
            !event.event_id.is_empty(),
            "a Stripe event id is never empty"
        );
    }
    assert_eq!(normalise_stored(Provider::Stripe, data), stripe);

    let midtrans = parse_notification(data).map(|n| n.normalise());
    if let Ok(event) = &midtrans {
        assert!(!event.event_id.is_empty());
    }
    assert_eq!(normalise_stored(Provider::Midtrans, data), midtrans);
});
