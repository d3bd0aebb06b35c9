//! A customer's email address, parsed once at the edge.

use std::fmt;

/// Exactly one address (`name@example.com`): no display name, no list, no line breaks, no
/// header after it. Parsed with lettre's RFC 5321 address parser, the one the mail transports
/// use, so every transport receives the same single address.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EmailAddress(String);

impl TryFrom<String> for EmailAddress {
    type Error = InvalidEmailAddress;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        EmailAddress::parse(&text)
    }
}

impl From<EmailAddress> for String {
    fn from(address: EmailAddress) -> String {
        address.0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a single email address such as name@example.com")]
pub struct InvalidEmailAddress;

/// Longest address SMTP carries (RFC 5321: a 254-character path).
const MAX_LEN: usize = 254;

impl EmailAddress {
    pub fn parse(text: &str) -> Result<Self, InvalidEmailAddress> {
        let text = text.trim();
        if text.len() > MAX_LEN || text.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(InvalidEmailAddress);
        }
        text.parse::<lettre::Address>()
            .map(|address| EmailAddress(address.to_string()))
            .map_err(|_| InvalidEmailAddress)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EmailAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_plain_address_is_accepted() {
        assert_eq!(
            EmailAddress::parse(" sari@toko.example ").unwrap().as_str(),
            "sari@toko.example"
        );
    }

    #[test]
    fn lists_headers_and_display_names_are_not_one_address() {
        for bad in [
            "a@x.example,attacker@evil.example",
            "a@x.example\r\nBcc: attacker@evil.example",
            "Sari <sari@toko.example>",
            "a@x.example attacker@evil.example",
            "no-at-sign",
            "@x.example",
            "a@",
            "",
        ] {
            assert_eq!(
                EmailAddress::parse(bad),
                Err(InvalidEmailAddress),
                "{bad:?}"
            );
        }
    }
}
