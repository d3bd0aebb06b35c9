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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Logins one address may try at once.
pub const LOGIN_BURST: u32 = 20;
/// After those, one more each this long.
pub const LOGIN_EVERY: Duration = Duration::from_secs(6);
/// Addresses remembered before those whose allowance is whole again are forgotten, and again
/// each time as many more have come since.
const ADDRESSES_KEPT: usize = 4096;

/// The console's login allowance per client address; clones share it.
#[derive(Clone)]
pub struct LoginThrottle {
    limiter: Arc<DefaultKeyedRateLimiter<IpAddr>>,
    /// How many addresses were remembered after the last forgetting: the next comes once the
    /// map holds [`ADDRESSES_KEPT`] more, so that someone changing addresses at every try
    /// costs a scan of the map per thousands of tries, not per try.
    kept: Arc<AtomicUsize>,
}

impl Default for LoginThrottle {
    fn default() -> Self {
        let quota = Quota::with_period(LOGIN_EVERY)
            .expect("a period above zero")
            .allow_burst(NonZeroU32::new(LOGIN_BURST).expect("a burst above zero"));
        LoginThrottle {
            limiter: Arc::new(RateLimiter::keyed(quota)),
            kept: Arc::default(),
        }
    }
}

impl std::fmt::Debug for LoginThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoginThrottle({} addresses)", self.limiter.len())
    }
}

impl LoginThrottle {
    /// Takes one login try of `address`'s allowance; when none is left, how long until one is.
    pub fn take(&self, address: IpAddr) -> Result<(), Duration> {
        let kept = self.kept.load(Ordering::Relaxed);
        if self.limiter.len() > kept + ADDRESSES_KEPT {
            self.limiter.retain_recent();
            self.kept.store(self.limiter.len(), Ordering::Relaxed);
        }
        self.limiter
            .check_key(&client(address))
            .map_err(|refused| refused.wait_time_from(self.limiter.clock().now()))
    }
}

/// The address a client's allowance is kept under: an IPv4 address itself; an IPv6 address's
/// /64, the network one host is given, whose 2^64 addresses would otherwise each bring 20
/// tries. An IPv4 address mapped into IPv6 is that IPv4 address.
fn client(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(v6) & !((1u128 << 64) - 1),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_network_of_one_host_shares_one_allowance() {
        let throttle = LoginThrottle::default();
        for n in 0..u128::from(LOGIN_BURST) {
            let address = std::net::Ipv6Addr::from(0x2001_0db8_0000_0001_0000_0000_0000_0000 + n);
            assert!(throttle.take(IpAddr::V6(address)).is_ok(), "try {n}");
        }
        let same_network: IpAddr = "2001:db8:0:1:ffff::1".parse().unwrap();
        assert!(throttle.take(same_network).is_err());
        let other_network: IpAddr = "2001:db8:0:2::1".parse().unwrap();
        assert!(throttle.take(other_network).is_ok());
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(client(mapped), "192.0.2.7".parse::<IpAddr>().unwrap());
    }
}
