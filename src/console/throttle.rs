//! How often one client address may try to log in to the console: a few tries at once (an
//! operator mistyping a token), then one every few seconds, so that guessing tokens from one
//! address goes nowhere. Counted per instance, in memory: behind a load balancer an address
//! gets the allowance of each instance it reaches.
//!
//! A proxy in front of sekali makes every client the proxy's address, so a guesser there slows
//! the operators' logins too, for as long as the guessing goes on; the proxy's own limits are
//! the place to tell its clients apart.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Logins one address may try at once.
pub const LOGIN_BURST: u32 = 20;
/// After those, one more each this long.
pub const LOGIN_EVERY: Duration = Duration::from_secs(6);
/// Addresses remembered before those whose allowance is whole again are forgotten.
const ADDRESSES_KEPT: usize = 4096;

/// The console's login allowance per client address; clones share it.
#[derive(Clone)]
pub struct LoginThrottle(Arc<DefaultKeyedRateLimiter<IpAddr>>);

impl Default for LoginThrottle {
    fn default() -> Self {
        let quota = Quota::with_period(LOGIN_EVERY)
            .expect("a period above zero")
            .allow_burst(NonZeroU32::new(LOGIN_BURST).expect("a burst above zero"));
        LoginThrottle(Arc::new(RateLimiter::keyed(quota)))
    }
}

impl std::fmt::Debug for LoginThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoginThrottle({} addresses)", self.0.len())
    }
}

impl LoginThrottle {
    /// Takes one login try of `address`'s allowance; when none is left, how long until one is.
    pub fn take(&self, address: IpAddr) -> Result<(), Duration> {
        if self.0.len() > ADDRESSES_KEPT {
            self.0.retain_recent();
        }
        self.0
            .check_key(&address)
            .map_err(|refused| refused.wait_time_from(DefaultClock::default().now()))
    }
}
